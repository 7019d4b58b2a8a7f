"""Plain-Python reference of the tag-span scanner: decode + regex + the same state machine.

Used by the tests as the oracle and by the benchmark as the baseline; not meant for production.
The grammar is the one stated at `mempo.ops.spans.find_spans`. Token bytes are
obtained by a route independent of `mempo.ops.spans.TokenTable` where feasible: the token string
(`id_to_token` / `convert_ids_to_tokens`) through a per-character GPT-2 bytes<->unicode dict for
byte-level BPE, the content of added tokens, and `decode([id])` otherwise. Ids outside the
vocabulary count as zero-byte tokens (the public API rejects them before scanning).
"""
from __future__ import annotations

import bisect
import json
import re
from typing import Any, Callable, Sequence

from mempo.ops.spans import TAG_SET, Span, TagSet

__all__ = ["find_spans_reference", "blocks_of_text_reference", "token_bytes_function"]


def _marker_regex(tags: TagSet) -> "re.Pattern[bytes]":
    return re.compile(rb"<(/?)(" + b"|".join(re.escape(n.encode()) for n in tags.names) + rb")>")


def _gpt2_unicode_to_byte() -> dict[str, int]:
    """Inverse of GPT-2's bytes_to_unicode (the classic list construction)."""
    bs = (
        list(range(ord("!"), ord("~") + 1))
        + list(range(ord("¡"), ord("¬") + 1))
        + list(range(ord("®"), ord("ÿ") + 1))
    )
    cs = bs[:]
    n = 0
    for b in range(2**8):
        if b not in bs:
            bs.append(b)
            cs.append(2**8 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs)}


def _backend(tokenizer: Any) -> Any:
    if hasattr(tokenizer, "id_to_token") and hasattr(tokenizer, "to_str"):
        return tokenizer
    return getattr(tokenizer, "backend_tokenizer", None)


def token_bytes_function(tokenizer: Any) -> Callable[[int], bytes]:
    """A function id -> bytes for `tokenizer` (b"" for ids it does not know)."""
    backend = _backend(tokenizer)
    if backend is not None:
        decoder_json = json.loads(backend.to_str()).get("decoder")
        byte_level = '"ByteLevel"' in json.dumps(decoder_json)
        added = {i: t.content for i, t in backend.get_added_tokens_decoder().items()}
        id_to_token = backend.id_to_token

        def decode_one(i: int) -> str:
            return backend.decode([i], skip_special_tokens=False)

    else:
        byte_level = isinstance(getattr(tokenizer, "byte_decoder", None), dict)
        added = {i: t.content for i, t in getattr(tokenizer, "added_tokens_decoder", {}).items()}
        size = len(tokenizer)

        def id_to_token(i: int) -> Any:
            return tokenizer.convert_ids_to_tokens(i) if 0 <= i < size else None

        def decode_one(i: int) -> str:
            return tokenizer.decode([i], skip_special_tokens=False,
                                    clean_up_tokenization_spaces=False)

    unicode_to_byte = _gpt2_unicode_to_byte()

    def token_bytes(i: int) -> bytes:
        if i in added:
            return added[i].encode("utf-8")
        token = id_to_token(i) if i >= 0 else None
        if token is None:
            return b""
        if byte_level:
            if all(c in unicode_to_byte for c in token):
                return bytes(unicode_to_byte[c] for c in token)
            return token.encode("utf-8")
        return decode_one(i).encode("utf-8")

    return token_bytes


def blocks_of_text_reference(text: bytes, tags: TagSet = TAG_SET) -> list[tuple[int, int, int, int, bool]]:
    """Grammar of `tags` over raw bytes: (tag code, byte begin, byte end, round, closed), in order."""
    names, opaque, actions = tags.names, tags.tool_result, set(tags.actions)
    blocks = []
    open_tag = None  # (name, begin, round)
    round_ = 0
    round_has_action = False
    for match in _marker_regex(tags).finditer(text):
        closing = match.group(1) == b"/"
        name = match.group(2).decode()
        begin, end = match.span()
        if open_tag is not None and open_tag[0] == opaque:
            if closing and name == opaque:
                blocks.append((names.index(name), open_tag[1], end, open_tag[2], True))
                open_tag = None
            continue
        if closing:
            if open_tag is not None and open_tag[0] == name:
                blocks.append((names.index(name), open_tag[1], end, open_tag[2], True))
                open_tag = None
            continue
        if open_tag is not None:
            blocks.append((names.index(open_tag[0]), open_tag[1], begin, open_tag[2], False))
        if name != opaque:
            if round_has_action:
                round_ += 1
                round_has_action = False
            if name in actions:
                round_has_action = True
        open_tag = (name, begin, round_)
    if open_tag is not None:
        blocks.append((names.index(open_tag[0]), open_tag[1], len(text), open_tag[2], False))
    return blocks


def find_spans_reference(ids_list: Sequence[Sequence[int]], tokenizer: Any,
                         tags: TagSet = TAG_SET) -> list[list[Span]]:
    """Spans of `tags` in each sequence of ids, as lists of `Span` (same results as `find_spans`)."""
    token_bytes = token_bytes_function(tokenizer)
    memo: dict[int, bytes] = {}
    result = []
    for ids in ids_list:
        pieces = []
        for i in ids:
            i = int(i)
            piece = memo.get(i)
            if piece is None:
                piece = memo[i] = token_bytes(i)
            pieces.append(piece)
        starts, ends = [], []
        position = 0
        for piece in pieces:
            starts.append(position)
            position += len(piece)
            ends.append(position)
        spans = []
        for tag, begin, end, round_, closed in blocks_of_text_reference(b"".join(pieces), tags):
            first = bisect.bisect_right(ends, begin)  # first token ending after `begin`
            last = bisect.bisect_left(starts, end)  # tokens starting before `end`
            spans.append(Span(tags.names[tag], first, last, round_, closed))
        result.append(spans)
    return result
