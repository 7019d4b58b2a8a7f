"""Tag spans of MemPO trajectories: every `<tag> ... </tag>` block as a token span (C++ scanner).

The tags are a `mempo.protocol.tags.TagSet` given at run time (default `TAG_SET`: ``TAGS = ("mem",
"think", "search", "access", "answer", "information")``; `JSON_TAG_SET` for Hermes / Qwen tool calls);
a tag's *code* is its index in the set's names. A span is a token range ``[start, end)`` relative to
its own sequence, markers included (all of ``<mem>...</mem>``). A batch of N sequences holds S spans
in CSR form (`SpanBatch`: offsets int64 [N+1]; tag, start, end, round int64 [S]; closed bool [S]; CPU
tensors; the tag names its codes index). The span grammar is stated at `find_spans`.
"""
from __future__ import annotations

import json
import weakref
from dataclasses import dataclass
from typing import Any, Iterable, NamedTuple, Optional, Sequence, Union

import numpy as np
import torch

from mempo.protocol.tags import ACTION_TAGS, JSON_TAG_SET, TAG_SET, TAGS, TagSet, marker_strings  # re-exported

try:
    from mempo import _scanner
    _SCANNER_IMPORT_ERROR: Optional[ImportError] = None
except ImportError as _error:  # reported when a scan is first asked for, with how to build it
    _scanner = None
    _SCANNER_IMPORT_ERROR = _error

__all__ = [
    "ACTION_TAGS", "TAGS", "TAG_SET", "JSON_TAG_SET", "TagSet", "Span", "SpanBatch", "TokenTable", "find_spans",
    "marker_strings",
]


class Span(NamedTuple):
    """One block of one sequence: tag name, token range ``[start, end)``, 0-based round, closed."""

    tag: str
    start: int
    end: int
    round: int
    closed: bool


def _load_scanner_module():
    if _scanner is None:  # the C++ extension is built by setup.py
        raise ImportError(
            "mempo._scanner (the C++ span scanner) is not built; run `pip install -e .` or "
            "`python setup.py build_ext --inplace` in the repository root"
        ) from _SCANNER_IMPORT_ERROR
    return _scanner


# ---------------------------------------------------------------------------------------------
# Token table
# ---------------------------------------------------------------------------------------------


def _gpt2_byte_to_char() -> dict[int, str]:
    """GPT-2's bytes->unicode table: printable bytes map to themselves, the rest to U+0100.."""
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("\N{INVERTED EXCLAMATION MARK}"), ord("\N{NOT SIGN}") + 1),
        *range(ord("\N{REGISTERED SIGN}"), ord("\N{LATIN SMALL LETTER Y WITH DIAERESIS}") + 1),
    ]
    table = {}
    shifted = 0
    for byte in range(256):
        if byte in printable:
            table[byte] = chr(byte)
        else:
            table[byte] = chr(256 + shifted)
            shifted += 1
    return table


def _byte_level_translation() -> dict[int, str]:
    """str.translate table turning a byte-level token string into a latin-1 string of its bytes.

    Characters outside the GPT-2 table become U+FFFF, which latin-1 cannot encode: the encode
    fails and the caller falls back to the token's UTF-8 bytes, as the ByteLevel decoder does.
    """
    translation = {codepoint: "\uffff" for codepoint in range(256)}
    for byte, char in _gpt2_byte_to_char().items():
        translation[ord(char)] = chr(byte)
    return translation


_BYTE_LEVEL_TRANSLATION: Optional[dict[int, str]] = None


def _byte_level_token_bytes(token: str) -> bytes:
    global _BYTE_LEVEL_TRANSLATION
    if _BYTE_LEVEL_TRANSLATION is None:
        _BYTE_LEVEL_TRANSLATION = _byte_level_translation()
    try:
        return token.translate(_BYTE_LEVEL_TRANSLATION).encode("latin-1")
    except UnicodeEncodeError:
        return token.encode("utf-8")


