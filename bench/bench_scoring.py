"""Benchmark: memory-reward teacher scoring, reference vs packed vs cached (mempo.scoring).

Run: `.venv/bin/pytest bench/bench_scoring.py --benchmark-only`   (or `python bench/bench_scoring.py`
for a plain table). Each method scores the same requests once (pedantic, 1 round: the reference
takes minutes on 2 cores); tokens and seconds land in `benchmark.extra_info`.

Model: Qwen2 architecture from `transformers.Qwen2Config`, random init (seed 0, no download):
4 layers, hidden 256, intermediate 1024, 4 attention heads (head dim 64), 2 KV heads, vocab 32,000,
tied embeddings, SDPA attention, fp32, CPU, `torch.set_num_threads(2)`.

Workload (one trajectory group per question, all rounds present):
  * prompt (system + question) 130-170 tokens, shared by the group's trajectories;
  * 8 rounds per trajectory: response 150 tokens (a 40-60-token `<mem>` + 90-110 more), then a
    550-650-token tool result after rounds 1..7 (round 8 answers): about 5,550 tokens;
  * scored rounds 2..8 (7 per trajectory): full_ctx[r] = everything before round r, mem_ctx[r] =
    prompt + round r's mem tokens;
  * answer 16 tokens, 6 of them gold.
Default: 1 question x 16 trajectories (112 scored rounds, 224 contexts). The full 3 x 16 workload
(`MEMPO_BENCH_QUESTIONS=3`) costs about 3x as long; every method is linear in the number of
trajectories, so the ratios are those of the subset. `MEMPO_BENCH_TRAJECTORIES` sets the group size.
"""
from __future__ import annotations

import os
import random
import time

import pytest
import torch

from mempo.records.scoring import ScoredRound, ScoringRequest
from mempo.scoring import ScoringStats, score

DEVICE_NOTE = "CPU-only dev machine, 2 cores, 24 GiB, Python 3.11, torch 2.13 CPU"
QUESTIONS = int(os.environ.get("MEMPO_BENCH_QUESTIONS", "1"))
TRAJECTORIES = int(os.environ.get("MEMPO_BENCH_TRAJECTORIES", "16"))
VOCAB = 32_000
ROUNDS = 8
ANSWER_LEN, GOLD = 16, slice(8, 14)
TOKEN_BUDGET = 16384
THRESHOLD = None  # identical work to 0.5; with a random model 0.5 would make every P = 0
METHODS = ("reference", "packed", "cached")
_RESULTS: dict = {}


def make_model():
    import transformers

    torch.manual_seed(0)
    cfg = transformers.Qwen2Config(
        vocab_size=VOCAB, hidden_size=256, intermediate_size=1024, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=8192,
        tie_word_embeddings=True, attn_implementation="sdpa")
    return transformers.Qwen2ForCausalLM(cfg).float().eval()


def make_requests(questions=QUESTIONS, trajectories=TRAJECTORIES, seed=0):
    rng = random.Random(seed)

    def toks(n):
        return [rng.randrange(VOCAB) for _ in range(n)]

    requests = []
    for _ in range(questions):
        prompt = toks(rng.randint(130, 170))
        for _ in range(trajectories):
            seq, rounds = list(prompt), []
            for r in range(1, ROUNDS + 1):
                mem = toks(rng.randint(40, 60))
                if r >= 2:
                    rounds.append(ScoredRound(len(seq), prompt + mem))
                seq += mem + toks(150 - len(mem) + rng.randint(-10, 10))
                if r < ROUNDS:
                    seq += toks(rng.randint(550, 650))
            mask = [0] * ANSWER_LEN
            mask[GOLD] = [1] * (GOLD.stop - GOLD.start)
            requests.append(ScoringRequest(seq, rounds, toks(ANSWER_LEN), mask))
    return requests


@pytest.fixture(scope="module")
def setup():
    torch.set_num_threads(2)
    model = make_model()
    requests = make_requests()
    score(model, requests[:1], "cached", threshold=THRESHOLD)  # warm-up: probe, math libraries
    return model, requests


def run_method(model, requests, method):
    stats = ScoringStats()
    t0 = time.perf_counter()
    results = score(model, requests, method, threshold=THRESHOLD, token_budget=TOKEN_BUDGET,
                    stats=stats)
    return results, stats, time.perf_counter() - t0


