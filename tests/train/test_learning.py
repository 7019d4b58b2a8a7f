"""Learning tests: the real training step moves a real tiny Qwen2 policy the right way.

Both tests run `mempo.train.step.train_step` (rollout with the HF backend -> outcome rewards ->
teacher scoring -> memory rewards -> token advantages -> PPO update of `mempo.train.actor.Actor`)
on a randomly initialised `Qwen2ForCausalLM` (`mempo.model.builtin.tiny_model`, hidden 64, 2
layers) over a byte-level BPE trained on the task's texts, after a few seconds of SFT that teaches
the turn format. No rollout is told a gold answer: there is no logits processor, no candidate
list, no hint; the golds reach only ``compute_score`` and the teacher scoring.

(a) Outcome RL (`test_outcome_rl_raises_the_reward_and_a_flipped_sign_lowers_it`). Questions
"door A" .. "door D"; one round ``<mem> door A </mem><think>look</think><answer>CODE</answer>``.
The answer of each door is a fixed permutation of four codes, drawn from the seed and shown
nowhere (not in the question, not in the SFT data): the policy can learn it only from the outcome
reward. SFT (`mempo.train.sft.run_sft`, 300 steps) teaches the format with a uniformly random code,
so the reward starts near 1/4 (below it where the format fails). Statistic: the mean outcome
reward of an evaluation rollout (4 doors x 32 samples, a fixed seed, the training sampler) before
and after 60 train steps (4 doors x 8 samples each). The broken variant negates the token
advantages the step computes (a test-local wrapper of `mempo.train.step.token_advantages`; no
library option). Measured over seeds 0-9 (``cd tests && python train/test_learning.py outcome 10``; 2026-12-01, the
built-in tokenizer with Qwen2's pre-tokeniser):

    correct trainer  after - before: mean +0.423, min +0.352, max +0.547  (before 0.13-0.37, after 0.48-0.81)
    flipped sign     after - before: mean -0.243, min -0.367, max -0.133  (after 0.000 on every seed)

Asserted: correct ``after - before >= 0.10``; flipped ``after <= before - 0.10``.

(b) Memory credit assignment (`test_memory_reward_moves_the_mem_blocks_that_keep_the_fact`). Question
"door K"; round 1 ``<search> K </search>`` returns ``<information>code X</information>`` from
the environment (a dict refilled with fresh random codes every step, so X is known only from the
tool result); round 2 writes its ``<mem>``: ``<mem> code X </mem>`` keeps the fact, ``<mem> door
K </mem>`` drops it. Outcome constant by construction of the budgets (`_memory_budget`): a round
may hold the round-1 search turn and no more (every answer turn of the SFT'd forms is longer), and
the response ends right after round 2's ``<mem>`` block (``rollout.max_response_tokens``), so
round 2 always ends at the token budget and no trajectory answers: every outcome is 0 (the format
gate of ``compute_score`` needs an answer) and every group has zero outcome variance. (Only a
round-1 answer squeezed into the search turn's length that also guesses a code never shown could
score; the test asserts at every step that no outcome is above 0.) With
``algorithm.skip_zero_variance_groups`` only the scored ``<mem>`` tokens carry loss, so only the
memory reward can move the policy. SFT (a direct loop, 600 steps, over
`mempo.train.sft.examples_from_trajectories` of the two rounds, half of the round-2 examples
keeping the fact) plus the teacher's format: after ``system + question + <mem> code X </mem>`` the
scored continuation (`mempo.algo.contexts.DEFAULT_ANSWER_TEMPLATE`) with X, loss on the
continuation only, so no rollout turn learns to answer. Teacher scoring (threshold 0.5) then gives
P(answer | mem_ctx) near 1 to a kept fact and 0 to a dropped one (P tracks the keep share below),
so round 2's memory reward is high exactly when its ``<mem>`` keeps X. Statistics, on an
evaluation rollout (8 doors x 16 samples, fixed codes and seed) before and after 10 train steps
(4 doors x 8 samples each): the share of scored round-2 ``<mem>`` blocks holding "code X" with
the gold X, and the mean P(answer | mem_ctx) of the scored rounds (the library's teacher scoring).
Broken variants (test-local wrappers, no library option): "flip" negates the memory rewards
`mempo.scoring.compute_memory_rewards` returns; "move" moves every ``<mem>`` span onto round 1's ``<mem>``
tokens (response start) in `advantage_inputs`. Measured over seeds 0-9
(``cd tests && python train/test_learning.py memory 10``, same date and tokenizer), rises after - before:

    memory_weight=1   keep +0.301 mean, +0.213 min, +0.389 max | P +0.270 mean, +0.124 min, +0.383 max
                      (keep before 0.30-0.57; passes on 10 of 10)
    memory_weight=0   keep +0.000 / +0.000 / +0.000        | P -0.000 / -0.000 / +0.000   (still on 10 of 10)
    flip              keep -0.360 / -0.512 / -0.257        | P -0.360 / -0.517 / -0.244   (fails on 10 of 10)
    move              keep +0.014 / -0.020 / +0.063        | P +0.002 / -0.066 / +0.061   (fails on 10 of 10)
    (an earlier sweep with the plain byte-level tokenizer: memory_weight=1 min +0.076 / +0.022)

Thresholds (from the sweep): memory_weight=1 must raise the keep share by >= 0.15 and P by >= 0.08
(the correct trainer's smallest rises over the 10 seeds: +0.213 / +0.124; "move" reaches at most
+0.063 / +0.061 and "flip" falls on every seed); memory_weight=0 (same seed and SFT) moves each by at
most 0.05 (it cannot move at all: zero advantages on the only loss tokens give a zero gradient). The CI
test runs seed 0.
Known limit of the design, measured (with the earlier tokenizer): run longer (15 steps) and the correct
trainer can drift: seed 1's keep share fell (0.33 -> 0.10), and with 3 more ids of room seed 0's
round-2 ``<mem>`` mostly stopped closing inside the budget ("<mem>\n<think>..."): an unscored round
gets no memory advantage and the outcome is constant by design, so pushing down the dropped fact's
tokens can move probability onto malformed, never-penalised ``<mem>`` blocks (the design has no format
signal). Hence 10 steps. Limit: a span off by one token still covers the token that decides keep/drop,
so these tests do not catch it (tests/train/test_trainer.py checks the span offsets directly).

The sweeps run one process on one thread; about 21 s (outcome) and 35 s (memory) per seed on 2
shared cores.
"""
from __future__ import annotations

