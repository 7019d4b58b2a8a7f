"""Rollout throughput: the agent loop with HFBackend on CPU (tiny random Qwen2 models).

Shape: 2 questions x 8 samples = 16 trajectories per rollout, up to 4 turns, at most 64 new tokens
per round, top-5 BM25 search over the tests' 300-document corpus (in-process), full-context
(training) and memory-context (evaluation) policies.

A random model does not follow the protocol (it would end every trajectory after one malformed
round), so a logits processor shapes each round: the model samples freely (temperature 1) for the
memory text (24 tokens) and the reasoning (16 tokens), with tokens containing "<" banned, and the
tags and the action are forced: "</mem>\\n<think>\\n" ... "\\n</think>\\n<search>zebulon<k> page</search>"
in rounds 1-3 and an "<answer>" in round 4. Every trajectory thus runs 4 rounds and 3 tool calls;
every round costs about 57 forward steps, all through `model.generate` with the loop's per-row stop
criteria. Forced tokens are real generated tokens (the model computes logits for them).

The loop's own cost (batching, stop scanning, decoding, memory and prompt building, tool calls,
span scan, scoring) is measured apart with a scripted backend that replays the same kind of rounds
(no model): `test_loop_overhead_scripted`.

Run: .venv/bin/pytest bench/bench_rollout.py --benchmark-only        (about 1-2 minutes, 2 cores)
Reported (extra_info): trajectories/minute and generated tokens/s from the median round, plus the
split of the last run's time between generation, tool calls and the rest of the loop.
"""
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from support.corpus import make_corpus  # noqa: E402
from support.rollout_fixtures import chat_tokenizer, needle_task, tiny_qwen2  # noqa: E402

from mempo.env.bm25 import BM25Retriever  # noqa: E402
from mempo.config import RolloutConfig  # noqa: E402
from mempo.rollout.backends import HFBackend, ScriptedBackend, TokenBytes  # noqa: E402
from mempo.rollout.loop import RolloutEngine  # noqa: E402

QUESTIONS = 2
SAMPLES = 8
TURNS = 4
MAX_NEW_TOKENS = 64
MODELS = {"tiny-2x64": (2, 64), "small-4x256": (4, 256)}
MACHINE = "CPU-only dev machine, 2 cores, 24 GiB, Python 3.11, torch 2.13 CPU"


class ProtocolShaper:
    """Logits processor: per round, free sampling segments (no '<' tokens) and forced tag segments."""

    def __init__(self, tok):
        enc = lambda s: tok.encode(s, add_special_tokens=False)  # noqa: E731
        pieces = TokenBytes.of(tok).pieces
        self.banned = torch.tensor([i for i, p in enumerate(pieces) if b"<" in p] +
                                   list(range(len(pieces), len(tok))), dtype=torch.long)
        search = [("free", 24), ("force", enc("</mem>\n<think>\n")), ("free", 16),
                  ("force", enc("\n</think>\n<search>zebulon3 page</search>"))]
        answer = search[:3] + [("force", enc("\n</think>\n<answer>Needle 3</answer>"))]
        self.plans = [self._flatten(search)] * (TURNS - 1) + [self._flatten(answer)]
        assert all(len(plan) <= MAX_NEW_TOKENS for plan in self.plans)
        self.pad = tok.pad_token_id
        self.rounds_by_prompt, self.rows, self.width = {}, None, None

    @staticmethod
    def _flatten(segments):
        plan = []
        for kind, value in segments:
            plan.extend([None] * value if kind == "free" else value)
        return plan

    def begin(self, requests):
        self.rounds_by_prompt = {tuple(r.prompt_ids): r.key.round_index for r in requests}
        self.rows, self.width = None, None

    def __call__(self, input_ids, scores):
        if self.width is None:
            self.width = input_ids.shape[1]
            self.rows = []
            for row in input_ids.tolist():
                first = next(i for i, t in enumerate(row) if t != self.pad)
                self.rows.append(self.plans[min(self.rounds_by_prompt[tuple(row[first:])], TURNS - 1)])
        step = input_ids.shape[1] - self.width
        for row, plan in enumerate(self.rows):
            token = plan[step] if step < len(plan) else None
            if token is None:
                scores[row, self.banned] = float("-inf")
            else:
                scores[row] = float("-inf")
                scores[row, token] = 0.0
        return scores


