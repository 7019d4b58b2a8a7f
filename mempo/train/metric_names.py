"""The names of the training metrics the run report reads: one name per metric, defined here once.

`mempo.train.step` writes its metrics under these keys (``metrics.jsonl``, TensorBoard) and
`mempo.apps.report` reads them under the same keys; nothing else spells them. The actor's own
update metrics keep the actor's names under ``actor/`` (`mempo.train.actor.Actor.update`).
"""
from __future__ import annotations

__all__ = ["REWARD", "EM", "F1", "FORMAT_RATE", "MEM_REWARD", "MEM_KEEPS", "P_MEM", "P_FULL", "KL", "ENTROPY",
           "CLIP_FRACTION", "TOKENS", "LOSS", "GRAD_NORM", "STEP_SECONDS", "SFT_LOSS", "ACTOR_PREFIX",
           "TIME_PREFIX"]

#: Prefix of the actor's update metrics (``actor/<name of Actor.update>``).
ACTOR_PREFIX = "actor/"
#: Prefix of the seconds per step stage (`mempo.train.logging.StageTimer.metrics`).
TIME_PREFIX = "time/"

REWARD = "reward/mean"            # mean outcome score of the step's trajectories
EM = "reward/em"                  # mean per-objective exact match
F1 = "reward/f1"                  # mean per-objective token F1
FORMAT_RATE = "reward/format_rate"  # share of trajectories with a valid format
MEM_REWARD = "memory/reward"      # mean memory reward of the scored rounds (scoring section; paper: P_mem - P_full)
MEM_KEEPS = "memory/keeps_facts"  # share of scored <mem> blocks keeping every gold already retrieved
P_MEM = "memory/p_mem"            # mean P(answer | mem_ctx) of the scored rounds
P_FULL = "memory/p_full"          # mean P(answer | full_ctx) of the scored rounds (full_ctx: scoring.comparator)
KL = ACTOR_PREFIX + "kl_loss"     # KL to the reference policy (the loss term)
ENTROPY = ACTOR_PREFIX + "entropy"
CLIP_FRACTION = ACTOR_PREFIX + "pg_clipfrac"
LOSS = ACTOR_PREFIX + "loss"
GRAD_NORM = ACTOR_PREFIX + "grad_norm"
TOKENS = "train/tokens"           # real tokens of the step's training batch
STEP_SECONDS = TIME_PREFIX + "step"
SFT_LOSS = "sft/loss"             # `mempo.train.sft.run_sft`, per optimiser step
