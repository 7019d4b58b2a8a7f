"""Where a round's generation stops: the token that closes its action block.

Conventions
-----------
* A round is generated after the forced prefix (``<mem>``); it ends at the first token whose bytes
  *complete* a closing action marker (``</search>``, ``</access>``, ``</answer>``; ``</tool_call>`` in
  the json format: the actions of the protocol's `mempo.protocol.tags.TagSet`) that closes the
  open action block under the span grammar of :mod:`mempo.ops.spans` (the same rules as
  :mod:`mempo.protocol.grammar`): at most one block is open, an opening marker ends the open block, inside
  ``<information>`` only ``</information>`` is a marker, stray closing markers are ignored. So
  ``</search>`` inside a ``<think>`` block, or a model-written ``<information>`` block, does not stop
  the round.
* Byte-level BPE may merge the marker's last bytes with what follows (``">\\n\\n"``, ``"></"``): the
  round keeps that token whole, as generated, and stops after it. Nothing is re-tokenised.
* Tokens are read as bytes (:class:`TokenBytes`, from a :class:`mempo.ops.spans.TokenTable`), so
  markers split over tokens or inside multi-byte characters are found exactly. Ids outside the
  table (a model vocabulary padded beyond the tokenizer's) have no bytes.
* Other stops: a stop token (EOS, ``<|im_end|>``: kept, the round is malformed) and the per-round
  token limit. :func:`cut_round` applies all three to a backend's raw output; it is the
  authoritative cut (backends may stop early on their own, or over-generate).
"""
from __future__ import annotations

from typing import Any, Collection, NamedTuple, Optional, Sequence

from mempo.ops.spans import TokenTable
from mempo.protocol.tags import TAG_SET, TagSet

__all__ = ["ActionStopScanner", "TokenBytes", "RoundCut", "cut_round", "STOP_ACTION", "STOP_EOS",
           "STOP_LENGTH", "action_closing_token_ids"]

STOP_ACTION = "action"
STOP_EOS = "eos"
STOP_LENGTH = "length"



class _Markers:
    """One tag set's markers as bytes: marker -> (tag, closing), the longest, every proper prefix."""

    _cache: dict[TagSet, "_Markers"] = {}

    def __init__(self, tags: TagSet) -> None:
        self.tags = tags
        self.markers: dict[bytes, tuple[str, bool]] = {}
        for name in tags.names:
            self.markers[f"<{name}>".encode()] = (name, False)
            self.markers[f"</{name}>".encode()] = (name, True)
        self.longest = max(len(m) for m in self.markers)
        self.prefixes = frozenset(m[:k] for m in self.markers for k in range(1, len(m)))
        self.actions = frozenset(tags.actions)

    @classmethod
    def of(cls, tags: TagSet) -> "_Markers":
        found = cls._cache.get(tags)
        if found is None:
            found = cls._cache[tags] = cls(tags)
        return found


class ActionStopScanner:
    """Incremental byte scanner: ``feed`` returns True once an action block of `tags` has closed.

    State: the open block's tag (``open_tag``), fewer carried bytes than the longest marker that may
    start a marker split over feeds, and ``closed_action`` (the action tag that closed, else None).
    After it returned True it keeps returning True.
    """

    __slots__ = ("open_tag", "_carry", "closed_action", "_markers")

    def __init__(self, tags: TagSet = TAG_SET) -> None:
        self._markers = _Markers.of(tags)
        self.open_tag: Optional[str] = None
        self._carry = b""
        self.closed_action: Optional[str] = None

    def feed(self, data: bytes) -> bool:
        """Scan more bytes; True when an action block is closed (by these bytes or before)."""
        if self.closed_action is not None:
            return True
        buf = self._carry + data if self._carry else data
        self._carry = b""
        pos = 0
        size = len(buf)
        table = self._markers
        while True:
            lt = buf.find(b"<", pos)
            if lt < 0:
                return False
            gt = buf.find(b">", lt + 1, lt + table.longest)
            if gt < 0:
                rest = buf[lt:]
                if size - lt < table.longest and rest in table.prefixes:
                    self._carry = rest
                    return False
                pos = lt + 1
                continue
            marker = table.markers.get(buf[lt:gt + 1])
            if marker is None:
                pos = lt + 1
                continue
            pos = gt + 1
            if self._apply(*marker):
                return True

    def _apply(self, tag: str, closing: bool) -> bool:
        information = self._markers.tags.tool_result
        if self.open_tag == information:
            if closing and tag == information:
                self.open_tag = None
            return False
        if closing:
            if self.open_tag == tag:
                self.open_tag = None
                if tag in self._markers.actions:
                    self.closed_action = tag
                    return True
            return False
        self.open_tag = tag
        return False


