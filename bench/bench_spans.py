"""Span scanner benchmark: C++ `find_spans` vs the Python reference (decode + regex).

Shape (one GRPO step of MemPO rollouts): 3 questions x 16 trajectories = 48 responses of 8,192
tokens each (8 rounds of mem/think/action + tool output, cut at the token limit), tokenised with
the tests' byte-level BPE (tags are plain text, so the byte scan runs) and with the same model plus
the 12 markers as special tokens (the id-only fast path runs).

Run: .venv/bin/pytest bench/bench_spans.py --benchmark-only
Table building (once per tokenizer, cached) is timed separately, never inside a per-call number.
"""
import random
import sys
import time
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from support import toy_tokenizers  # noqa: E402

from mempo.ops.reference.spans import find_spans_reference  # noqa: E402
from mempo.ops.spans import TokenTable, find_spans  # noqa: E402

QUESTIONS = 3
TRAJECTORIES_PER_QUESTION = 16
ROUNDS = 8
RESPONSE_TOKENS = 8192
MACHINE = "CPU-only dev machine, 2 cores, Python 3.11"

# (tokenizer, variant) -> median seconds, for the speed-up ratios. Medians, not means: on a shared
# 2-core machine other processes add rare long outliers that dominate a mean.
_medians = {}


def _responses(tokenizer):
    """48 id lists of exactly RESPONSE_TOKENS tokens each (trajectories cut at the limit)."""
    rng = random.Random(0)
    responses = []
    for _ in range(QUESTIONS * TRAJECTORIES_PER_QUESTION):
        doc_words = 500
        while True:
            text = toy_tokenizers.well_formed_trajectory(rng, ROUNDS, doc_words=doc_words)
            ids = tokenizer.encode(text).ids
            if len(ids) >= RESPONSE_TOKENS:
                break
            doc_words = int(doc_words * 1.3)
        responses.append(ids[:RESPONSE_TOKENS])
    return responses


@pytest.fixture(scope="module", params=["byte_level", "special_tags"])
def setup(request):
    if request.param == "byte_level":
        tokenizer = toy_tokenizers.byte_level_tokenizer()
    else:
        tokenizer = toy_tokenizers.special_tag_tokenizer()
    responses = _responses(tokenizer)
    padded = torch.tensor(responses, dtype=torch.int64)
    lengths = torch.full((len(responses),), RESPONSE_TOKENS, dtype=torch.int64)
    start = time.perf_counter()
    table = TokenTable.from_tokenizer(tokenizer)
    build_seconds = time.perf_counter() - start
    return dict(
        name=request.param, tokenizer=tokenizer, responses=responses, padded=padded,
        lengths=lengths, table=table, build_seconds=build_seconds,
    )  # fmt: skip


def _extra_info(benchmark, setup, path):
    spans = find_spans(setup["padded"], setup["table"], lengths=setup["lengths"])
    benchmark.extra_info.update(
        tokenizer=setup["name"],
        path=path,
        sequences=len(setup["responses"]),
        questions=QUESTIONS,
        trajectories_per_question=TRAJECTORIES_PER_QUESTION,
        rounds=ROUNDS,
        tokens_per_sequence=RESPONSE_TOKENS,
        total_tokens=sum(len(r) for r in setup["responses"]),
        spans=len(spans),
        vocab_size=setup["table"].vocab_size,
        fast_path=setup["table"].fast_path,
        table_build_seconds_once=round(setup["build_seconds"], 4),
        machine=MACHINE,
    )


def test_find_spans_cpp_padded(benchmark, setup):
    """Padded int64 tensor [48, 8192] + lengths (verl's `responses` layout)."""
    _extra_info(benchmark, setup, "C++ find_spans, padded tensor + lengths")
    benchmark(find_spans, setup["padded"], setup["table"], lengths=setup["lengths"])
    _medians[(setup["name"], "cpp_padded")] = benchmark.stats.stats.median


def test_find_spans_cpp_byte_path(benchmark, setup):
    """Padded tensor + lengths through the byte path (fast_path=False), for comparison."""
    table = TokenTable.from_tokenizer(setup["tokenizer"], fast_path=False)
    _extra_info(benchmark, setup, "C++ find_spans byte path, padded tensor + lengths")
    benchmark.extra_info["fast_path"] = False
    benchmark(find_spans, setup["padded"], table, lengths=setup["lengths"])
    _medians[(setup["name"], "cpp_byte_path")] = benchmark.stats.stats.median


def test_find_spans_cpp_lists(benchmark, setup):
    """List of 48 Python lists (includes the list -> array conversion)."""
    _extra_info(benchmark, setup, "C++ find_spans, list of lists")
    benchmark(find_spans, setup["responses"], setup["table"])
    _medians[(setup["name"], "cpp_lists")] = benchmark.stats.stats.median


def test_find_spans_python_reference(benchmark, setup):
    """The decode + regex baseline on the same lists."""
    _extra_info(benchmark, setup, "Python reference (decode + regex)")
    expected = find_spans(setup["padded"], setup["table"], lengths=setup["lengths"]).to_lists()
    result = benchmark.pedantic(
        find_spans_reference, args=(setup["responses"], setup["tokenizer"]), rounds=5,
        warmup_rounds=1,
    )  # fmt: skip
    assert result == expected
    reference_median = benchmark.stats.stats.median
    for variant in ("cpp_padded", "cpp_byte_path", "cpp_lists"):
        cpp_median = _medians.get((setup["name"], variant))
        if cpp_median:
            benchmark.extra_info[f"median_speedup_vs_{variant}"] = round(
                reference_median / cpp_median, 1
            )
    print(
        f"\n[{setup['name']}] reference {reference_median * 1e3:.1f} ms; "
        + ", ".join(
            f"{v} {_medians[(setup['name'], v)] * 1e3:.2f} ms "
            f"({reference_median / _medians[(setup['name'], v)]:.0f}x)"
            for v in ("cpp_padded", "cpp_byte_path", "cpp_lists")
            if (setup["name"], v) in _medians
        )
        + f"; table build {setup['build_seconds'] * 1e3:.1f} ms once"
    )


def test_token_table_build(benchmark, setup):
    """Building a table from scratch (what the per-tokenizer cache saves on every later call)."""
    from mempo.ops.spans import _token_pieces

    _extra_info(benchmark, setup, "TokenTable build (uncached)")

    def build():
        pieces, _ = _token_pieces(setup["tokenizer"])
        return TokenTable.from_token_bytes(pieces)

    benchmark.pedantic(build, rounds=5, warmup_rounds=1)
