"""Which rounds of a trajectory get a memory reward, and the `<mem>` span a round's reward is written on.

    scored(r)   <=>  index(r) >= FIRST_SCORED_ROUND (= 1: round 2 on)  and  mem_span(r) is not None
    mem_span(r)  =   [s.start, min(s.end, r.end))   for s = the first `<mem>` span (C++ scanner) that
                     starts in [r.start, r.end), when s is closed and the round text's first `<mem>`
                     block is closed with non-blank content;  None otherwise

Coordinates are response coordinates (offsets into ``Trajectory.response_ids``). Round 1 has no
history, so its `<mem>` is never scored.
"""
from __future__ import annotations

from typing import Any, Optional, Sequence

from mempo.protocol.grammar import find_blocks
from mempo.protocol.tags import TAG_SET, TagSet

__all__ = ["FIRST_SCORED_ROUND", "is_scored", "round_mem_span"]

FIRST_SCORED_ROUND = 1


def is_scored(index: int, mem_span: Optional[tuple[int, int]]) -> bool:
    """Whether round `index` (0-based) with this `mem_span` gets a memory reward."""
    return index >= FIRST_SCORED_ROUND and mem_span is not None


def round_mem_span(start: int, end: int, text: str, mem_spans: Sequence[Any],
                   tags: TagSet = TAG_SET) -> Optional[tuple[int, int]]:
    """The `<mem>` span of the round at response ``[start, end)``, or None: the first scanner span
    starting in the round, cut at ``end``, when it is closed and the round text's first `<mem>` block
    is closed with non-blank content.

    text: the round's decoded text (forced prefix included); mem_spans: the scanner's ``"mem"``
    spans of the whole response (``mempo.ops.spans.Span``: ``start``, ``end``, ``closed``), in
    order of start; tags: the protocol's tag set. Returns (start, end) int response offsets.
    """
    span = next((s for s in mem_spans if start <= s.start < end), None)
    if span is None or not span.closed:
        return None
    block = next((b for b in find_blocks(text, tags) if b.tag == "mem"), None)
    if block is None or not block.closed or not block.content.strip():
        return None
    return int(span.start), min(int(span.end), end)