import contextlib
import copy
import functools
import random
import statistics
import sys
import time
from typing import Callable, Iterator

import torch

from mempo.algo.contexts import DEFAULT_ANSWER_TEMPLATE, scoring_requests
from mempo.algo.outcome import score_outcomes
from mempo.config import MempoConfig, config_from_dict
from mempo.env.tools import information
from mempo.tools import tool
from mempo.model.builtin import tiny_model, train_tokenizer
from mempo.rollout.backends.factory import build_backend
from mempo.rollout.chat import ChatFormat
from mempo.rollout.loop import RolloutEngine, RolloutTask
from mempo.scoring import score
from mempo.train import step as step_module
from mempo.train.actor import Actor
from mempo.train.sft import examples_from_trajectories, run_sft
from mempo.train.step import StepContext, train_step

KEYS = tuple("ABCDEFGH")
CODES = ("red", "blue", "gold", "jade", "lime", "pink", "gray", "teal")
SYSTEM = "Find the code."


def _search_round(key: str) -> str:
    return f"<mem> door {key} </mem>\n<think>\nlook\n</think>\n<search> {key} </search>"


def _answer_round(key: str, code: str) -> str:
    return f"<mem> door {key} </mem>\n<think>\nlook\n</think>\n<answer>\n{code}\n</answer>"


def _second_round(key: str, code: str, keep: bool) -> str:
    mem = f"<mem> code {code} </mem>" if keep else f"<mem> door {key} </mem>"
    return f"{mem}\n<think>\nlook\n</think>\n<search> {key} </search>"


@functools.lru_cache(maxsize=None)
def _tokenizer():
    """A byte-level BPE over the tasks' texts (codes and keys are single ids)."""
    texts = ["system", "user", "assistant", SYSTEM]
    for key in KEYS:
        for code in CODES:
            texts += [f"door {key}", _search_round(key), information(f"code {code}"), _answer_round(key, code),
                      _second_round(key, code, True), DEFAULT_ANSWER_TEMPLATE.format(answer=code)]
    return train_tokenizer(texts * 3, vocab_size=400)