def _tokenizers_backend(tokenizer: Any) -> Any:
    """The `tokenizers.Tokenizer` behind `tokenizer` (itself, or a transformers fast tokenizer's
    `backend_tokenizer`), or None (a slow transformers tokenizer). Duck-typed: imports nothing."""
    if all(hasattr(tokenizer, a) for a in ("get_added_tokens_decoder", "id_to_token", "to_str")):
        return tokenizer
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None and hasattr(backend, "get_added_tokens_decoder"):
        return backend
    return None


def _decoder_is_byte_level(backend: Any) -> bool:
    """True when the backend's decoder is ByteLevel, alone or inside a Sequence."""
    decoder = backend.decoder
    if decoder is None:
        return False
    try:
        spec = json.loads(decoder.__getstate__())
    except (AttributeError, TypeError, ValueError):
        spec = json.loads(backend.to_str()).get("decoder")

    def has_byte_level(node: Any) -> bool:
        if isinstance(node, dict):
            return node.get("type") == "ByteLevel" or any(has_byte_level(v) for v in node.values())
        if isinstance(node, list):
            return any(has_byte_level(v) for v in node)
        return False

    return has_byte_level(spec)


def _current_vocab_size(tokenizer: Any) -> int:
    """Vocabulary size including added tokens; used to notice a tokenizer grown after caching."""
    backend = _tokenizers_backend(tokenizer)
    if backend is not None:
        return int(backend.get_vocab_size(with_added_tokens=True))
    return len(tokenizer)


def _token_pieces(tokenizer: Any) -> tuple[list[bytes], str]:
    """(bytes of every id, how they were obtained: "byte_level" or "decode_per_id")."""
    backend = _tokenizers_backend(tokenizer)
    if backend is not None:
        vocab = backend.get_vocab(with_added_tokens=True)
        added = {int(i): t.content for i, t in backend.get_added_tokens_decoder().items()}
        size = max(
            [int(backend.get_vocab_size(with_added_tokens=True))]
            + [i + 1 for i in vocab.values()]
            + [i + 1 for i in added]
        )
        pieces = [b""] * size
        if _decoder_is_byte_level(backend):
            for token, i in vocab.items():
                pieces[i] = _byte_level_token_bytes(token)
            source = "byte_level"
        else:
            for i in range(size):
                pieces[i] = backend.decode([i], skip_special_tokens=False).encode("utf-8")
            source = "decode_per_id"
        for i, content in added.items():
            pieces[i] = content.encode("utf-8")
        return pieces, source

    # A slow transformers tokenizer.
    if not (hasattr(tokenizer, "decode") and hasattr(tokenizer, "__len__")):
        raise TypeError(
            "expected a tokenizers.Tokenizer, a transformers tokenizer or a TokenTable, got "
            f"{type(tokenizer).__name__}"
        )
    size = len(tokenizer)
    added_decoder = getattr(tokenizer, "added_tokens_decoder", {}) or {}
    added = {int(i): getattr(t, "content", str(t)) for i, t in added_decoder.items()}
    byte_decoder = getattr(tokenizer, "byte_decoder", None)  # slow GPT-2-style tokenizers
    pieces = [b""] * size
    if isinstance(byte_decoder, dict):
        tokens = tokenizer.convert_ids_to_tokens(list(range(size)))
        for i, token in enumerate(tokens):
            if token is None:
                continue
            try:
                pieces[i] = bytes(byte_decoder[c] for c in token)
            except KeyError:
                pieces[i] = token.encode("utf-8")
        source = "byte_level"
    else:
        for i in range(size):
            text = tokenizer.decode(
                [i], skip_special_tokens=False, clean_up_tokenization_spaces=False
            )
            pieces[i] = text.encode("utf-8")
        source = "decode_per_id"
    for i, content in added.items():
        if 0 <= i < size:
            pieces[i] = content.encode("utf-8")
    return pieces, source