class ShapedHFBackend(HFBackend):
    def __init__(self, model, tok, shaper):
        super().__init__(model, tok, logits_processors=[shaper])
        self.shaper = shaper

    def generate(self, requests, sampling):
        self.shaper.begin(requests)
        return super().generate(requests, sampling)


@pytest.fixture(scope="module")
def environment():
    tok = chat_tokenizer()
    retriever = BM25Retriever.build(make_corpus())
    yield tok, retriever
    retriever.close()


@pytest.mark.parametrize("policy", ["full", "memory"])
@pytest.mark.parametrize("model_name", list(MODELS))
def test_rollout_throughput(benchmark, environment, model_name, policy):
    tok, retriever = environment
    layers, hidden = MODELS[model_name]
    model = tiny_qwen2(len(tok), seed=0, layers=layers, hidden=hidden)
    backend = ShapedHFBackend(model, tok, ProtocolShaper(tok))
    config = RolloutConfig(context_policy=policy, group_size=SAMPLES, max_turns=TURNS,
                           max_new_tokens_per_round=MAX_NEW_TOKENS, max_response_tokens=None, temperature=1.0, seed=0,
                           tool_workers=16)
    engine = RolloutEngine(backend, tok, retriever=retriever, config=config)
    tasks = [needle_task(3), needle_task(5)][:QUESTIONS]

    trajectories = benchmark.pedantic(lambda: engine.run(tasks), rounds=5, warmup_rounds=1, iterations=1)
    stats = engine.stats
    assert len(trajectories) == QUESTIONS * SAMPLES
    assert all(t.finish_reason == "answer" and len(t.rounds) == TURNS for t in trajectories)
    median = benchmark.stats.stats.median
    generated = stats.generated_tokens + stats.forced_tokens
    benchmark.extra_info.update(
        machine=MACHINE, torch_threads=torch.get_num_threads(), model=model_name, policy=policy,
        questions=QUESTIONS, samples=SAMPLES, turns=TURNS, max_new_tokens=MAX_NEW_TOKENS,
        trajectories=len(trajectories), generated_tokens=generated, generation_steps=stats.steps,
        batch_sizes=stats.batch_sizes, tool_calls=stats.tool_calls,
        trajectories_per_minute=round(len(trajectories) / median * 60, 1),
        generated_tokens_per_second=round(generated / median, 1),
        last_run_seconds=dict(wall=round(stats.wall_seconds, 3), generation=round(stats.generation_seconds, 3),
                              tools=round(stats.tool_seconds, 3)),
        mean_response_tokens=round(sum(len(t.response_ids) for t in trajectories) / len(trajectories), 1),
    )


@pytest.mark.parametrize("policy", ["full", "memory"])
def test_loop_overhead_scripted(benchmark, environment, policy):
    """The same shape with a backend that replays ids: everything but the model."""
    tok, retriever = environment
    filler = " ".join(["river stone market"] * 2)  # rounds of ~60 ids, like the HF runs
    rounds = [f"{filler}</mem>\n<think>\n{filler}\n</think>\n<search>zebulon3 page</search>"] * (TURNS - 1) + \
             [f"{filler}</mem>\n<think>\n{filler}\n</think>\n<answer>Needle 3</answer>"]
    encoded = [tok.encode(text, add_special_tokens=False) for text in rounds]
    assert all(len(ids) <= MAX_NEW_TOKENS for ids in encoded)
    backend = ScriptedBackend(lambda request: encoded[request.key.round_index], tok)
    config = RolloutConfig(context_policy=policy, group_size=SAMPLES, max_turns=TURNS,
                           max_new_tokens_per_round=MAX_NEW_TOKENS, max_response_tokens=None, tool_workers=16)
    engine = RolloutEngine(backend, tok, retriever=retriever, config=config)
    tasks = [needle_task(3), needle_task(5)][:QUESTIONS]
    trajectories = benchmark.pedantic(lambda: engine.run(tasks), rounds=10, warmup_rounds=1, iterations=1)
    assert all(t.finish_reason == "answer" and len(t.rounds) == TURNS for t in trajectories)
    median = benchmark.stats.stats.median
    stats = engine.stats
    benchmark.extra_info.update(
        machine=MACHINE, policy=policy, backend="scripted", trajectories=len(trajectories),
        generated_tokens=stats.generated_tokens + stats.forced_tokens, tool_calls=stats.tool_calls,
        ms_per_trajectory=round(median / len(trajectories) * 1000, 3),
        last_run_seconds=dict(wall=round(stats.wall_seconds, 4), tools=round(stats.tool_seconds, 4)),
    )
