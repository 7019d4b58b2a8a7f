"""Signal quality of the memory reward, before any RL: from one SFT model, roll out held-out episodes
once, then compute every memory-reward definition of `DEFINITIONS` on the same rollouts and measure how
well each separates the ``<mem>`` blocks that keep the facts retrieved so far from those that drop one
(`mempo.records.trajectory.Trajectory.memory_keeps`: True / False / None; None rows are excluded).

Per definition, per k, overall and per round index (`Round.index`, 0-based; round 1 is the first
scored one):

    auc            P(reward of a keeping <mem> > reward of a dropping one), ties counting 1/2
                   (Mann-Whitney, `auc`); None without both classes
    auc_se         its standard error by a bootstrap over groups (`auc_bootstrap_se`: the G samples of
                   one episode share a question, so rounds are not independent); overall cells only
    spearman       within-group Spearman rank correlation of reward with keeps (`spearman`), averaged
                   over the groups (the G samples of one episode) holding both classes
                   (`within_group_spearman`: a group whose rewards are all equal counts 0); None when
                   no group holds both classes
    no_spread      the share of pools whose rewards are all equal (`no_spread_share`; pools of >= 2
                   rewards; overall a pool is a group's scored rounds, per round index the group's
                   rounds of that index); None without such a pool

and the graded label (at k >= 4 a ``<mem>`` keeping every retrieved fact is rare, so the binary AUC
is often not judgeable there):

    share_spearman the Spearman rank correlation (`spearman`, pooled over the rounds) of the reward
                   with the share of the retrieved facts the ``<mem>`` keeps
                   (`Trajectory.memory_kept_shares`; 1.0 where keeps is True); None without a ranking
    share_spearman_se  its bootstrap SE over groups (`spearman_bootstrap_se`); overall cells only
    pending_auc    the AUC (keeps vs drops) on the rounds with a question still pending: some
                   objective's gold not retrieved before the round (`Trajectory.retrieved_objectives`;
                   the rounds ``scoring.scored_objectives: complete`` leaves out), with
                   ``pending_keeps`` / ``pending_drops``
    pending_auc_se its bootstrap SE over groups (`auc_bootstrap_se`); overall cells only

Run (after the demo, whose output holds the SFT model and the configuration):

    bash tools/demo.sh                                   # writes demo_out/ (model_sft, config.yaml)
    .venv-test/bin/python bench/bench_signal.py --demo-out demo_out --out bench_signal_out

Options: --model (the model folder in --demo-out, default model_sft; model_rl for the RL model),
--questions (episodes per k, default 32), --samples (G per episode, default 8), --ks (default 2 4),
--definitions (default all of `DEFINITIONS`), --seed (rollout seed, default the config's
rollout.seed), --reroll (roll out again over saved rollouts of another setting), --device, --threads,
and dotted config overrides (``key=value``, anywhere; not of the ``synthetic``, ``data`` and ``eval``
sections, which fix the world and the held-out draw, except ``eval.split``: which held-out split is
scored). Writes ``<out>/rollouts_k<k>.jsonl`` with
``<out>/rollouts_k<k>.json`` (the trajectories, scored, and the setting they were made with: a rerun
with the same setting reuses them; another setting is refused unless --reroll), ``<out>/rounds.jsonl``
(one row per scored round: k, group, sample, round index, keeps, every definition's reward),
``<out>/results.json`` and ``<out>/results.md`` (the tables the signal experiments in docs/experiments cite).

Held out: the episodes are the first ``--questions`` per k of the demo's held-out split that
``eval.split`` names (`mempo.eval.eval_episodes` with the demo's configuration): ``test``, the
``eval.episodes`` per k of ``eval.objectives`` that results are reported on, or ``validation``,
``eval.validation_episodes`` per k disjoint by entity from the test split, on which every choice
made from this benchmark (a definition, an SFT seed) belongs: ``eval.split=validation`` on the
command line (the demo must have held them out: ``eval.validation_episodes`` > 0). The results and
the table's first line name the split. The demo's SFT and RL questions never have a subject of
either split (`mempo.eval.held_out_of_training`), so the SFT model never trained on these questions'
entities; a k outside ``eval.objectives`` is refused, and the results record how many of the rollout
episodes' subjects an SFT episode of this configuration asks about (0 unless the demo changed). The rollouts use the
``rollout`` section (the RL rollouts' settings: the memory reward is computed on those in training)
with ``group_size`` = --samples; the golds reach the outcome and the teacher scoring only.

A definition is a set of dotted config overrides applied on top of the run's configuration whose
``scoring`` section is reset to the library's defaults (the paper's definition) except
``SCORING_INHERITED`` (how scoring runs, not what it computes, and the answer template the model was
taught to answer in): ``"paper": {}`` is the paper's
definition whatever the demo's config sets (the demo's own ``scoring.threshold`` is null; that one is
``paper_nothresh``). A key the configuration lacks is a ConfigError naming it. Rewards come from ONE
function, `definition_rewards`.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import math
import random
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any, Iterable, Mapping, Optional, Sequence

import torch

from mempo.algo.memory_reward import RoundMemoryReward
from mempo.algo.outcome import score_outcomes
from mempo.config import ConfigError, MempoConfig, config_from_dict, config_to_dict, load_config, split_overrides
from mempo.env.build import build_tools
from mempo.errors import MempoError
from mempo.model.loading import pretrained_causal_lm, pretrained_tokenizer
from mempo.protocol.reward import objectives_from_golds
from mempo.eval import eval_episodes, held_out_of_training
from mempo.records.trajectory import Trajectory, read_trajectories_jsonl, write_trajectories_jsonl
from mempo.rollout.backends.factory import build_backend
from mempo.rollout.backends.scaffold import ProtocolScaffold
from mempo.rollout.loop import RolloutEngine
from mempo.scoring import compute_memory_rewards
from mempo.seeds import sft_question_seed
from mempo.synthetic.build import build_world
from mempo.synthetic.heldout import held_out_subjects, training_episodes
from mempo.utils.allocator import keep_freed_memory
from mempo.utils.atomic import replace_file_atomically
from mempo.utils.digest import weights_digest
from mempo.utils.jsonl import write_jsonl
from mempo.utils.machine import machine_facts

#: Each memory-reward definition: dotted config overrides on top of the library's scoring defaults.
DEFINITIONS: dict[str, dict[str, Any]] = {
    "paper": {},                                   # the library default: P(mem) - P(full), threshold 0.5
    "paper_nothresh": {"scoring.threshold": None},  # every gold token counts (the demo config's setting)
    # docs/ALGORITHM.md section 4e: each weakness of the paper's definition fixed alone, then together
    "history_mem": {"scoring.comparator": "history_mem"},          # comparator ends in this round's </mem>
    "retrieved": {"scoring.scored_objectives": "retrieved"},       # per objective, only those retrieved
    "log": {"scoring.reward": "log", "scoring.threshold": None},   # clip(mean logp gap, -1, 1) nats
    "retrieved_log": {"scoring.scored_objectives": "retrieved", "scoring.reward": "log", "scoring.threshold": None},
    "all_fixes": {"scoring.comparator": "history_mem", "scoring.scored_objectives": "retrieved",
                  "scoring.reward": "log", "scoring.threshold": None},
    # a clip of 1 nat flattens most gaps of a small model (its mean gold log-probs differ by several
    # nats); then the worst-kept retrieved fact instead of the mean (`<mem>` keeps every fact or not)
    "retrieved_log_c10": {"scoring.scored_objectives": "retrieved", "scoring.reward": "log",
                          "scoring.threshold": None, "scoring.log_clip": 10.0},
    "retrieved_min_c10": {"scoring.scored_objectives": "retrieved", "scoring.reward": "log",
                          "scoring.threshold": None, "scoring.log_clip": 10.0, "scoring.objective_reduce": "min"},
    "all_fixes_min_c10": {"scoring.comparator": "history_mem", "scoring.scored_objectives": "retrieved",
                          "scoring.reward": "log", "scoring.threshold": None, "scoring.log_clip": 10.0,
                          "scoring.objective_reduce": "min"},
    # only the rounds with nothing left to search: an agent that answers only when done reads no
    # <mem> that still has a question pending (docs/experiments/S3-pending-rounds-complete.md)
    "complete_min_c10": {"scoring.scored_objectives": "complete", "scoring.reward": "log",
                         "scoring.threshold": None, "scoring.log_clip": 10.0, "scoring.objective_reduce": "min"},
    "complete_hist_min_c10": {"scoring.comparator": "history_mem", "scoring.scored_objectives": "complete",
                              "scoring.reward": "log", "scoring.threshold": None, "scoring.log_clip": 10.0,
                              "scoring.objective_reduce": "min"},
}
#: Fields of the run's ``scoring`` section a definition inherits: how scoring runs, not what it computes,
#: and the answer template, the answer round the SFT model was taught (``synthetic.oracle_answer_template``).
SCORING_INHERITED = ("method", "token_budget", "answer_template")
#: The fields of the setting a saved rollout file must match to be reused.
ROLLOUT_KEY_FIELDS = ("format", "k", "episode_ids", "samples", "seed", "chunk", "model_sha256", "rollout", "backend")
ROLLOUT_FORMAT = "mempo-bench-signal-rollouts/1"
#: Sections no override may change: they fix the world and the held-out draw the SFT model was made with.
FIXED_SECTIONS = ("synthetic", "data", "eval")
#: The one field of them an override may set: which held-out split is scored (the draw stays the same).
FREE_FIELDS = ("eval.split",)


class BenchError(MempoError):
    """Bad input to the benchmark (printed as one ``bench_signal: ...`` line, exit 2)."""


# ------------------------------------------------------------------------------------------------
# metrics: pure functions of floats and booleans
# ------------------------------------------------------------------------------------------------
def average_ranks(values: Sequence[float]) -> list[float]:
    """1-based ranks of `values` in ascending order; tied values share the mean of their ranks
    (``[3, 1, 3] -> [2.5, 1.0, 2.5]``). ValueError for a non-finite value."""
    if not all(math.isfinite(v) for v in values):
        raise ValueError(f"ranks need finite values, got {list(values)}")
    order = sorted(range(len(values)), key=lambda i: values[i])
    ranks = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for m in range(i, j + 1):
            ranks[order[m]] = (i + j) / 2 + 1  # positions i..j (0-based) share the mean 1-based rank
        i = j + 1
    return ranks


def auc(scores: Sequence[float], labels: Sequence[bool]) -> Optional[float]:
    """The area under the ROC curve of `scores` separating ``labels`` True from False:
    P(score of a True > score of a False) + 1/2 P(equal), by the Mann-Whitney U statistic
    ``(sum of the True ranks - n1 (n1 + 1) / 2) / (n1 n0)`` on `average_ranks`. In [0, 1]; 0.5 when
    every score is equal. None when either class is empty (also for empty input). ValueError when
    the lengths differ or a score is not finite."""
    if len(scores) != len(labels):
        raise ValueError(f"{len(scores)} scores but {len(labels)} labels")
    n1 = sum(1 for y in labels if y)
    n0 = len(labels) - n1
    if n1 == 0 or n0 == 0:
        return None
    ranks = average_ranks(scores)
    rank_sum = sum(r for r, y in zip(ranks, labels) if y)
    return (rank_sum - n1 * (n1 + 1) / 2) / (n1 * n0)


def bootstrap_se(groups: Sequence[Sequence[Any]], statistic, resamples: int = 500,
                 seed: int = 0) -> Optional[float]:
    """The standard error of ``statistic(rows)`` (a float, or None where undefined) over `groups`
    (each a list of rows that share an episode) by a bootstrap over groups: draw len(groups) groups
    with replacement `resamples` times (random.Random(seed): the same SE on every run), the sample
    std of the draws' values (draws where it is None are skipped). None when fewer than 2 draws have
    a value."""
    rng = random.Random(seed)
    draws = []
    for _ in range(resamples):
        value = statistic([row for _ in groups for row in groups[rng.randrange(len(groups))]])
        if value is not None:
            draws.append(value)
    return statistics.stdev(draws) if len(draws) >= 2 else None


def auc_bootstrap_se(groups: Sequence[Sequence[tuple[float, bool]]], resamples: int = 500,
                     seed: int = 0) -> Optional[float]:
    """The standard error of `auc` over `groups` (each a list of (score, label) rows that share an
    episode) by `bootstrap_se` (draws lacking a class are skipped). None when the pooled rows lack a
    class or fewer than 2 draws have both."""
    if len({y for group in groups for _, y in group}) < 2:  # one class (or none): no AUC to draw
        return None
    return bootstrap_se(groups, lambda rows: auc([v for v, _ in rows], [y for _, y in rows]), resamples, seed)


def spearman_bootstrap_se(groups: Sequence[Sequence[tuple[float, float]]], resamples: int = 500,
                          seed: int = 0) -> Optional[float]:
    """The standard error of `spearman` over `groups` (each a list of (x, y) rows that share an
    episode) by `bootstrap_se` (draws without a ranking are skipped). None when the pooled rows have
    no ranking or fewer than 2 draws have one."""
    def rho(rows: Sequence[tuple[float, float]]) -> Optional[float]:
        return spearman([x for x, _ in rows], [y for _, y in rows])
    if rho([row for group in groups for row in group]) is None:
        return None
    return bootstrap_se(groups, rho, resamples, seed)


def spearman(x: Sequence[float], y: Sequence[float]) -> Optional[float]:
    """Spearman's rank correlation: the Pearson correlation of `average_ranks` (ties averaged), in
    [-1, 1]. None when either sequence has fewer than 2 distinct values (no ranking: empty input, one
    element, all equal). ValueError when the lengths differ or a value is not finite."""
    if len(x) != len(y):
        raise ValueError(f"{len(x)} x values but {len(y)} y values")
    if len(set(x)) < 2 or len(set(y)) < 2:
        return None
    rx, ry = average_ranks(x), average_ranks(y)
    mx, my = statistics.fmean(rx), statistics.fmean(ry)
    cov = sum((a - mx) * (b - my) for a, b in zip(rx, ry))
    vx = sum((a - mx) ** 2 for a in rx)
    vy = sum((b - my) ** 2 for b in ry)
    return max(-1.0, min(1.0, cov / math.sqrt(vx * vy)))


def within_group_spearman(groups: Iterable[tuple[Sequence[float], Sequence[bool]]]) -> tuple[Optional[float], int]:
    """(mean, count) of `spearman` (rewards, keeps as 0/1) over the groups holding both keeps
    classes; a group whose rewards are all equal (no ranking of what differs) counts 0.0. Groups with
    one class only are left out; (None, 0) when none is left."""
    values = []
    for rewards, keeps in groups:
        if len(set(bool(k) for k in keeps)) < 2:
            continue
        rho = spearman(list(rewards), [float(bool(k)) for k in keeps])
        values.append(0.0 if rho is None else rho)
    return (statistics.fmean(values) if values else None), len(values)


def no_spread_share(pools: Iterable[Sequence[float]], tolerance: float = 0.0) -> tuple[Optional[float], int]:
    """(share, count) of the pools of at least 2 rewards whose spread ``max - min`` is at most
    `tolerance` (0.0: all exactly equal); pools of fewer than 2 rewards are left out; (None, 0) when
    none is left."""
    sized = [list(p) for p in pools if len(p) >= 2]
    if not sized:
        return None, 0
    flat = sum(1 for p in sized if max(p) - min(p) <= tolerance)
    return flat / len(sized), len(sized)


# ------------------------------------------------------------------------------------------------
# rows: one per scored round
# ------------------------------------------------------------------------------------------------
@dataclasses.dataclass
class RoundRow:
    """One scored round: objectives k, group (the episode's uid), sample, round index, whether its
    ``<mem>`` keeps the retrieved golds (None: none retrieved yet), each definition's reward (None:
    the definition does not score the round), the share of the retrieved golds the ``<mem>`` keeps
    (None: none retrieved yet) and whether a question is still pending (some objective's gold not
    retrieved before the round; None without golds)."""

    k: int
    group: str
    sample: int
    round_index: int
    keeps: Optional[bool]
    rewards: dict[str, Optional[float]]
    kept_share: Optional[float] = None
    pending: Optional[bool] = None


def signal_metrics(rows: Sequence[RoundRow], definition: str, with_se: bool = False) -> dict[str, Any]:
    """The metrics of one definition on `rows` (module docstring); pools are per group within
    `rows` (pass one round index's rows for (group, round) pools); the SEs (``auc_se``,
    ``share_spearman_se``, ``pending_auc_se``) only `with_se` (else None: the bootstrap is the slow
    part). Plain JSON (None, never NaN)."""
    labelled = [(r.rewards[definition], bool(r.keeps)) for r in rows
                if r.keeps is not None and r.rewards[definition] is not None]
    by_group: dict[str, list[tuple[float, bool]]] = defaultdict(list)
    graded: dict[str, list[tuple[float, float]]] = defaultdict(list)  # (reward, kept share) per group
    pending: dict[str, list[tuple[float, bool]]] = defaultdict(list)  # (reward, keeps), question pending
    pools: dict[str, list[float]] = defaultdict(list)
    for r in rows:
        value = r.rewards[definition]
        if value is None:
            continue
        pools[r.group].append(value)
        if r.keeps is not None:
            by_group[r.group].append((value, bool(r.keeps)))
            if r.pending:
                pending[r.group].append((value, bool(r.keeps)))
        if r.kept_share is not None:
            graded[r.group].append((value, float(r.kept_share)))
    shares = [row for group in graded.values() for row in group]
    pending_rows = [row for group in pending.values() for row in group]
    rho, groups = within_group_spearman(([v for v, _ in g], [y for _, y in g]) for g in by_group.values())
    flat, num_pools = no_spread_share(pools.values())
    keep_values = [v for v, y in labelled if y]
    drop_values = [v for v, y in labelled if not y]
    return {
        "rounds": len(rows), "scored": sum(1 for r in rows if r.rewards[definition] is not None),
        "keeps": len(keep_values), "drops": len(drop_values),
        "auc": auc([v for v, _ in labelled], [y for _, y in labelled]),
        "auc_se": auc_bootstrap_se(list(by_group.values())) if with_se else None,
        "spearman": rho, "spearman_groups": groups, "no_spread": flat, "pools": num_pools,
        "mean_reward_keeps": statistics.fmean(keep_values) if keep_values else None,
        "mean_reward_drops": statistics.fmean(drop_values) if drop_values else None,
        "graded_rounds": len(shares),
        "share_spearman": spearman([v for v, _ in shares], [x for _, x in shares]),
        "share_spearman_se": spearman_bootstrap_se(list(graded.values())) if with_se else None,
        "pending_keeps": sum(1 for _, y in pending_rows if y),
        "pending_drops": sum(1 for _, y in pending_rows if not y),
        "pending_auc": auc([v for v, _ in pending_rows], [y for _, y in pending_rows]),
        "pending_auc_se": auc_bootstrap_se(list(pending.values())) if with_se else None,
    }


def signal_table(rows: Sequence[RoundRow], definitions: Sequence[str],
                 ks: Optional[Sequence[int]] = None) -> dict[str, dict[str, dict[str, Any]]]:
    """``{definition: {"k=<k>": {"all": metrics, "round <i>": metrics, ...}}}`` (`signal_metrics`) for
    every k of `ks` (None: the rows' ks; a k without rows has an "all" cell of no rounds)."""
    table: dict[str, dict[str, dict[str, Any]]] = {}
    for name in definitions:
        per_k = {}
        for k in sorted(set(ks) if ks is not None else {r.k for r in rows}):
            of_k = [r for r in rows if r.k == k]
            cells = {"all": signal_metrics(of_k, name, with_se=True)}
            for index in sorted({r.round_index for r in of_k}):
                cells[f"round {index}"] = signal_metrics([r for r in of_k if r.round_index == index], name)
            per_k[f"k={k}"] = cells
        table[name] = per_k
    return table


def _fmt(value: Optional[float], spec: str = "{:.3f}") -> str:
    return "n/a" if value is None else spec.format(value)


def _se(value: Optional[float]) -> str:
    return "" if value is None else f" ({value:.3f})"


def markdown_table(table: Mapping[str, Mapping[str, Mapping[str, Mapping[str, Any]]]]) -> str:
    """The signal table as markdown: one line per (k, definition, round split)."""
    lines = ["| k | definition | rounds | AUC keeps vs drops (bootstrap SE) | keeps / drops | "
             "within-group Spearman (groups) | pools with no spread (pools) | mean reward keeps / drops | "
             "Spearman with kept share (bootstrap SE; rounds) | AUC with a question pending (bootstrap SE; "
             "keeps / drops) |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    ks = sorted({k for per_k in table.values() for k in per_k}, key=lambda s: int(s.split("=")[1]))
    for k in ks:
        for name, per_k in table.items():
            for split, m in per_k.get(k, {}).items():
                lines.append(
                    f"| {k.split('=')[1]} | {name} | {split} | {_fmt(m['auc'])}{_se(m.get('auc_se'))} | "
                    f"{m['keeps']} / {m['drops']} | "
                    f"{_fmt(m['spearman'], '{:+.3f}')} ({m['spearman_groups']}) | {_fmt(m['no_spread'], '{:.2f}')} "
                    f"({m['pools']}) | {_fmt(m['mean_reward_keeps'], '{:.4f}')} / "
                    f"{_fmt(m['mean_reward_drops'], '{:.4f}')} | "
                    f"{_fmt(m['share_spearman'], '{:+.3f}')}{_se(m.get('share_spearman_se'))}; {m['graded_rounds']} | "
                    f"{_fmt(m['pending_auc'])}{_se(m.get('pending_auc_se'))}; "
                    f"{m['pending_keeps']} / {m['pending_drops']} |")
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------------
# definitions and the one reward adapter
# ------------------------------------------------------------------------------------------------
def definition_config(cfg: MempoConfig, overrides: Mapping[str, Any]) -> MempoConfig:
    """`cfg` with its ``scoring`` section reset to the library defaults except `SCORING_INHERITED`,
    then `overrides` (``{"section.field": value}``, values as Python objects) applied and the whole
    configuration validated again. ConfigError naming a key the configuration lacks or a bad value."""
    data = config_to_dict(cfg)
    data["scoring"] = {key: value for key, value in data["scoring"].items() if key in SCORING_INHERITED}
    for dotted, value in overrides.items():
        section, _, field = dotted.partition(".")
        if not field or "." in field or not isinstance(data.get(section), dict):
            raise ConfigError(dotted, "a definition's override must be 'section.field' of the configuration")
        data[section][field] = value
    return config_from_dict(data)


def definition_rewards(model: Any, tokenizer: Any, trajectories: Sequence[Trajectory],
                       cfg: MempoConfig) -> tuple[list[list[Optional[float]]], list[list[RoundMemoryReward]]]:
    """THE adapter: the memory reward of every scored round under ``cfg.scoring``, one list per
    trajectory aligned with its ``scored_rounds()`` (None: the definition leaves that round unscored),
    and each round's `RoundMemoryReward`: ``mempo.scoring.compute_memory_rewards(model, tokenizer,
    trajectories, cfg.scoring)``, the call `mempo.train.step.memory_rewards` makes."""
    rewards, details = compute_memory_rewards(model, tokenizer, trajectories, cfg.scoring)
    return [list(per_round) for per_round in rewards], details


#: The definition whose per-objective details `memory_read` reads (no threshold: every gold token counts).
READ_DEFINITION = "retrieved_log"


def memory_read(tokenizer: Any, trajectories: Sequence[Trajectory],
                details: Sequence[Sequence[RoundMemoryReward]]) -> dict[str, Any]:
    """Whether the model reads the answer off a ``<mem>`` in the scoring layout, whatever the reward's
    definition, from the per-objective details of `READ_DEFINITION` (`definition_rewards`): over the
    scored rounds with a retrieved objective and a keeps label, the median of min_j l_mem_j (the worst
    retrieved objective's mean gold log-prob after mem_ctx, in nats), apart for memories that keep
    every retrieved gold and those that drop one, with the counts. A model that reads its memory has
    keeps near 0 and drops well below."""
    worst: dict[bool, list[float]] = {True: [], False: []}
    for t, rounds in zip(trajectories, details):
        for item, keep in zip(rounds, t.memory_keeps(tokenizer) or [None] * len(rounds)):
            if keep is not None and item.objectives:
                worst[bool(keep)].append(min(item.objective_logp_mem[j] for j in item.objectives))

    def median(values: list[float]) -> Optional[float]:
        finite = [v for v in values if math.isfinite(v)]
        return statistics.median(finite) if finite else None
    return {"keeps": len(worst[True]), "drops": len(worst[False]),
            "median_worst_logp_mem_keeps": median(worst[True]), "median_worst_logp_mem_drops": median(worst[False])}


def round_rows(trajectories: Sequence[Trajectory], k: int, tokenizer: Any,
               rewards: Mapping[str, Sequence[Sequence[Optional[float]]]]) -> list[RoundRow]:
    """One `RoundRow` per scored round of every trajectory (`rewards`: per definition, as
    `definition_rewards` returns them), with its keeps, kept share and pending labels. ValueError
    when a definition's lists do not line up."""
    rows = []
    for i, t in enumerate(trajectories):
        scored = t.scored_rounds()
        keeps = t.memory_keeps(tokenizer) or [None] * len(scored)  # [] without golds
        shares = t.memory_kept_shares(tokenizer) or [None] * len(scored)
        objectives = len(objectives_from_golds(t.golds)) if t.golds is not None else None
        pending = ([len(seen) < objectives for seen in t.retrieved_objectives(tokenizer)] if objectives
                   else [None] * len(scored))
        for name, per_trajectory in rewards.items():
            if len(per_trajectory) != len(trajectories) or len(per_trajectory[i]) != len(scored):
                raise ValueError(f"definition {name!r}: its rewards do not line up with the scored rounds of "
                                 f"trajectory {t.uid}/{t.sample_index}")
        for j, (round_, keep) in enumerate(zip(scored, keeps)):
            rows.append(RoundRow(k, t.uid, t.sample_index, round_.index, keep,
                                 {name: (None if v[i][j] is None else float(v[i][j])) for name, v in rewards.items()},
                                 shares[j], pending[j]))
    return rows


# ------------------------------------------------------------------------------------------------
# held-out episodes and their rollouts, made once
# ------------------------------------------------------------------------------------------------
def held_out_episodes(world: Any, cfg: MempoConfig, ks: Sequence[int], questions: int) -> dict[int, list[Any]]:
    """The first `questions` episodes of each k of the demo's held-out split ``eval.split`` (module
    docstring). BenchError for a k outside ``eval.objectives``, more questions than the split holds
    per k (``eval.episodes`` / ``eval.validation_episodes``) or a validation split the demo did not
    hold out."""
    outside = [k for k in ks if k not in cfg.eval.objectives]
    if outside:
        raise BenchError(f"--ks: k={outside} is not among the demo's evaluation objectives "
                         f"{list(cfg.eval.objectives)} (eval.objectives), whose episodes alone are held out of SFT")
    field = "eval.episodes" if cfg.eval.split == "test" else "eval.validation_episodes"
    held = cfg.eval.episodes if cfg.eval.split == "test" else cfg.eval.validation_episodes
    if questions > held:
        raise BenchError(f"--questions {questions}: the demo held out {held} {cfg.eval.split} episodes per k "
                         f"({field}); ask for at most that many")
    drawn = eval_episodes(world, cfg)  # exactly the demo's draw of that split: held out of its SFT
    return {k: drawn[k][:questions] for k in ks}


def sft_subjects_shared(world: Any, cfg: MempoConfig, asked: Mapping[int, Sequence[Any]]) -> Optional[int]:
    """How many hop subjects of the `asked` episodes an SFT (cold-start) episode of this configuration
    asks about: the demo's draw (`mempo.synthetic.heldout.training_episodes`, ``synthetic.oracle_objectives``
    x ``oracle_episodes``, seed `sft_question_seed`, both splits' subjects held out). 0 unless the
    demo changed; None without ``oracle_objectives``."""
    s = cfg.synthetic
    if s.oracle_objectives is None:
        return None
    held = held_out_of_training(world, cfg)
    sft = held_out_subjects([e for k in s.oracle_objectives
                             for e in training_episodes(world, int(k), s.oracle_episodes,
                                                        sft_question_seed(cfg.data.seed, k), held)])
    return len(held_out_subjects(asked) & sft)


def model_digest(model_dir: Path) -> str:
    """`mempo.utils.digest.weights_digest` of the model directory (BenchError when it has no weights)."""
    try:
        return weights_digest(model_dir)
    except ValueError as exc:
        raise BenchError(str(exc)) from exc


def rollout_backend(cfg: MempoConfig, model: Any, tokenizer: Any, model_dir: Path) -> Any:
    """The generation backend of training rollouts (`build_backend`, ``rollout.backend``), through the
    answer-blind `ProtocolScaffold` when ``rollout.protocol_scaffold`` is on, as the trainer builds it;
    an SGLang backend loads `model_dir`."""
    processors = [ProtocolScaffold(tokenizer, turns=min(cfg.rollout.max_turns, 3))] if cfg.rollout.protocol_scaffold \
        else []
    return build_backend(cfg, model, tokenizer, model_path=str(model_dir), logits_processors=processors)


def rollout_setting(k: int, episodes: Sequence[Any], samples: int, seed: int, chunk: int, digest: str,
                    rollout_cfg: Any, backend: Any) -> dict[str, Any]:
    """What a saved rollout file was made with (`ROLLOUT_KEY_FIELDS`)."""
    return {"format": ROLLOUT_FORMAT, "k": k, "episode_ids": [e.id for e in episodes], "samples": samples,
            "seed": seed, "chunk": chunk, "model_sha256": digest, "rollout": dataclasses.asdict(rollout_cfg),
            "backend": getattr(backend, "name", type(backend).__name__)}


def rollouts(backend: Any, model: Any, tokenizer: Any, cfg: MempoConfig, retriever: Any, k: int,
             episodes: Sequence[Any], *, out: Path, setting: dict[str, Any], reroll: bool, chunk: int,
             log=print) -> tuple[list[Trajectory], dict[str, Any]]:
    """The scored trajectories of `episodes` (``samples`` each), read from ``<out>/rollouts_k<k>.jsonl``
    when its setting matches `setting`, else rolled out (`RolloutEngine`, the ``rollout`` section,
    engine seed ``setting["seed"]``, `chunk` episodes per engine run) and saved. BenchError for saved
    rollouts of another setting unless `reroll`. Returns (trajectories, facts of how they were made)."""
    path, meta_path = out / f"rollouts_k{k}.jsonl", out / f"rollouts_k{k}.json"
    if path.is_file() and meta_path.is_file():
        saved = json.loads(meta_path.read_text())
        differing = [f for f in ROLLOUT_KEY_FIELDS if saved.get(f) != setting.get(f)]
        if not differing:
            trajectories = read_trajectories_jsonl(path)
            expected = [e.id for e in episodes for _ in range(setting["samples"])]
            if [t.uid for t in trajectories] != expected:
                raise BenchError(f"{path}: its trajectories are not the {len(expected)} its setting says "
                                 "(a damaged file?); use --reroll to roll out again")
            log(f"k={k}: {len(trajectories)} saved trajectories reused ({path})")
            return trajectories, {**saved, "reused": True}
        if not reroll:
            raise BenchError(f"{path} holds rollouts of another setting ({', '.join(differing)} differ); use another "
                             "--out, or --reroll to replace them")
    meta_path.unlink(missing_ok=True)  # no setting names a file being replaced
    rollout_cfg = cfg.rollout
    log(f"k={k}: rolling out {len(episodes)} episodes x {rollout_cfg.group_size} samples ({setting['backend']})")
    engine = RolloutEngine(backend, tokenizer, build_tools(cfg, retriever),
                           config=rollout_cfg, seed=setting["seed"],
                           max_context_tokens=getattr(model.config, "max_position_embeddings", None))
    began = time.perf_counter()
    trajectories: list[Trajectory] = []
    for i in range(0, len(episodes), chunk):
        trajectories.extend(score_outcomes(engine.run(list(episodes[i:i + chunk])), mode=rollout_cfg.score_mode))
        log(f"k={k}: rolled out {min(i + chunk, len(episodes))}/{len(episodes)} episodes "
            f"({time.perf_counter() - began:.0f} s)")
    write_trajectories_jsonl(path, trajectories)
    meta = {**setting, "seconds": time.perf_counter() - began, "created": time.strftime("%Y-%m-%dT%H:%M:%S")}
    replace_file_atomically(meta_path, json.dumps(meta, indent=2) + "\n")
    return trajectories, {**meta, "reused": False}


# ------------------------------------------------------------------------------------------------
# the benchmark
# ------------------------------------------------------------------------------------------------
def run(demo_out: Path, out: Path, *, model_name: str = "model_sft", questions: int = 32, samples: int = 8,
        ks: Sequence[int] = (2, 4), definitions: Sequence[str] = tuple(DEFINITIONS), seed: Optional[int] = None,
        reroll: bool = False,
        chunk: int = 8, device: str = "cpu", overrides: Sequence[str] = (), backend: Any = None,
        log=print) -> dict[str, Any]:
    """Roll out (or reuse) and measure every definition (module docstring); writes the outputs and
    returns the results. model_name: the model's folder in `demo_out` (model_sft; model_rl after RL).
    backend: the generation backend (None: the model's, `rollout_backend`; tests
    pass `mempo.synthetic.backend.OracleBackend` for rollouts whose ``<mem>`` blocks keep and drop)."""
    if questions < 1 or samples < 1 or chunk < 1:
        raise BenchError(f"--questions, --samples and --chunk must be >= 1, got {questions}, {samples}, {chunk}")
    unknown = [name for name in definitions if name not in DEFINITIONS]
    if unknown:
        raise BenchError(f"--definitions: unknown {unknown}; known: {list(DEFINITIONS)}")
    fixed = [o for o in overrides if o.split("=", 1)[0].strip().split(".")[0] in FIXED_SECTIONS
             and o.split("=", 1)[0].strip() not in FREE_FIELDS]
    if fixed:
        raise BenchError(f"{', '.join(fixed)}: the {'/'.join(FIXED_SECTIONS)} sections fix the world and the "
                         "held-out episodes the demo's SFT model was made with; they cannot be overridden here "
                         f"(but {', '.join(FREE_FIELDS)})")
    model_dir = demo_out / model_name
    if not (demo_out / "config.yaml").is_file() or not model_dir.is_dir():
        raise BenchError(f"{demo_out}: not a demo output with {model_name}/ (config.yaml and {model_name}/ "
                         "are needed; run mempo demo)")
    cfg = load_config(demo_out / "config.yaml", list(overrides))
    seed = int(cfg.rollout.seed if seed is None else seed)
    cfg = dataclasses.replace(cfg, rollout=dataclasses.replace(cfg.rollout, group_size=samples, seed=seed))
    configs = {name: definition_config(cfg, DEFINITIONS[name]) for name in definitions}  # bad ones fail first
    env = build_world(cfg)
    episodes_by_k = held_out_episodes(env.world, cfg, ks, questions)
    log(f"split: {cfg.eval.split} (the first {questions} of its episodes per k)")
    asked = {q for eps in episodes_by_k.values() for e in eps for q in e.questions}
    shared = sft_subjects_shared(env.world, cfg, episodes_by_k)
    tokenizer = pretrained_tokenizer(model_dir)
    model = pretrained_causal_lm(model_dir).to(device)
    model.eval()
    digest = model_digest(model_dir)
    backend = backend if backend is not None else rollout_backend(cfg, model, tokenizer, model_dir)
    out.mkdir(parents=True, exist_ok=True)
    began = time.perf_counter()
    rows: list[RoundRow] = []
    made: dict[str, Any] = {}
    seconds: dict[str, float] = defaultdict(float)
    for k, episodes in episodes_by_k.items():
        setting = rollout_setting(k, episodes, samples, seed, chunk, digest, cfg.rollout, backend)
        trajectories, facts = rollouts(backend, model, tokenizer, cfg, env.retriever, k, episodes, out=out,
                                       setting=setting, reroll=reroll, chunk=chunk, log=log)
        made[f"k={k}"] = {"trajectories": len(trajectories), "reused": facts["reused"],
                          "rollout_seconds": facts.get("seconds"),
                          "em": statistics.fmean(float(t.outcome.get("em", 0.0)) for t in trajectories),
                          "scored_rounds": sum(len(t.scored_rounds()) for t in trajectories)}
        rewards, details = {}, {}
        for name in definitions:
            start = time.perf_counter()
            rewards[name], details[name] = definition_rewards(model, tokenizer, trajectories, configs[name])
            seconds[name] += time.perf_counter() - start
            log(f"k={k}: {name} scored ({time.perf_counter() - start:.0f} s)")
        rows.extend(round_rows(trajectories, k, tokenizer, rewards))
        if READ_DEFINITION not in details:  # scored once more only when the run left that definition out
            details[READ_DEFINITION] = definition_rewards(
                model, tokenizer, trajectories, definition_config(cfg, DEFINITIONS[READ_DEFINITION]))[1]
        made[f"k={k}"]["memory_read"] = memory_read(tokenizer, trajectories, details[READ_DEFINITION])
    write_jsonl(out / "rounds.jsonl", (dataclasses.asdict(r) for r in rows))
    table = signal_table(rows, definitions, ks)
    results = {
        "demo_out": str(demo_out), "model": model_name, "model_sha256": digest, "questions": questions,
        "samples": samples,
        "ks": list(ks), "seed": seed, "definitions": {name: DEFINITIONS[name] for name in definitions},
        "scoring": {name: dataclasses.asdict(configs[name].scoring) for name in definitions},
        "split": cfg.eval.split,
        "held_out": {"episodes": "the first --questions of mempo.eval.eval_episodes(world, demo config) per k",
                     "eval_episodes_per_k": cfg.eval.episodes,
                     "validation_episodes_per_k": cfg.eval.validation_episodes, "questions": len(asked),
                     "subjects_in_sft_episodes": shared},
        "rollouts": made, "scoring_seconds": dict(seconds), "seconds": time.perf_counter() - began,
        "machine": machine_facts(), "device": device,
        "signal": table, "table": markdown_table(table),
    }
    replace_file_atomically(out / "results.json", json.dumps(results, indent=2) + "\n")
    replace_file_atomically(out / "results.md", "\n".join(setting_lines(results)) + "\n\n" + results["table"] + "\n")
    return results


def setting_lines(results: Mapping[str, Any]) -> list[str]:
    """What the table was measured on, for the lines above it: episodes, samples, model, rollouts,
    definitions, machine."""
    machine = results["machine"]
    def read(m: Mapping[str, Any]) -> str:
        r = m.get("memory_read")
        if not r:
            return ""
        return (f", median worst-objective log P(gold | mem) {_fmt(r['median_worst_logp_mem_keeps'], '{:.2f}')} "
                f"for memories that keep every retrieved gold ({r['keeps']}), "
                f"{_fmt(r['median_worst_logp_mem_drops'], '{:.2f}')} for those that drop one ({r['drops']})")
    made = "; ".join(f"{k}: {m['trajectories']} trajectories, {m['scored_rounds']} scored rounds, rollout EM "
                     f"{m['em']:.3f}{read(m)}" for k, m in results["rollouts"].items())
    return [f"{results['questions']} held-out {results.get('split', 'test')} episodes x {results['samples']} samples "
            f"per k (rollout seed "
            f"{results['seed']}) from `{results['demo_out']}/{results.get('model', 'model_sft')}` (weights sha256 "
            f"{results['model_sha256'][:12]}); {made}. Questions of these episodes in SFT episodes: "
            f"{results['held_out']['subjects_in_sft_episodes']}.",
            "Definitions (overrides on the library's scoring defaults): " +
            ", ".join(f"`{name}` {json.dumps(o)}" for name, o in results["definitions"].items()) + ".",
            f"Machine: {machine.get('cpu_count')} CPUs, {machine.get('platform')}, device {results['device']}; "
            f"{results['seconds']:.0f} s."]


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--demo-out", type=Path, default=Path("demo_out"))
    parser.add_argument("--out", type=Path, default=Path("bench_signal_out"))
    parser.add_argument("--model", default="model_sft", help="the model folder in --demo-out (model_rl: after RL)")
    parser.add_argument("--questions", type=int, default=32, help="held-out episodes per k")
    parser.add_argument("--samples", type=int, default=8, help="samples per episode (G)")
    parser.add_argument("--ks", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--definitions", nargs="+", default=list(DEFINITIONS), choices=list(DEFINITIONS))
    parser.add_argument("--seed", type=int, default=None, help="rollout seed (default: the config's rollout.seed)")
    parser.add_argument("--chunk", type=int, default=8, help="episodes per rollout engine run")
    parser.add_argument("--reroll", action="store_true", help="replace saved rollouts of another setting")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    overrides, rest = split_overrides(sys.argv[1:] if argv is None else argv)
    args = parser.parse_args(rest)
    keep_freed_memory()  # the demo's allocator setting: bit-identical floats, faster steps
    if args.threads:
        torch.set_num_threads(args.threads)
    try:
        results = run(args.demo_out, args.out, model_name=args.model, questions=args.questions,
                      samples=args.samples, ks=args.ks,
                      definitions=args.definitions, seed=args.seed, reroll=args.reroll, chunk=args.chunk,
                      device=args.device, overrides=overrides, log=lambda line: print(line, flush=True))
    except MempoError as error:
        print(f"bench_signal: {error}", file=sys.stderr)
        return 2
    print(results["table"])
    print(f"{results['seconds']:.0f} s; {args.out / 'results.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