def _max_rel_diff(a, b):
    worst = 0.0
    for ra, rb in zip(a, b):
        for x, y in zip(ra.p_full + ra.p_mem, rb.p_full + rb.p_mem):
            worst = max(worst, abs(x - y) / max(abs(y), 1e-30))
    return worst


@pytest.mark.parametrize("method", METHODS)
def test_scoring(benchmark, setup, method):
    model, requests = setup
    out = {}

    def once():
        out["v"] = run_method(model, requests, method)

    benchmark.pedantic(once, rounds=1, iterations=1, warmup_rounds=0)
    results, stats, seconds = out["v"]
    _RESULTS[method] = (results, stats, seconds)
    info = benchmark.extra_info
    info.update(machine=DEVICE_NOTE, load_average_1m=round(os.getloadavg()[0], 2),
                questions=QUESTIONS, trajectories=len(requests),
                scored_rounds=sum(len(r.rounds) for r in requests),
                contexts=stats.contexts, forwards=stats.forwards, tokens=stats.tokens,
                real_tokens=stats.tokens - stats.padding_tokens,
                padding_tokens=stats.padding_tokens, seconds=round(seconds, 3))
    if method != "reference" and "reference" in _RESULTS:
        ref_results, ref_stats, ref_seconds = _RESULTS["reference"]
        info.update(
            token_ratio_vs_reference=round(ref_stats.tokens / stats.tokens, 2),
            token_ratio_vs_reference_unpadded=round(
                (ref_stats.tokens - ref_stats.padding_tokens) / stats.tokens, 2),
            time_ratio_vs_reference=round(ref_seconds / seconds, 2),
            max_rel_diff_p_vs_reference=_max_rel_diff(results, ref_results))
        assert info["max_rel_diff_p_vs_reference"] < 1e-4


def main(argv=None):
    """Plain table. `--interleave N`: score N trajectories at a time with each method in turn
    (rotating the order), summing seconds and tokens: on a shared machine, load swings then hit
    every method alike."""
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--interleave", type=int, default=0, metavar="N")
    args = parser.parse_args(argv)
    torch.set_num_threads(2)
    model = make_model()
    requests = make_requests()
    score(model, requests[:1], "cached", threshold=THRESHOLD)
    print(f"{len(requests)} trajectories, {sum(len(r.rounds) for r in requests)} scored rounds, "
          f"mean length {sum(len(r.sequence_ids) for r in requests) / len(requests):.0f} tokens; "
          f"load average {os.getloadavg()[0]:.2f}")
    step = args.interleave or len(requests)
    totals = {m: [[], ScoringStats(), 0.0] for m in METHODS}
    for j, at in enumerate(range(0, len(requests), step)):
        part = requests[at:at + step]
        order = METHODS[j % 3:] + METHODS[:j % 3]
        for method in order:
            results, stats, seconds = run_method(model, part, method)
            acc = totals[method]
            acc[0].extend(results)
            for name in ("forwards", "tokens", "padding_tokens", "contexts"):
                setattr(acc[1], name, getattr(acc[1], name) + getattr(stats, name))
            acc[2] += seconds
        if args.interleave:
            print(f"  trajectories {at}..{at + len(part) - 1}: " + ", ".join(
                f"{m} {totals[m][2]:.1f} s" for m in METHODS) + f" (cumulative), "
                f"load {os.getloadavg()[0]:.2f}", flush=True)
    for method in METHODS:
        _, stats, seconds = totals[method]
        print(f"{method:>9}: {stats.forwards:4d} forwards  {stats.tokens:>9,d} tokens "
              f"({stats.padding_tokens:,d} padding)  {seconds:7.2f} s")
    _, ref, ref_s = totals["reference"]
    for method in ("packed", "cached"):
        results, stats, seconds = totals[method]
        print(f"{method}: {ref.tokens / stats.tokens:.2f}x fewer tokens "
              f"({(ref.tokens - ref.padding_tokens) / stats.tokens:.2f}x unpadded), "
              f"{ref_s / seconds:.2f}x less time, max rel |dP| vs reference "
              f"{_max_rel_diff(results, totals['reference'][0]):.1e}")
    print(f"load average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