# Tables cached per tokenizer object: weakly where the object allows it, else strongly (the strong
# reference keeps id(tokenizer) from being reused by another object).
_WEAK_TABLE_CACHE: "weakref.WeakKeyDictionary[Any, dict]" = weakref.WeakKeyDictionary()
_STRONG_TABLE_CACHE: dict[int, tuple[Any, dict]] = {}


class TokenTable:
    """A tokenizer's token id -> bytes table (CSR), held by a C++ scanner.

    Attributes:
        token_bytes: uint8 numpy array [B], all token bytes back to back.
        token_offsets: int64 numpy array [V+1]; id t has bytes ``token_bytes[off[t]:off[t+1]]``.
        vocab_size: V; valid ids are ``[0, V)``.
        fast_path: which scan path; both give identical results (the tests and the fuzz driver
            check it).
            True, the *token path*: a per-id class lookup. Every marker starts with ``<`` and
            holds no other ``<``, so a token without ``<`` never starts a marker and a token that
            is exactly a marker is that marker. Only tokens with a ``<`` that can start a marker
            (a marker inside the token, or a marker prefix such as ``"<"``, ``" </"`` or
            ``"<mem"`` ending it) are matched byte-wise, reading on into the next tokens for at
            most the longest marker's length less one byte; ``"<b"`` or ``"<="`` count as plain.
            When the markers are single added tokens (`markers_are_single_tokens`, e.g.
            ``<tool_call>`` in Qwen's vocabulary) and no other token of a sequence can start one,
            the sequence is scanned from its ids alone.
            False, the *byte path*: concatenates each sequence's bytes and scans them with
            memchr; the plain implementation the token path is checked against.
        marker_token_ids: tuple of 12 ints, per marker code of `TAG_SET` (2*tag + closing, see
            :func:`marker_strings`), the smallest id whose bytes are exactly that marker, or -1
            (another tag set's: `marker_ids`).
        markers_are_single_tokens: every marker of `TAG_SET` has such an id (e.g. the tags were
            added as special tokens), so sequences whose other tokens hold no ``<`` are scanned from
            ids alone (another tag set's: ``all(i >= 0 for i in table.marker_ids(tags))``).
        source: how the bytes were obtained: "byte_level", "decode_per_id" or "explicit".

    The table holds one C++ scanner per tag set it was asked to scan for (`scanner`), built on first
    use; each copies the token bytes (O(vocabulary) once).
    """

    def __init__(
        self,
        token_bytes: np.ndarray,
        token_offsets: np.ndarray,
        *,
        fast_path: bool = True,
        source: str = "explicit",
    ):
        token_bytes = np.ascontiguousarray(token_bytes, dtype=np.uint8).reshape(-1)
        token_offsets = np.ascontiguousarray(token_offsets, dtype=np.int64).reshape(-1)
        scanner_module = _load_scanner_module()
        # The C++ constructor validates the CSR structure (ValueError naming the problem).
        self._scanner = scanner_module.Scanner(token_bytes, token_offsets, bool(fast_path))
        self._scanners = {TAG_SET: self._scanner}
        self.token_bytes = token_bytes
        self.token_offsets = token_offsets
        self.vocab_size = int(token_offsets.size - 1)
        self.fast_path = bool(fast_path)
        self.marker_token_ids = tuple(int(i) for i in self._scanner.marker_token_ids)
        self.markers_are_single_tokens = all(i >= 0 for i in self.marker_token_ids)
        self.source = source

    def __repr__(self) -> str:
        return (
            f"TokenTable(vocab_size={self.vocab_size}, bytes={self.token_bytes.size}, "
            f"fast_path={self.fast_path}, source={self.source!r})"
        )

    @classmethod
    def from_token_bytes(cls, pieces: Sequence[bytes], *, fast_path: bool = True) -> "TokenTable":
        """Table from explicit per-id bytes (id = position in ``pieces``)."""
        pieces = [bytes(p) for p in pieces]
        lengths = np.fromiter((len(p) for p in pieces), dtype=np.int64, count=len(pieces))
        offsets = np.zeros(len(pieces) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        token_bytes = np.frombuffer(b"".join(pieces), dtype=np.uint8)
        return cls(token_bytes, offsets, fast_path=fast_path, source="explicit")

    @classmethod
    def from_tokenizer(cls, tokenizer: Any, *, fast_path: bool = True) -> "TokenTable":
        """The (cached) table of a `tokenizers.Tokenizer` or a transformers tokenizer.

        Byte-level BPE tokenizers (decoder ``ByteLevel``: GPT-2, Qwen2, Llama 3) map each
        vocabulary string back through the GPT-2 bytes<->unicode table (a string holding a character
        outside that table is taken as its UTF-8 bytes, as the ``ByteLevel`` decoder does); added and
        special tokens give the UTF-8 bytes of their content; other tokenizers fall back to
        ``decode([id])`` per id, UTF-8 encoded.

        ``fast_path=False`` gives a table that scans bytes (the reference path of the C++ side).
        The cache is per tokenizer object and path; it is rebuilt when the tokenizer's vocabulary
        size changed (tokens added after the first call).
        """
        try:
            per_tokenizer = _WEAK_TABLE_CACHE.get(tokenizer)
            if per_tokenizer is None:
                per_tokenizer = _WEAK_TABLE_CACHE.setdefault(tokenizer, {})
        except TypeError:  # not weak-referenceable
            entry = _STRONG_TABLE_CACHE.get(id(tokenizer))
            if entry is None or entry[0] is not tokenizer:
                entry = _STRONG_TABLE_CACHE[id(tokenizer)] = (tokenizer, {})
            per_tokenizer = entry[1]
        fast_path = bool(fast_path)
        vocab_size = _current_vocab_size(tokenizer)
        cached = per_tokenizer.get(fast_path)
        if cached is not None and cached[0] == vocab_size:
            return cached[1]
        pieces, source = _token_pieces(tokenizer)
        table = cls.from_token_bytes(pieces, fast_path=fast_path)
        table.source = source
        per_tokenizer[fast_path] = (vocab_size, table)
        return table

    def scanner(self, tags: TagSet = TAG_SET) -> Any:
        """The C++ scanner of this token table for `tags` (built once per tag set)."""
        found = self._scanners.get(tags)
        if found is None:
            if not isinstance(tags, TagSet):
                raise TypeError(f"tags must be a mempo.protocol.tags.TagSet, got {type(tags).__name__}")
            found = self._scanners[tags] = _load_scanner_module().Scanner(
                self.token_bytes, self.token_offsets, self.fast_path, list(tags.names), list(tags.action_codes),
                tags.tool_result_code)
        return found

    def marker_ids(self, tags: TagSet = TAG_SET) -> tuple[int, ...]:
        """Per marker code of `tags`, the smallest id whose bytes are exactly that marker, or -1."""
        return tuple(int(i) for i in self.scanner(tags).marker_token_ids)

    def token_bytes_of(self, token_id: int) -> bytes:
        """Bytes of one id (ValueError outside ``[0, vocab_size)``)."""
        if not 0 <= token_id < self.vocab_size:
            raise ValueError(
                f"token id {token_id} is outside the vocabulary [0, {self.vocab_size})"
            )
        lo, hi = self.token_offsets[token_id], self.token_offsets[token_id + 1]
        return self.token_bytes[lo:hi].tobytes()

    def decode_bytes(self, ids: Iterable[int]) -> bytes:
        """The concatenated bytes of a sequence of ids (what the scanner scans)."""
        return b"".join(self.token_bytes_of(int(i)) for i in ids)


def _as_table(tokenizer_or_table: Any) -> TokenTable:
    if isinstance(tokenizer_or_table, TokenTable):
        return tokenizer_or_table
    return TokenTable.from_tokenizer(tokenizer_or_table)


# ---------------------------------------------------------------------------------------------
# Input normalisation: every accepted form becomes (flat int64 ids, int64 CSR offsets)
# ---------------------------------------------------------------------------------------------


def _integer_numpy(value: Any, what: str) -> np.ndarray:
    """numpy view/copy of a tensor, array or list, rejecting non-integer dtypes by name."""
    if isinstance(value, torch.Tensor):
        if value.dtype.is_floating_point or value.dtype.is_complex or value.dtype == torch.bool:
            raise ValueError(f"{what} must have an integer dtype, got {value.dtype}")
        return value.detach().cpu().numpy()
    array = np.asarray(value)
    if array.size == 0 and array.dtype.kind == "f":  # np.asarray([]) is float64
        return array.astype(np.int64)
    if array.dtype.kind not in "iu":
        raise ValueError(f"{what} must have an integer dtype, got {array.dtype}")
    return array


def _check_offsets(offsets: np.ndarray, num_ids: int) -> np.ndarray:
    if offsets.ndim != 1 or offsets.size < 1:
        raise ValueError(
            f"offsets must be 1-D with N+1 >= 1 entries (CSR), got shape {tuple(offsets.shape)}"
        )
    if offsets[0] != 0:
        raise ValueError(f"offsets[0] must be 0, got {offsets[0]}")
    decreasing = np.flatnonzero(offsets[1:] < offsets[:-1])
    if decreasing.size:
        k = int(decreasing[0])
        raise ValueError(
            f"offsets must be non-decreasing: offsets[{k}]={offsets[k]} > "
            f"offsets[{k + 1}]={offsets[k + 1]}"
        )
    if offsets[-1] != num_ids:
        raise ValueError(f"offsets[-1] must equal len(ids) = {num_ids}, got {offsets[-1]}")
    return offsets.astype(np.int64, copy=False)


def _csr_from_sequences(
    sequences: Sequence[Any], vocab_size: int
) -> tuple[np.ndarray, np.ndarray]:
    """Flat int64 ids + offsets of a list of sequences. Sequences of another integer dtype are
    range-checked before the cast, so that e.g. a uint64 id is reported as it was given; int64 ids
    are checked by the C++ scanner."""
    parts = []
    for i, sequence in enumerate(sequences):
        if isinstance(sequence, (int, np.integer)):
            raise ValueError(
                "ids given as a list must be a list of sequences (one list of ids per sequence); "
                f"ids[{i}] is the single integer {sequence}. For one sequence pass [ids]."
            )
        part = _integer_numpy(sequence, f"ids[{i}]")
        if part.ndim != 1:
            raise ValueError(f"ids[{i}] must be 1-D, got shape {tuple(part.shape)}")
        if part.dtype != np.int64:
            _check_in_vocab(part, np.array([0, part.size]), vocab_size, first_sequence=i)
        parts.append(part.astype(np.int64, copy=False))
    offsets = np.zeros(len(parts) + 1, dtype=np.int64)
    np.cumsum([p.size for p in parts], out=offsets[1:])
    flat = np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)
    return flat, offsets