class TokenBytes:
    """id -> bytes, as a Python list built once from a tokenizer or a ``TokenTable``.

    ``TokenBytes.of(tokenizer_or_table)`` caches one instance per table (tables are themselves
    cached per tokenizer by :meth:`mempo.ops.spans.TokenTable.from_tokenizer`).
    """

    _cache: dict[int, tuple[Any, "TokenBytes"]] = {}

    def __init__(self, table: Any) -> None:
        data = table.token_bytes.tobytes()
        offsets = table.token_offsets.tolist()
        self.table = table
        self.pieces: list[bytes] = [data[offsets[i]:offsets[i + 1]] for i in range(len(offsets) - 1)]

    @classmethod
    def of(cls, tokenizer_or_table: Any) -> "TokenBytes":
        if isinstance(tokenizer_or_table, TokenBytes):
            return tokenizer_or_table
        table = tokenizer_or_table if isinstance(tokenizer_or_table, TokenTable) \
            else TokenTable.from_tokenizer(tokenizer_or_table)
        entry = cls._cache.get(id(table))
        if entry is None or entry[0] is not table:
            entry = cls._cache[id(table)] = (table, cls(table))
        return entry[1]

    def __len__(self) -> int:
        return len(self.pieces)

    def __getitem__(self, token_id: int) -> bytes:
        if 0 <= token_id < len(self.pieces):
            return self.pieces[token_id]
        return b""

    def join(self, ids: Sequence[int]) -> bytes:
        return b"".join(self[int(i)] for i in ids)


class RoundCut(NamedTuple):
    """A round's generated ids after the cut, why it stopped, and the closed action (or None)."""

    token_ids: list[int]
    reason: str  # STOP_ACTION | STOP_EOS | STOP_LENGTH
    action: Optional[str]


def cut_round(token_ids: Sequence[int], token_bytes: TokenBytes, *, prefix_ids: Sequence[int] = (),
              stop_token_ids: Collection[int] = (), max_new_tokens: Optional[int] = None,
              tags: TagSet = TAG_SET) -> RoundCut:
    """Cut a backend's raw output for one round, authoritatively: after the first token that completes
    the closing marker of the open action block (kept whole, even when BPE merged the marker's last
    bytes with what follows), at a stop id (kept; the round is malformed) or at ``max_new_tokens``.

    Args:
        token_ids: the ids generated after the prompt (which ended with ``prefix_ids``).
        token_bytes: the tokenizer's :class:`TokenBytes`.
        prefix_ids: the round's forced prefix (already in the prompt); scanned first.
        stop_token_ids: ids that end the round when generated (kept in the round).
        max_new_tokens: at most this many ids are kept (``None``: no limit).
        tags: the protocol's tag set (its actions close a round).

    Returns the kept ids (a prefix of ``token_ids``), the reason and the closed action tag.
    """
    scanner = ActionStopScanner(tags)
    scanner.feed(token_bytes.join(prefix_ids))
    limit = len(token_ids) if max_new_tokens is None else min(len(token_ids), max_new_tokens)
    stops = stop_token_ids if isinstance(stop_token_ids, (set, frozenset)) else set(stop_token_ids)
    for position in range(limit):
        token = int(token_ids[position])
        if scanner.feed(token_bytes[token]):
            return RoundCut([int(t) for t in token_ids[:position + 1]], STOP_ACTION, scanner.closed_action)
        if token in stops:
            return RoundCut([int(t) for t in token_ids[:position + 1]], STOP_EOS, None)
    return RoundCut([int(t) for t in token_ids[:limit]], STOP_LENGTH, None)


def action_closing_token_ids(token_bytes: TokenBytes, tags: TagSet = TAG_SET) -> list[int]:
    """Ids whose bytes contain a whole closing action marker of `tags` (``</search>`` ...).

    A backend that can only stop on token ids (SGLang without a tokenizer) uses them as a cheap
    early stop; it is exact when the markers are single tokens, and otherwise :func:`cut_round`
    still cuts over-generated output at the right token.
    """
    markers = [f"</{tag}>".encode() for tag in tags.actions]
    return [i for i, piece in enumerate(token_bytes.pieces) if any(m in piece for m in markers)]
