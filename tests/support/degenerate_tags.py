"""Texts of repeated tag markers that made the old protocol parser quadratic, shared by the
parser's work-bound test (tests/protocol/test_grammar.py) and its benchmark (bench/bench_grammar.py)."""
from __future__ import annotations

import random

from mempo.protocol.tags import marker_strings


def degenerate_texts(size: int) -> dict[str, str]:
    """Texts of about `size` characters of repeated markers: every shape that was quadratic or could be."""
    rng = random.Random(0)
    markers = marker_strings()
    return {
        "answers": "<answer>" * (size // 8),  # one merged turn of many actions
        "rounds": "<search>q</search>" * (size // 18),  # many rounds, none answered
        "stray": "<mem>" * (size // 12) + "</think>" * (size // 12),  # stray closes under a deep stack
        "nested": "<mem><think>" * (size // 24) + "</mem>" * (size // 24),
        "unclosed": "<think>" * (size // 14) + "</think>" * (size // 16),
        "information": "<search>q</search><information>" + "<mem>" * (size // 5),
        "mixed": "".join(rng.choice(markers) + rng.choice(["", "x", " ", "\n"]) for _ in range(size // 10)),
    }