def _csr_from_padded(padded: np.ndarray, lengths: Any) -> tuple[np.ndarray, np.ndarray]:
    rows, width = padded.shape
    if lengths is None:
        lengths_np = np.full(rows, width, dtype=np.int64)
    else:
        lengths_np = _integer_numpy(lengths, "lengths")
        if lengths_np.ndim != 1 or lengths_np.size != rows:
            raise ValueError(
                f"lengths must be 1-D with one entry per row (N={rows}), got shape "
                f"{tuple(lengths_np.shape)}"
            )
        negative = np.flatnonzero(lengths_np < 0)
        if negative.size:
            k = int(negative[0])
            raise ValueError(f"lengths must be >= 0: lengths[{k}]={lengths_np[k]}")
        too_long = np.flatnonzero(lengths_np > width)
        if too_long.size:
            k = int(too_long[0])
            raise ValueError(
                f"lengths[{k}]={lengths_np[k]} exceeds the padded width {width} of ids"
            )
        lengths_np = lengths_np.astype(np.int64, copy=False)
    offsets = np.zeros(rows + 1, dtype=np.int64)
    np.cumsum(lengths_np, out=offsets[1:])
    if rows == 0 or bool((lengths_np == width).all()):
        flat = padded.reshape(-1)
    else:
        flat = padded[np.arange(width)[None, :] < lengths_np[:, None]]
    return flat, offsets


