"""The MemPO turn-protocol tags, in one place (no imports: the protocol, the scanner and the
environment all take them from here).

A tag's *code* is its index in ``TAGS``; marker code ``2*tag`` is ``<tag>`` and ``2*tag+1`` is
``</tag>`` (the C++ scanner uses the same numbering).
"""
TAGS: tuple[str, ...] = ("mem", "think", "search", "access", "answer", "information")
ACTION_TAGS: tuple[str, ...] = ("search", "access", "answer")
INFORMATION_TAG = TAGS.index("information")


def marker_strings() -> tuple[str, ...]:
    """The 12 marker strings in marker-code order (code 2*tag: ``<tag>``, 2*tag+1: ``</tag>``)."""
    return tuple(m for name in TAGS for m in (f"<{name}>", f"</{name}>"))