def _config(seed: int, **sections) -> MempoConfig:
    tree = {
        "rollout": {"group_size": 8, "max_turns": 1, "max_new_tokens_per_round": 40, "max_response_tokens": 200,
                    "context_policy": "memory", "system_prompt": SYSTEM, "tool_workers": 1, "seed": seed},
        "actor": {"lr": 5e-4, "kl_coef": 0.0, "micro_batch_tokens": None},
        "sft": {"lr": 3e-3, "steps": 300, "batch_tokens": 2048},
    }
    for name, fields in sections.items():
        tree.setdefault(name, {}).update(fields)
    return config_from_dict(tree)


def _context(cfg: MempoConfig, model, tools) -> StepContext:
    tokenizer = _tokenizer()
    return StepContext(cfg, Actor(model, cfg.actor), None, build_backend(cfg, model, tokenizer), tokenizer, tools)


@contextlib.contextmanager
def _wrapped(name: str, wrap: Callable) -> Iterator[None]:
    """Replace ``mempo.train.step.<name>`` (what `train_step` calls) by ``wrap(original)`` for a
    broken-variant run; test-local, restored on exit."""
    original = getattr(step_module, name)
    setattr(step_module, name, wrap(original))
    try:
        yield
    finally:
        setattr(step_module, name, original)


def _flip_token_advantages(original):
    def flipped(*args, **kwargs):
        result = original(*args, **kwargs)
        return result._replace(advantages=-result.advantages)
    return flipped


def _flip_memory_rewards(original):
    def flipped(*args, **kwargs):
        rewards, details = original(*args, **kwargs)
        return [[None if v is None else -v for v in per_round] for per_round in rewards], details
    return flipped


def _move_memory_spans(original):
    def moved(trajectories, **kwargs):
        inputs = original(trajectories, **kwargs)
        spans = inputs.mem_spans
        return inputs._replace(mem_spans=spans - spans[:, :1])  # onto round 1's <mem> (response start)
    return moved


BROKEN = {"flip": ("compute_memory_rewards", _flip_memory_rewards),
          "move": ("advantage_inputs", _move_memory_spans)}


# ------------------------------------------------------------------------------------------------
# (a) outcome RL
# ------------------------------------------------------------------------------------------------
OUTCOME_KEYS = KEYS[:4]
OUTCOME_STEPS = 60


def _outcome_sft(seed: int):
    """The SFT'd model of seed `seed`, its config and the hidden door -> code permutation."""
    cfg = _config(seed)
    rng = random.Random(f"outcome/{seed}")
    codes = list(CODES[:4])
    rng.shuffle(codes)
    answer_of = dict(zip(OUTCOME_KEYS, codes))  # never shown: learnable from the reward alone
    records = []
    for _ in range(64):  # the format with a uniformly random code
        key, code = rng.choice(OUTCOME_KEYS), rng.choice(CODES[:4])
        records.append({"messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": f"door {key}"},
                                     {"role": "assistant", "content": _answer_round(key, code)}]})
    model = tiny_model(_tokenizer(), "tiny", seed=seed)
    run_sft(cfg, model, _tokenizer(), records, seed=seed)
    return cfg, model, answer_of


def _mean_outcome(ctx: StepContext, episodes, seed: int) -> float:
    engine = RolloutEngine(ctx.backend, ctx.tokenizer, ctx.tools, config=ctx.cfg.rollout, seed=10 ** 6 + seed)
    trajectories = score_outcomes(engine.run(episodes, group_size=32))
    return sum(t.score for t in trajectories) / len(trajectories)


def outcome_run(cfg: MempoConfig, model, answer_of: dict, seed: int, flip: bool = False) -> dict:
    """Mean outcome reward before and after `OUTCOME_STEPS` train steps (module docstring (a))."""
    ctx = _context(cfg, model, {})
    episodes = [RolloutTask(f"door-{k}", f"door {k}", [answer_of[k]]) for k in OUTCOME_KEYS]
    before = _mean_outcome(ctx, episodes, seed)
    curve = []
    with _wrapped("token_advantages", _flip_token_advantages) if flip else contextlib.nullcontext():
        for step in range(1, OUTCOME_STEPS + 1):
            curve.append(train_step(ctx, episodes, step).metrics["reward/mean"])
    return {"before": before, "after": _mean_outcome(ctx, episodes, seed), "curve": curve}