def _normalise_ids(
    ids: Any, offsets: Any, lengths: Any, vocab_size: int
) -> tuple[np.ndarray, np.ndarray]:
    """(flat int64 ids, int64 CSR offsets [N+1]); ids not given as int64 are range-checked here,
    int64 ones by the C++ scanner (same message)."""
    if isinstance(ids, (list, tuple)):
        if offsets is not None or lengths is not None:
            raise ValueError(
                "offsets/lengths are only for tensor or array ids; a list of sequences carries "
                "its own lengths"
            )
        # Plain lists of ints (the common case) are read by C++ in one pass; anything else
        # (tensors, arrays, floats, huge ints) goes through numpy and its checks.
        flattened = _load_scanner_module().flatten_int_sequences(ids)
        if flattened is not None:
            return flattened
        return _csr_from_sequences(ids, vocab_size)
    array = _integer_numpy(ids, "ids")
    if array.ndim == 1:
        if lengths is not None:
            raise ValueError("lengths is for padded 2-D ids; flat 1-D ids take offsets")
        if offsets is None:
            raise ValueError(
                "flat 1-D ids need offsets (N+1 CSR boundaries); for one sequence pass "
                "offsets=[0, len(ids)] or ids=[ids]"
            )
        flat, seq_offsets = array, _check_offsets(_integer_numpy(offsets, "offsets"), array.size)
    elif array.ndim == 2:
        if offsets is not None:
            raise ValueError("offsets is for flat 1-D ids; padded 2-D ids take lengths")
        flat, seq_offsets = _csr_from_padded(array, lengths)
    else:
        raise ValueError(f"ids must be 1-D (with offsets) or 2-D (padded), got {array.ndim}-D")
    if flat.dtype != np.int64:
        # Checked in the given dtype, before the cast, so that every id is reported as given.
        _check_in_vocab(flat, seq_offsets, vocab_size)
    return np.ascontiguousarray(flat, dtype=np.int64), seq_offsets


