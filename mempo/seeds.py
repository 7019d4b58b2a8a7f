"""Every derived seed, by name: how one seed of the configuration becomes the seed of a step, a
generation call or a set of questions. Rollout seeds stay below ``SEED_MODULUS`` (2**31 - 1, a
prime), so every backend takes them; the question-seed offsets keep the evaluation (test), validation,
cold-start and training (``data.seed`` itself) draws apart.
"""
from __future__ import annotations

__all__ = ["SEED_MODULUS", "STEP_SEED_STRIDE", "CALL_SEED_STRIDE", "EVAL_SEED_OFFSET", "SFT_SEED_OFFSET",
           "VALIDATION_SEED_OFFSET", "training_rollout_seed", "generation_seed", "eval_question_seed",
           "sft_question_seed", "validation_question_seed"]

#: Rollout seeds are taken modulo this prime (2**31 - 1).
SEED_MODULUS = 2 ** 31 - 1
#: The multiplier of a base seed when a step or call number is mixed in (a prime).
STEP_SEED_STRIDE = 1_000_003
#: The multiplier of an engine's call counter in its generation seeds (a prime).
CALL_SEED_STRIDE = 10_007
#: Evaluation question seeds: ``data.seed + EVAL_SEED_OFFSET + k``.
EVAL_SEED_OFFSET = 10_000
#: Cold-start (SFT) question seeds: ``data.seed + SFT_SEED_OFFSET + k``.
SFT_SEED_OFFSET = 20_000
#: Validation question seeds: ``data.seed + VALIDATION_SEED_OFFSET + k``.
VALIDATION_SEED_OFFSET = 30_000


def training_rollout_seed(rollout_seed: int, step: int) -> int:
    """The engine seed of training step `step` (1-based):
    ``(rollout_seed * STEP_SEED_STRIDE + step) % SEED_MODULUS``. The samples of a step depend only on
    (weights, episodes, rollout.seed, step), so a resumed run re-samples exactly."""
    return (int(rollout_seed) * STEP_SEED_STRIDE + int(step)) % SEED_MODULUS


def generation_seed(engine_seed: int, call: int, step: int) -> int:
    """The sampling seed of generation step `step` of an engine's `call`-th run
    (`mempo.rollout.loop.RolloutEngine`):
    ``(engine_seed * STEP_SEED_STRIDE + call * CALL_SEED_STRIDE + step) % SEED_MODULUS``."""
    return (int(engine_seed) * STEP_SEED_STRIDE + int(call) * CALL_SEED_STRIDE + int(step)) % SEED_MODULUS


def eval_question_seed(data_seed: int, objectives: int) -> int:
    """The question seed of the evaluation episodes of `objectives` objectives."""
    return int(data_seed) + EVAL_SEED_OFFSET + int(objectives)


def sft_question_seed(data_seed: int, objectives: int) -> int:
    """The question seed of the cold-start (SFT) episodes of `objectives` objectives (the demo's and
    ``sft.objectives``')."""
    return int(data_seed) + SFT_SEED_OFFSET + int(objectives)


def validation_question_seed(data_seed: int, objectives: int) -> int:
    """The question seed of the validation episodes of `objectives` objectives (``eval.split:
    validation``; `mempo.eval.validation_episodes`)."""
    return int(data_seed) + VALIDATION_SEED_OFFSET + int(objectives)