def outcome_passes(ok: dict) -> bool:
    return ok["after"] - ok["before"] >= 0.10


def outcome_flipped_falls(flipped: dict) -> bool:
    return flipped["after"] <= flipped["before"] - 0.10


def test_outcome_rl_raises_the_reward_and_a_flipped_sign_lowers_it():
    torch.set_num_threads(1)
    seed = 0
    cfg, model, answer_of = _outcome_sft(seed)
    ok = outcome_run(cfg, copy.deepcopy(model), answer_of, seed)
    flipped = outcome_run(cfg, model, answer_of, seed, flip=True)
    assert 0.05 <= ok["before"] <= 0.45, ok  # starts low: a near-uniform choice of 4 codes
    assert outcome_passes(ok), ok
    assert outcome_flipped_falls(flipped), flipped


# ------------------------------------------------------------------------------------------------
# (b) memory credit assignment
# ------------------------------------------------------------------------------------------------
MEMORY_STEPS = 10


class _Doors:
    """The environment of (b): door -> code, refilled by the test before each step."""

    def __init__(self) -> None:
        self.codes: dict[str, str] = {}
        self.tool = tool(self.search, name="search", result_kind="search_results")  # a `mempo.tools.Tool`

    def search(self, query: str) -> str:
        code = self.codes.get(query.strip())
        return f"code {code}" if code else "no such door"


def _direct_sft(model, examples, steps: int, lr: float, seed: int, rows: int = 16) -> float:
    """Next-token cross-entropy on each example's masked ids (AdamW, shuffled batches of `rows`);
    returns the mean loss of the last 10 steps."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    rng, order, losses = random.Random(seed), [], []
    pad = _tokenizer().pad_token_id
    model.train()
    for _ in range(steps):
        if len(order) < rows:
            more = list(range(len(examples)))
            rng.shuffle(more)
            order += more
        batch, order = order[:rows], order[rows:]
        width = max(len(examples[i].input_ids) for i in batch)
        ids = torch.full((rows, width), pad)
        attention = torch.zeros_like(ids)
        mask = torch.zeros_like(ids, dtype=torch.bool)
        for r, i in enumerate(batch):
            n = len(examples[i].input_ids)
            ids[r, :n] = torch.tensor(examples[i].input_ids)
            attention[r, :n] = 1
            mask[r, :n] = torch.tensor(examples[i].loss_mask, dtype=torch.bool)
        logits = model(input_ids=ids, attention_mask=attention, use_cache=False).logits[:, :-1]
        select = mask[:, 1:]
        loss = torch.nn.functional.cross_entropy(logits[select].float(), ids[:, 1:][select])
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        losses.append(float(loss.detach()))
    model.eval()
    return sum(losses[-10:]) / 10


def _memory_sft(seed: int, steps: int = 600, lr: float = 2e-3, teacher_share: float = 0.6, **shape):
    """The SFT'd model of (b) for seed `seed` (module docstring)."""
    tokenizer = _tokenizer()
    rng = random.Random(f"memory/{seed}")
    system = {"role": "system", "content": SYSTEM}
    records = []
    for _ in range(128):
        key, code = rng.choice(KEYS), rng.choice(CODES)
        records.append({"messages": [system, {"role": "user", "content": f"door {key}"},
                                     {"role": "assistant", "content": _search_round(key)},
                                     {"role": "user", "content": information(f"code {code}")},
                                     {"role": "assistant", "content": _second_round(key, code, rng.random() < 0.5)}]})
    examples = examples_from_trajectories(records, tokenizer)
    chat = ChatFormat(tokenizer)
    for _ in range(int(len(examples) * teacher_share)):  # the teacher's format: continuation after a kept fact
        key, code = rng.choice(KEYS), rng.choice(CODES)
        context = chat.prompt_ids([system, {"role": "user", "content": f"door {key}"}])
        context += chat.encode(f"<mem> code {code} </mem>")
        answer = chat.encode(DEFAULT_ANSWER_TEMPLATE.format(answer=code))
        examples.append(type(examples[0])(context + answer, [0] * len(context) + [1] * len(answer)))
    model = tiny_model(tokenizer, "tiny", seed=seed, **shape)
    _direct_sft(model, examples, steps=steps, lr=lr, seed=seed)
    return model