def _check_in_vocab(
    flat: np.ndarray, offsets: np.ndarray, vocab_size: int, first_sequence: int = 0
) -> None:
    """ValueError naming the first id outside [0, vocab_size) and its (sequence, position); the
    same message as the C++ check (mempo._scanner.Scanner.scan, reject_out_of_vocab=True)."""
    bad = flat >= vocab_size
    if flat.dtype.kind == "i":
        bad |= flat < 0
    if bad.any():
        index = int(np.argmax(bad))
        sequence = int(np.searchsorted(offsets, index, side="right")) - 1
        position = index - int(offsets[sequence])
        raise ValueError(
            f"token id {flat[index]} at (sequence {first_sequence + sequence}, position "
            f"{position}) is outside the vocabulary [0, {vocab_size})"
        )


# ---------------------------------------------------------------------------------------------
# Result
# ---------------------------------------------------------------------------------------------


def _tag_codes(tags: Union[str, int, Iterable[Union[str, int]]], names: tuple[str, ...] = TAGS) -> list[int]:
    if isinstance(tags, (str, int)):
        tags = [tags]
    codes = []
    for tag in tags:
        if isinstance(tag, str):
            if tag not in names:
                raise ValueError(f"unknown tag {tag!r}; tags are {names}")
            codes.append(names.index(tag))
        elif isinstance(tag, (int, np.integer)) and 0 <= int(tag) < len(names):
            codes.append(int(tag))
        else:
            raise ValueError(f"unknown tag {tag!r}; tags are names in {names} or codes 0..{len(names) - 1}")
    return codes


