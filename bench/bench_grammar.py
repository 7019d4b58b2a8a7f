"""Protocol parser benchmark: `compute_score` (format validation + answer extraction) on text of
repeated tag markers, 64 KB against 1 MB, so the time ratio shows the parser stays linear on the
shapes that made the first parser quadratic (tests/support/degenerate_tags.py).

The unit test `tests/protocol/test_grammar.py::test_parsing_work_grows_linearly_with_repeated_tags`
bounds the same property by executed lines (exact, no clock); this file measures seconds.

Run: .venv/bin/pytest bench/bench_grammar.py --benchmark-only
"""
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from support.degenerate_tags import degenerate_texts  # noqa: E402

from mempo.protocol.reward import compute_score  # noqa: E402

MACHINE = "CPU-only dev machine, 2 cores, Python 3.11"
SIZES = {"64KB": 64_000, "1MB": 1_000_000}

_medians = {}


def _text(size: int) -> str:
    """Every degenerate shape together, about `size` characters in all."""
    return "".join(degenerate_texts(size // 7).values())


@pytest.mark.parametrize("label", list(SIZES))
def test_compute_score_on_repeated_tags(benchmark, label):
    text = _text(SIZES[label])
    benchmark.extra_info.update(characters=len(text), machine=MACHINE)
    benchmark.pedantic(compute_score, args=(text, ["x"]), rounds=5, warmup_rounds=1)
    _medians[label] = benchmark.stats.stats.median
    if len(_medians) == len(SIZES):
        ratio = _medians["1MB"] / _medians["64KB"]
        benchmark.extra_info["median_ratio_1MB_over_64KB"] = round(ratio, 1)
        print(f"\n1 MB / 64 KB median time: {ratio:.1f}x for 16x the text (linear: 16x)")