def _memory_budget() -> tuple[int, int]:
    """(rollout.max_new_tokens_per_round, rollout.max_response_tokens) of (b): a round holds the
    round-1 search turn and no more (an answer turn of the SFT'd form is longer), and the response
    holds round 1, its tool segment and round 2's ``<mem> code X </mem>`` plus one id, so round 2
    always ends at the token budget just after its <mem> block (an answer needs 16 ids more): no
    trajectory can answer there."""
    chat = ChatFormat(_tokenizer())
    round_1 = len(chat.encode(_search_round(KEYS[0])))  # forced prefix included
    tool = len(chat.tool_segment(information(f"code {CODES[0]}")).ids)
    mem = len(chat.encode(f"<mem> code {CODES[0]} </mem>"))
    return round_1 - len(chat.prefix_ids), round_1 + tool + mem + 1


def _keeps(trajectory, tokenizer) -> list[bool]:
    """Per scored round: whether its <mem> holds the gold code."""
    return [f"code {trajectory.golds[0]} " in tokenizer.decode(trajectory.response_ids[slice(*r.mem_span)])
            for r in trajectory.scored_rounds()]


def _memory_eval(ctx: StepContext, doors: _Doors, seed: int) -> dict:
    rng = random.Random(f"memory-eval/{seed}")
    doors.codes = {k: rng.choice(CODES) for k in KEYS}
    episodes = [RolloutTask(f"door-{k}", f"door {k}", [doors.codes[k]]) for k in KEYS]
    engine = RolloutEngine(ctx.backend, ctx.tokenizer, ctx.tools, config=ctx.cfg.rollout, seed=10 ** 6 + seed)
    trajectories = score_outcomes(engine.run(episodes, group_size=16))
    s = ctx.cfg.scoring
    results = score(ctx.scoring_model, scoring_requests(trajectories, ctx.tokenizer), method=s.method,
                    threshold=s.threshold, token_budget=s.token_budget)
    p_mem = [v for r in results for v in r.p_mem]
    keeps = [v for t in trajectories for v in _keeps(t, ctx.tokenizer)]
    return {"keep": sum(keeps) / max(len(keeps), 1), "p_mem": sum(p_mem) / max(len(p_mem), 1),
            "scored": len(keeps), "outcome": sum(t.score for t in trajectories) / len(trajectories)}


def memory_run(model, seed: int, memory_weight: float = 1.0, broken: str = "") -> dict:
    """Keep share and P(answer | mem_ctx) before and after `MEMORY_STEPS` train steps (module
    docstring (b)); also the largest per-step outcome reward and share of groups with variance."""
    round_limit, response_limit = _memory_budget()
    cfg = _config(seed, rollout={"max_turns": 2, "max_new_tokens_per_round": round_limit,
                                 "max_response_tokens": response_limit},
                  actor={"lr": 3e-4}, algorithm={"memory_weight": memory_weight})
    doors = _Doors()
    ctx = _context(cfg, model, [doors.tool])
    before = _memory_eval(ctx, doors, seed)
    steps = []
    with _wrapped(*BROKEN[broken]) if broken else contextlib.nullcontext():
        for step in range(1, MEMORY_STEPS + 1):
            rng = random.Random(f"memory-train/{seed}/{step}")
            keys = rng.sample(KEYS, 4)
            doors.codes = {k: rng.choice(CODES) for k in keys}  # fresh facts: only the tool shows them
            result = train_step(ctx, [RolloutTask(f"door-{k}", f"door {k}", [doors.codes[k]]) for k in keys], step)
            steps.append(result.metrics)
    after = _memory_eval(ctx, doors, seed)
    return {"before": before, "after": after,
            "max_reward": max(m["reward/mean"] for m in steps),
            "max_groups_with_variance": max(m["adv/groups_with_variance"] for m in steps),
            "mem_advantage": sum(m["adv/abs_mean_mem"] for m in steps) / len(steps)}