@dataclass(frozen=True, eq=False)
class SpanBatch:
    """Spans of a batch of N sequences, CSR over S spans; all CPU tensors.

    Attributes:
        offsets: int64 [N+1]; spans of sequence i are rows ``offsets[i]:offsets[i+1]``, in order
            of start.
        tag: int64 [S], tag codes (indices into ``tag_names``).
        start: int64 [S], first token of the span (inclusive), relative to its sequence.
        end: int64 [S], one past the last token of the span.
        round: int64 [S], 0-based round of the span.
        closed: bool [S], whether the span ended with its closing marker.
        tag_names: the names the codes index (the scanned tag set's; default ``TAGS``).
    """

    offsets: torch.Tensor
    tag: torch.Tensor
    start: torch.Tensor
    end: torch.Tensor
    round: torch.Tensor
    closed: torch.Tensor
    tag_names: tuple[str, ...] = TAGS

    @property
    def num_sequences(self) -> int:
        """N, the number of sequences."""
        return int(self.offsets.numel()) - 1

    def __len__(self) -> int:
        """S, the total number of spans over all sequences."""
        return int(self.tag.numel())

    def sequence_index(self) -> torch.Tensor:
        """int64 [S]: the sequence each span belongs to."""
        counts = self.offsets[1:] - self.offsets[:-1]
        return torch.repeat_interleave(torch.arange(self.num_sequences), counts)

    def spans_of(self, i: int) -> list[Span]:
        """The spans of sequence ``i`` as :class:`Span` tuples, in order of start."""
        n = self.num_sequences
        if not -n <= i < n:
            raise IndexError(f"sequence index {i} out of range for {n} sequences")
        i %= n
        lo, hi = int(self.offsets[i]), int(self.offsets[i + 1])
        columns = zip(
            self.tag[lo:hi].tolist(),
            self.start[lo:hi].tolist(),
            self.end[lo:hi].tolist(),
            self.round[lo:hi].tolist(),
            self.closed[lo:hi].tolist(),
        )
        return [Span(self.tag_names[t], s, e, r, c) for t, s, e, r, c in columns]

    def to_lists(self) -> list[list[Span]]:
        """All spans, one list per sequence (the form the Python reference returns)."""
        return [self.spans_of(i) for i in range(self.num_sequences)]

    def select(self, tags: Union[str, int, Iterable[Union[str, int]]]) -> "SpanBatch":
        """A new SpanBatch with only the spans of ``tags`` (names or codes); same N, CSR kept."""
        codes = torch.tensor(_tag_codes(tags, self.tag_names), dtype=torch.int64)
        keep = torch.isin(self.tag, codes)
        kept_before = torch.zeros(len(self) + 1, dtype=torch.int64)
        torch.cumsum(keep.to(torch.int64), dim=0, out=kept_before[1:])
        return SpanBatch(
            offsets=kept_before[self.offsets],
            tag=self.tag[keep],
            start=self.start[keep],
            end=self.end[keep],
            round=self.round[keep],
            closed=self.closed[keep],
            tag_names=self.tag_names,
        )


# ---------------------------------------------------------------------------------------------
# Entry point
# ---------------------------------------------------------------------------------------------


def find_spans(
    ids: Any,
    tokenizer_or_table: Any,
    *,
    offsets: Any = None,
    lengths: Any = None,
    tags: TagSet = TAG_SET,
) -> SpanBatch:
    """Find every tag block of every sequence.

    Grammar (the C++ scanner and ``mempo.ops.reference.spans`` implement exactly these rules); below,
    ``information`` is the tag set's tool-result tag (``tool_response`` in `JSON_TAG_SET`) and the
    actions are its actions (``search``, ``access``, ``answer`` in `TAG_SET`; ``tool_call``, ``answer``
    in `JSON_TAG_SET`):

    1. Markers are the exact byte strings ``<name>`` (opening) and ``</name>`` (closing) for the tag
       set's names: case-sensitive, no attributes, no spaces inside. The text of a sequence is the
       concatenation of its tokens' bytes; markers are found left to right (they cannot overlap: a
       marker holds a single ``<``, its first byte).
    2. At most one block is open at a time.
       * An opening marker while no block is open opens a block.
       * An opening marker while a block is open (nesting, or a missing close) ends the open block
         *unclosed* (``closed=False``), its byte end being where the new marker begins, and opens the
         new block.
       * Exception: inside an open ``<information>`` block only ``</information>`` is recognised; every
         other marker is content (tool output is opaque text).
       * A closing marker for the open block's tag closes it (``closed=True``, byte end = end of the
         closing marker). A closing marker with no open block, or for another tag, is a stray marker
         and is ignored.
       * At the end of the text an open block ends there, unclosed (a truncated sequence).
    3. Rounds (0-based): round 0 starts at the beginning. A round is *finished* once a block of an
       action tag has been opened in it; the next opening marker of any tag but ``information`` after
       that starts the next round. An ``<information>`` block belongs to the current round (the round
       whose action it answers). A block's round is fixed when it opens.
    4. Bytes to tokens: a token belongs to a span when its bytes overlap the span's bytes. So ``start``
       is the first token whose byte range ends after the span's first byte, and ``end`` is one past the
       last token whose byte range starts before the span's end byte. A token that straddles a marker
       boundary (e.g. one token ``"><"`` between ``</mem>`` and ``<think>``) belongs to both spans.
       Zero-byte tokens never start or end a span (they can sit inside one). Empty sequences give no
       spans.

    Cost per call: O(total tokens) plus O(longest marker) per ``<`` that may start a marker on the
    token path, O(total bytes) on the byte path; the table is built once per tokenizer (O(vocabulary))
    and its scanner once per tag set.

    Args:
        ids: one of
            * a list of N sequences, each a list/tuple of ints or a 1-D integer tensor/array;
            * a flat 1-D integer tensor/array [T] together with ``offsets``;
            * a padded 2-D integer tensor/array [N, W], with ``lengths`` (default: all W).
            Any integer dtype; tensors may live on any device (copied to the CPU).
        tokenizer_or_table: a ``tokenizers.Tokenizer``, a transformers tokenizer, or a
            :class:`TokenTable` (tables of tokenizers are built once and cached).
        offsets: for flat ids: integer [N+1], ``offsets[0] == 0``, non-decreasing,
            ``offsets[-1] == len(ids)``; sequence i is ``ids[offsets[i]:offsets[i+1]]``.
        lengths: for padded ids: integer [N], ``0 <= lengths[i] <= W``; sequence i is
            ``ids[i, :lengths[i]]`` (padding values are never read).
        tags: the `TagSet` to find (default `TAG_SET`); its codes are the result's tag codes.

    Returns:
        SpanBatch with CPU tensors: offsets int64 [N+1]; tag, start, end, round int64 [S];
        closed bool [S]; ``tag_names`` = ``tags.names``. Token indices are relative to each sequence.

    Raises:
        ValueError: malformed offsets or lengths, a non-integer dtype, or an id outside
            ``[0, vocab_size)`` (the message names the first such id and its
            (sequence, position)).
    """
    table = _as_table(tokenizer_or_table)
    scanner = table.scanner(tags)
    flat, seq_offsets = _normalise_ids(ids, offsets, lengths, table.vocab_size)
    span_offsets, tag, start, end, round_, closed = scanner.scan(
        flat, seq_offsets, reject_out_of_vocab=True
    )
    return SpanBatch(
        offsets=torch.from_numpy(span_offsets),
        tag=torch.from_numpy(tag),
        start=torch.from_numpy(start),
        end=torch.from_numpy(end),
        round=torch.from_numpy(round_),
        closed=torch.from_numpy(closed.view(np.bool_)),
        tag_names=tags.names,
    )