def _rise(run: dict, name: str) -> float:
    return run["after"][name] - run["before"][name]


def memory_passes(run: dict) -> bool:
    return _rise(run, "keep") >= 0.15 and _rise(run, "p_mem") >= 0.08


def memory_still(run: dict) -> bool:
    return abs(_rise(run, "keep")) <= 0.05 and abs(_rise(run, "p_mem")) <= 0.05


def memory_check(seed: int = 0) -> None:
    torch.set_num_threads(1)
    model = _memory_sft(seed)
    mempo = memory_run(copy.deepcopy(model), seed, memory_weight=1.0)
    grpo = memory_run(model, seed, memory_weight=0.0)
    for run in (mempo, grpo):  # the outcome carries no signal: only the memory reward can act
        assert run["max_reward"] == 0.0 and run["max_groups_with_variance"] == 0.0, run
        assert run["before"]["scored"] >= 100, run  # round 2 is reached and scored
    assert mempo["mem_advantage"] > 0.1 and grpo["mem_advantage"] == 0.0
    assert 0.2 <= mempo["before"]["keep"] <= 0.8, mempo  # room to move either way
    assert memory_passes(mempo), mempo
    assert memory_still(grpo), grpo


def test_memory_reward_moves_the_mem_blocks_that_keep_the_fact():
    memory_check(0)


# ------------------------------------------------------------------------------------------------
# the sweep behind the thresholds (not a test)
# ------------------------------------------------------------------------------------------------
def _summary(name: str, values: list[float]) -> str:
    return f"{name}: mean {statistics.mean(values):+.3f}, min {min(values):+.3f}, max {max(values):+.3f}"


def _sweep(kind: str, seeds: int) -> None:
    torch.set_num_threads(1)
    table: dict[str, list] = {}
    for seed in range(seeds):
        began = time.perf_counter()
        if kind == "outcome":
            cfg, model, answer_of = _outcome_sft(seed)
            runs = {"ok": outcome_run(cfg, copy.deepcopy(model), answer_of, seed),
                    "flip": outcome_run(cfg, model, answer_of, seed, flip=True)}
            for name, run in runs.items():
                table.setdefault(name, []).append(run)
                print(f"seed {seed} {name}: before {run['before']:.3f} after {run['after']:.3f} "
                      f"delta {run['after'] - run['before']:+.3f} passes {outcome_passes(run)} "
                      f"falls {outcome_flipped_falls(run)}", flush=True)
        else:
            model = _memory_sft(seed)
            variants = {"ok": dict(memory_weight=1.0), "mw0": dict(memory_weight=0.0),
                        "flip": dict(broken="flip"), "move": dict(broken="move")}
            for name, options in variants.items():
                run = memory_run(copy.deepcopy(model), seed, **options)
                table.setdefault(name, []).append(run)
                print(f"seed {seed} {name}: keep {run['before']['keep']:.3f}->{run['after']['keep']:.3f} "
                      f"p_mem {run['before']['p_mem']:.3f}->{run['after']['p_mem']:.3f} "
                      f"scored {run['before']['scored']} max_reward {run['max_reward']} "
                      f"var {run['max_groups_with_variance']} passes {memory_passes(run)} still {memory_still(run)}",
                      flush=True)
        print(f"seed {seed}: {time.perf_counter() - began:.1f}s", flush=True)
    for name, runs in table.items():
        if kind == "outcome":
            print(name, _summary("after - before", [r["after"] - r["before"] for r in runs]),
                  _summary("before", [r["before"] for r in runs]), _summary("after", [r["after"] for r in runs]))
        else:
            print(name, _summary("keep rise", [_rise(r, "keep") for r in runs]), "|",
                  _summary("p_mem rise", [_rise(r, "p_mem") for r in runs]), "|",
                  _summary("keep before", [r["before"]["keep"] for r in runs]), "| passes",
                  sum(memory_passes(r) for r in runs), "still", sum(memory_still(r) for r in runs))


if __name__ == "__main__":
    if sys.argv[1] == "memory-check":
        memory_check(int(sys.argv[2]))
    else:
        _sweep(sys.argv[1], int(sys.argv[2]))
