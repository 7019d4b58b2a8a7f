"""Execution 7's rules as code (protocol: docs/experiments/E7-ablation-execution-7.md, written before any run),
executions 8-10's too (docs/experiments/E8-*.md to E10-*.md: the same rules on other recipes' files; E10 gates
seeds 0-11):
the SFT gate, the definition chosen on the validation split, the signal check, the pooled estimate and the
decision rule. `run.sh` calls it between its phases; every rule reads only files kept in this folder.

    python bench/learning_runs7/ex7.py gate [DIR]      # the gate's state (JSON)
    python bench/learning_runs7/ex7.py next [DIR]      # the SFT seeds to run next ("" once the gate is settled)
    python bench/learning_runs7/ex7.py models [DIR]    # the gated seeds; exit 3 when fewer than 3 passed
    python bench/learning_runs7/ex7.py same-weights KEPT.jsonl REMADE.jsonl  # a remade SFT model is the kept one
    python bench/learning_runs7/ex7.py choose [DIR]    # the definition (best.txt) and the signal check (signal.json)
    python bench/learning_runs7/ex7.py summary [DIR]   # the tables, the pooled estimate, the decision, the plot
                                                       # (or, with fewer than 3 gated models, the gate's table)

DIR: the folder of an execution's files (default this one; ``learning_runs<N>`` holds execution N's):
``sft_s<seed>.jsonl`` (`tools/sft_seeds.py` rows),
``signal_s<seed>/results.json`` (`bench/bench_signal.py` on the validation split), ``m<seed>/<arm>_s<s>.json``
(`bench/bench_learning.py` run files, the test split).
"""
from __future__ import annotations

import json
import math
import re
import statistics
import sys
from pathlib import Path
from typing import Any, Mapping, Optional, Sequence

#: The SFT seeds, in the order they are run and gated (the recipe is run.sh's CONFIG).
SFT_SEEDS = (0, 1, 2, 3, 4, 5)
#: Executions that gate other seeds (`sft_seeds`): E10 is E9's gate extended to seeds 0-11
#: (docs/experiments/E10-ablation-execution-10.md; its folder holds E9's six rows).
SFT_SEEDS_BY_EXECUTION = {"10": tuple(range(12))}
#: How many gated SFT models the execution uses (the lowest-numbered seeds that pass the gate).
MODELS = 3
#: The SFT gate: greedy EM at k = GATE_K on the validation split's 128 episodes, after SFT, at least GATE_EM.
GATE_K, GATE_EM = 8, 0.2
#: The signal benchmark's definitions, in the order ties go by (after fewer overrides).
CANDIDATES = ("paper", "paper_nothresh", "retrieved_min_c10", "complete_min_c10", "all_fixes_min_c10")
#: Overrides per candidate (bench/bench_signal.py's DEFINITIONS; a tie goes to fewer).
OVERRIDES = {"paper": 0, "paper_nothresh": 1, "retrieved_min_c10": 5, "complete_min_c10": 5, "all_fixes_min_c10": 6}
SIGNAL_KS = (4, 8)
#: A pending-round AUC is judged only with at least this many keeping and dropping rounds (S4's rule).
JUDGEABLE = 20
#: The decision rule's numbers (issue 44).
MIN_GAIN, GRPO_EM_RANGE, PRIMARY_K = 0.03, (0.15, 0.8), 8
#: A MemPO run collapsed when more than this share of its answered k = 8 episodes answered with a question
#: pending while its GRPO pair's share was at most this (execution 5's failure: answering after one search).
COLLAPSE_SHARE = 0.5
ARM_GRPO = "grpo"


def execution(folder: Path) -> str:
    """The execution a folder holds: N of ``learning_runs<N>`` (this folder: "7"), "7" for any other name."""
    match = re.fullmatch(r"learning_runs(\d+)", Path(folder).resolve().name)
    return match.group(1) if match else "7"


def sft_seeds(folder: Path) -> tuple[int, ...]:
    """The SFT seeds the execution of `folder` gates, in order: SFT_SEEDS unless SFT_SEEDS_BY_EXECUTION names others."""
    return SFT_SEEDS_BY_EXECUTION.get(execution(folder), SFT_SEEDS)


# ------------------------------------------------------------------------------------------------
# statistics: Student's t without scipy
# ------------------------------------------------------------------------------------------------
def _betacf(a: float, b: float, x: float) -> float:
    """The continued fraction of the regularised incomplete beta function (Lentz's method)."""
    tiny, qab, qap, qam = 1e-300, a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 400):
        m2 = 2 * m
        for aa in (m * (b - m) * x / ((qam + m2) * (a + m2)), -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))):
            d = 1.0 + aa * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + aa / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1.0) < 1e-15:
            break
    return h


def _betainc(a: float, b: float, x: float) -> float:
    """The regularised incomplete beta function I_x(a, b), x in [0, 1]."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x))
    if x < (a + 1.0) / (a + b + 2.0):
        return front * _betacf(a, b, x) / a
    return 1.0 - front * _betacf(b, a, 1.0 - x) / b


def t_cdf(t: float, df: float) -> float:
    """P(T <= t) for Student's t with `df` > 0 degrees of freedom."""
    tail = 0.5 * _betainc(df / 2.0, 0.5, df / (df + t * t))
    return 1.0 - tail if t >= 0 else tail


def t_quantile(p: float, df: float) -> float:
    """The `p` quantile (0 < p < 1) of Student's t with `df` degrees of freedom (bisection on `t_cdf`)."""
    if not 0.0 < p < 1.0 or df <= 0:
        raise ValueError(f"need 0 < p < 1 and df > 0, got p={p}, df={df}")
    lo, hi = -1e6, 1e6
    for _ in range(200):
        mid = (lo + hi) / 2.0
        lo, hi = (mid, hi) if t_cdf(mid, df) < p else (lo, mid)
    return (lo + hi) / 2.0


def mean_se(values: Sequence[float]) -> tuple[float, Optional[float]]:
    """(mean, sample std / sqrt(n)); SE None with one value."""
    mean = statistics.fmean(values)
    return mean, (statistics.stdev(values) / math.sqrt(len(values)) if len(values) > 1 else None)


def pooled(estimates: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The pooled paired difference over models, each counting the same: ``mean`` = the mean of the models'
    means ``d``; ``se`` = sqrt(sum se^2) / M; the 95 % interval mean -+ t(0.975, df) se with df by
    Welch-Satterthwaite from the models' ``se`` and ``n`` (seeds): df = (sum se^2)^2 / sum(se^4 / (n - 1)).
    Also the between-model spread (Cochran's Q on M - 1 df). ValueError with no model or an SE missing."""
    if not estimates or any(e["se"] is None or e["n"] < 2 for e in estimates):
        raise ValueError("each model needs a mean, an SE and at least 2 seeds")
    m = len(estimates)
    mean = statistics.fmean(e["d"] for e in estimates)
    var = sum(e["se"] ** 2 for e in estimates)
    se = math.sqrt(var) / m
    fourth = sum(e["se"] ** 4 / (e["n"] - 1) for e in estimates)
    df = var * var / fourth if fourth > 0 else float(sum(e["n"] - 1 for e in estimates))
    half = t_quantile(0.975, df) * se
    weights = [1.0 / e["se"] ** 2 if e["se"] > 0 else None for e in estimates]
    q = None
    if all(w is not None for w in weights):
        fixed = sum(w * e["d"] for w, e in zip(weights, estimates)) / sum(weights)
        q = sum(w * (e["d"] - fixed) ** 2 for w, e in zip(weights, estimates))
    return {"models": m, "mean": mean, "se": se, "df": df, "low": mean - half, "high": mean + half,
            "cochran_q": q, "q_df": m - 1}


# ------------------------------------------------------------------------------------------------
# the SFT gate
# ------------------------------------------------------------------------------------------------
def sft_rows(folder: Path) -> dict[int, dict[str, Any]]:
    """``{seed: row}`` of the recipe's SFT seeds (``sft_s<seed>.jsonl``, the last row of each file)."""
    rows = {}
    for path in sorted(folder.glob("sft_s*.jsonl")):
        lines = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        if lines:
            rows[int(lines[-1]["seed"])] = lines[-1]
    return rows


def folder_gate(folder: Path) -> dict[str, Any]:
    """`gate` of the SFT rows kept in `folder`, over the seeds its execution gates (`sft_seeds`)."""
    return gate(sft_rows(folder), sft_seeds(folder))


def passes_gate(row: Mapping[str, Any]) -> bool:
    """The SFT gate: the row was evaluated on the validation split and its greedy EM at k = GATE_K is at
    least GATE_EM. ValueError for a row of the test split or without that k (not this protocol's)."""
    if row.get("split") != "validation" or f"em_k{GATE_K}" not in row:
        raise ValueError(f"seed {row.get('seed')}: not a validation-split row with em_k{GATE_K} (the gate reads those)")
    return float(row[f"em_k{GATE_K}"]) >= GATE_EM


def gate(rows: Mapping[int, Mapping[str, Any]], seeds: Sequence[int] = SFT_SEEDS) -> dict[str, Any]:
    """The gated models: the MODELS lowest of `seeds` (in order; a folder's: `folder_gate`) that pass, once every
    lower seed is judged.
    ``models``: those seeds (complete when MODELS of them); ``next``: the seeds to run next (the lowest
    not yet run, two at a time; [] when the gate is settled); ``settled``: True when the models are known,
    or when MODELS passes can no longer be reached even if every unjudged seed passed (E8's amendment A2;
    every seed having run is one case): then fewer than MODELS passed and the execution is not a test."""
    models, judged = [], []
    for seed in seeds:
        if seed not in rows:
            break
        judged.append(seed)
        if passes_gate(rows[seed]):
            models.append(seed)
        if len(models) == MODELS:
            return {"models": models, "judged": judged, "next": [], "settled": True}
    remaining = [s for s in seeds if s not in rows]
    if len(models) + len(seeds) - len(judged) < MODELS:  # the unjudged seeds cannot make up MODELS passes
        return {"models": models, "judged": judged, "next": [], "settled": True}
    return {"models": models, "judged": judged, "next": remaining[:2], "settled": False}


# ------------------------------------------------------------------------------------------------
# the definition, chosen on the validation split, and the signal check
# ------------------------------------------------------------------------------------------------
def cell(signal: Mapping[str, Any], definition: str, k: int) -> Mapping[str, Any]:
    """The ``all`` cell of `definition` at k in a bench_signal results.json (KeyError when missing)."""
    return signal["signal"][definition][f"k={k}"]["all"]


def choose(signals: Mapping[int, Mapping[str, Any]]) -> dict[str, Any]:
    """The definition of the MemPO arm: among CANDIDATES, the highest mean over the gated models and k in
    SIGNAL_KS of ``share_spearman`` (the graded label: the reward's rank correlation with the share of
    the retrieved facts a ``<mem>`` keeps), on the validation split; a definition without that value in
    some cell is not eligible; ties go to fewer overrides, then the CANDIDATES order. ValueError when a
    results file is not of the validation split or none is eligible."""
    for seed, signal in signals.items():
        if signal.get("split") != "validation":
            raise ValueError(f"signal of seed {seed}: not measured on the validation split")
    scores = {}
    for name in CANDIDATES:
        values = [cell(signals[s], name, k).get("share_spearman") for s in signals for k in SIGNAL_KS]
        if values and all(v is not None for v in values):
            scores[name] = statistics.fmean(values)
    if not scores:
        raise ValueError("no candidate definition has a graded Spearman in every model and k")
    best = max(scores, key=lambda n: (round(scores[n], 12), -OVERRIDES[n], -CANDIDATES.index(n)))
    return {"best": best, "scores": scores}


def signal_present(signal: Mapping[str, Any], definition: str) -> dict[str, Any]:
    """Whether `definition` carries a memory signal on this model at k = 8 (validation): its graded Spearman
    minus 2 bootstrap SE above 0, and, where the pending rounds are judgeable (at least JUDGEABLE keeping
    and dropping ones), its AUC on them minus 2 SE above 0.5."""
    c = cell(signal, definition, PRIMARY_K)
    rho, rho_se = c.get("share_spearman"), c.get("share_spearman_se")
    graded = rho is not None and rho_se is not None and rho - 2 * rho_se > 0
    judgeable = c.get("pending_keeps", 0) >= JUDGEABLE and c.get("pending_drops", 0) >= JUDGEABLE
    auc, auc_se = c.get("pending_auc"), c.get("pending_auc_se")
    pending = (not judgeable) or (auc is not None and auc_se is not None and auc - 2 * auc_se > 0.5)
    return {"present": bool(graded and pending), "share_spearman": rho, "share_spearman_se": rho_se,
            "pending_auc": auc, "pending_auc_se": auc_se, "pending_judgeable": judgeable}


# ------------------------------------------------------------------------------------------------
# the runs, the primary metric and the decision
# ------------------------------------------------------------------------------------------------
def load_runs(folder: Path) -> list[dict[str, Any]]:
    """Every run file (``<arm>_s<seed>.json``) of one model's folder."""
    return [json.loads(p.read_text()) for p in sorted(folder.glob("*_s*.json"))]


def model_estimate(runs: Sequence[Mapping[str, Any]], arm: str, k: int = PRIMARY_K) -> dict[str, Any]:
    """One model's paired EM difference `arm` - grpo at k over the seeds both ran: ``d`` (mean), ``se``,
    ``n``, ``per_seed``, ``ahead`` (d > 0 and d >= 2 SE), GRPO's mean EM there, and the collapsed seeds
    (`collapsed`)."""
    by = {(r["arm"], r["seed"]): r for r in runs}
    seeds = sorted(s for (a, s) in by if a == arm and (ARM_GRPO, s) in by)
    per_seed = {s: by[(arm, s)]["rows"][str(k)]["em"] - by[(ARM_GRPO, s)]["rows"][str(k)]["em"] for s in seeds}
    if not per_seed:
        return {"d": None, "se": None, "n": 0, "per_seed": {}, "ahead": False, "grpo_em": None, "collapsed": []}
    d, se = mean_se(list(per_seed.values()))
    grpo_em = statistics.fmean(by[(ARM_GRPO, s)]["rows"][str(k)]["em"] for s in seeds)
    ahead = se is not None and d > 0 and d >= 2 * se
    return {"d": d, "se": se, "n": len(seeds), "per_seed": per_seed, "ahead": ahead, "grpo_em": grpo_em,
            "collapsed": [s for s in seeds if collapsed(by[(arm, s)], by[(ARM_GRPO, s)], k)]}


def collapsed(run: Mapping[str, Any], grpo: Mapping[str, Any], k: int = PRIMARY_K) -> bool:
    """A MemPO run collapsed: at k, more than COLLAPSE_SHARE of its answered episodes answered with a
    question pending while its GRPO pair's share was at most that (None shares: no collapse seen)."""
    mine, theirs = run["rows"][str(k)].get("answered_pending"), grpo["rows"][str(k)].get("answered_pending")
    return mine is not None and mine > COLLAPSE_SHARE and (theirs is None or theirs <= COLLAPSE_SHARE)


def valid_for_negative(model: Mapping[str, Any]) -> bool:
    """A model "does not help" may read (step 10): its signal present and GRPO's k = 8 EM within GRPO_EM_RANGE."""
    return bool(model["signal"]) and model["grpo_em"] is not None and \
        GRPO_EM_RANGE[0] <= model["grpo_em"] <= GRPO_EM_RANGE[1]


def decide(models: Mapping[int, Mapping[str, Any]]) -> dict[str, Any]:
    """The decision rule (issue 44), from each gated model's `model_estimate` at k = 8 plus ``signal``
    (`signal_present`'s ``present``):

    * **helps**: MemPO ahead of GRPO (>= 2 paired SE) on at least 2 of the 3 models, the pooled gain
      (`pooled`, all 3 models) at least MIN_GAIN with its 95 % interval above 0, and no MemPO run
      collapsed (`collapsed`);
    * **does not help**: on the valid models (signal present, GRPO's k = 8 EM within GRPO_EM_RANGE), at
      least 2 of them, the pooled interval's upper end below MIN_GAIN;
    * **not a test**: anything else (fewer than 3 gated models included), reported as such."""
    if len(models) < MODELS:
        return {"outcome": "not a test", "why": f"{len(models)} gated SFT models, fewer than {MODELS}"}
    ahead = [s for s, m in models.items() if m["ahead"]]
    collapses = {s: m["collapsed"] for s, m in models.items() if m["collapsed"]}
    everything = pooled(list(models.values()))
    valid = [s for s, m in models.items() if valid_for_negative(m)]
    facts = {"ahead": ahead, "collapsed": collapses, "pooled": everything, "valid": valid}
    if len(ahead) >= 2 and everything["mean"] >= MIN_GAIN and everything["low"] > 0 and not collapses:
        return {"outcome": "helps", **facts}
    if len(valid) >= 2:
        facts["pooled_valid"] = pooled([models[s] for s in valid])
        if facts["pooled_valid"]["high"] < MIN_GAIN:
            return {"outcome": "does not help", **facts}
    return {"outcome": "not a test", **facts}


def reachable(models: Mapping[int, Mapping[str, Any]], finished: Sequence[int]) -> set[str]:
    """The outcomes of `decide` the runs left can still give (E10's amendment A3), from each gated model's
    `model_estimate` at k = 8 plus ``signal``; a model not in ``finished`` may still come out ahead and, with a
    signal, valid for a negative. "not a test" is always reachable, so the decision is settled there once
    this is the only one."""
    outcomes = {"not a test"}
    if len(models) < MODELS:
        return outcomes
    unfinished = [s for s in models if s not in finished]
    ahead = [s for s in finished if models[s]["ahead"]]
    valid = [s for s in finished if valid_for_negative(models[s])]
    if len(ahead) + len(unfinished) >= 2:
        outcomes.add("helps")
    if len(valid) + sum(1 for s in unfinished if models[s]["signal"]) >= 2:
        outcomes.add("does not help")
    return outcomes


# ------------------------------------------------------------------------------------------------
# the command line
# ------------------------------------------------------------------------------------------------
def _best(folder: Path) -> str:
    return (folder / "best.txt").read_text().strip()


def _summary(folder: Path) -> str:
    """The tables (per model and pooled, every k), the monitors, the decision; the plot ``ablation_e<N>.png``.
    When fewer than MODELS seeds passed the settled gate: the gate's table and plot, decision "not a test"; before
    the gated models' signal benchmarks are chosen on (no ``signal.json``): the gate's table so far, "unfinished"."""
    rows = sft_rows(folder)
    state = gate(rows, sft_seeds(folder))
    if (state["settled"] and len(state["models"]) < MODELS) or not (folder / "signal.json").is_file():
        return _gate_summary(folder, rows, state)
    gated = json.loads((folder / "signal.json").read_text())
    best = _best(folder)
    arm = f"mempo_{best}"
    lines = [f"Execution {execution(folder)}: arms grpo and {arm}; models (SFT seeds) {gated['models']}.", "",
             "| model | k | grpo EM | MemPO EM | paired diff (mean ± SE, n) | ahead | grpo / MemPO turns | "
             "answered pending grpo / MemPO | memory / full tokens grpo / MemPO |",
             "|---|---|---|---|---|---|---|---|---|"]
    estimates, by_model = {}, {}
    for seed in gated["models"]:
        runs = load_runs(folder / f"m{seed}")
        by_model[seed] = runs
        for k in (2, 4, 8):
            e = model_estimate(runs, arm, k)
            if k == PRIMARY_K:
                estimates[seed] = {**e, "signal": gated["signal"][str(seed)]["present"]}

            def arm_mean(name: str, metric: str) -> str:
                values = [r["rows"][str(k)].get(metric) for r in runs if r["arm"] == name]
                values = [v for v in values if v is not None]
                return f"{statistics.fmean(values):.3f}" if values else "-"
            se = "-" if e["se"] is None else f"{e['se']:.3f}"
            d = "-" if e["d"] is None else f"{e['d']:+.3f}"
            lines.append(f"| {seed} | {k} | {arm_mean(ARM_GRPO, 'em')} | {arm_mean(arm, 'em')} | {d} ± {se} "
                         f"({e['n']}) | {'yes' if e['ahead'] else 'no'} | {arm_mean(ARM_GRPO, 'turns')} / "
                         f"{arm_mean(arm, 'turns')} | {arm_mean(ARM_GRPO, 'answered_pending')} / "
                         f"{arm_mean(arm, 'answered_pending')} | {arm_mean(ARM_GRPO, 'token_ratio')} / "
                         f"{arm_mean(arm, 'token_ratio')} |")
    # a model is finished when the runner kept its results.json (after its last pair), not at a count of pairs
    done = [s for s in gated["models"] if (folder / f"m{s}" / "results.json").is_file()]
    finished = len(done) == len(gated["models"])
    lines.append("")
    for k in (2, 4, 8):
        if finished:
            p = pooled([model_estimate(by_model[s], arm, k) for s in gated["models"]])
            q = "-" if p["cochran_q"] is None else f"{p['cochran_q']:.2f}"
            lines.append(f"Pooled at k = {k} ({p['models']} models): {p['mean']:+.3f} ± {p['se']:.3f}, 95 % "
                         f"interval [{p['low']:+.3f}, {p['high']:+.3f}] (df {p['df']:.1f}); Cochran's Q {q} on "
                         f"{p['q_df']} df.")
    if finished:
        decision = decide(estimates)
    elif reachable(estimates, done) == {"not a test"}:
        decision = {"outcome": "not a test", "why": f"settled with models {done} finished (E10's amendment A3): "
                    "no runs left can make the memory reward help or not help", "finished": done}
    else:
        decision = {"outcome": "unfinished", "why": "runs missing", "finished": done}
    lines += ["", f"Decision: **{decision['outcome']}**", "", "```", json.dumps(decision, indent=1, default=str), "```"]
    _plot(folder, estimates, by_model, arm)
    return "\n".join(lines)


def _gate_summary(folder: Path, rows: Mapping[int, Mapping[str, Any]], state: Mapping[str, Any]) -> str:
    """The SFT gate's table (every judged seed of `rows`: greedy EM at k = 2, 4, 8 on validation, the k = GATE_K
    diagnostics) and `decide`'s "not a test" once the gate is settled with fewer than MODELS (step 1 of the
    protocol), else "unfinished" with what runs next; the plot ``gate_e<N>.png``."""
    failed = state["settled"] and len(state["models"]) < MODELS
    head = (f"Execution {execution(folder)}: {len(state['models'])} of SFT seeds {state['judged']} passed the gate "
            f"(greedy EM >= {GATE_EM} at k = {GATE_K} on the validation split)")
    if failed:
        unrun = [s for s in sft_seeds(folder) if s not in rows]
        head += f", fewer than {MODELS}: no RL run."
        if unrun:
            head += (f" SFT seeds {unrun} were not run: with every one of them passing the gate would still have "
                     f"fewer than {MODELS} (E8's amendment A2).")
    elif not state["settled"]:
        head += f" so far; SFT seeds {state['next']} run next (partial: step 12)."
    else:
        head += "; the signal benchmarks and the definition's choice run next (partial: step 12)."
    lines = [head, "",
             "| SFT seed | EM k = 2 | EM k = 4 | EM k = 8 (± SE) | format k = 8 | turns k = 8 | last `<mem>` keeps the "
             "gold, k = 8 | right by answer position, k = 8 | copy loss (last 50) | copy steps | SFT loss (last) | "
             "passes |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for seed in state["judged"]:
        r = rows[seed]
        positions = " ".join(f"{v:.2f}" for v in r.get(f"right_by_position_k{GATE_K}", []))
        lines.append(f"| {seed} | {r['em_k2']:.3f} | {r['em_k4']:.3f} | {r[f'em_k{GATE_K}']:.3f} ± "
                     f"{r[f'em_se_k{GATE_K}']:.3f} | {r[f'format_k{GATE_K}']:.2f} | {r[f'turns_k{GATE_K}']:.1f} | "
                     f"{r[f'mem_kinds_k{GATE_K}']['gold']:.2f} | {positions} | {r['copy_loss_last50']:.3f} | "
                     f"{r.get('copy_steps', '')} | "
                     f"{r['sft_last_loss']:.3f} | {'yes' if passes_gate(r) else 'no'} |")
    decision = (decide(dict.fromkeys(state["models"], {})) if failed
                else {"outcome": "unfinished", "why": "the gate is not settled" if not state["settled"]
                      else "no signal.json yet"})
    decision = {**decision, "models": state["models"], "judged": state["judged"]}
    lines += ["", f"Decision: **{decision['outcome']}**", "", "```", json.dumps(decision, indent=1), "```"]
    _gate_plot(folder, [rows[s] for s in state["judged"]])
    return "\n".join(lines)


def _pyplot() -> Any:
    """matplotlib.pyplot on the Agg backend, or None without matplotlib (the tables are written without it)."""
    try:
        import matplotlib  # reason: optional (the demo extra)
    except ImportError:
        return None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # reason: as above
    return plt


def _gate_plot(folder: Path, rows: Sequence[Mapping[str, Any]]) -> None:
    plt = _pyplot()
    if plt is None:
        return
    ks = (2, 4, 8)
    fig, ax = plt.subplots(figsize=(8, 4))
    colors = plt.get_cmap("tab10" if len(rows) <= 10 else "tab20")  # tab10 is the default cycle; E10 has 12 seeds
    for i, row in enumerate(rows):
        ax.errorbar(ks, [row[f"em_k{k}"] for k in ks], yerr=[row.get(f"em_se_k{k}", 0.0) for k in ks], marker="o",
                    capsize=3, color=colors(i), label=f"SFT seed {row['seed']}")
    ax.plot([GATE_K - 0.4, GATE_K + 0.4], [GATE_EM, GATE_EM], color="k", linestyle="--", label=f"gate (k = {GATE_K})")
    ax.set_xticks(list(ks))
    ax.set_ylim(0.0, 1.0)
    ax.set_xlabel("objectives k (validation split)")
    ax.set_ylabel("greedy EM after SFT (± SE)")
    ax.set_title(f"Execution {execution(folder)}: the SFT gate")
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize="small")  # beside the axes: it hides no point
    fig.tight_layout()
    fig.savefig(folder / f"gate_e{execution(folder)}.png", dpi=100)
    plt.close(fig)


def _plot(folder: Path, estimates: Mapping[int, Any], by_model: Mapping[int, Any], arm: str) -> None:
    plt = _pyplot()
    if plt is None:
        return

    fig, ax = plt.subplots(figsize=(7, 4))
    ax.axhline(0.0, color="k", linewidth=0.8)
    for i, (seed, runs) in enumerate(by_model.items()):
        es = [model_estimate(runs, arm, k) for k in (2, 4, 8)]
        x = [k + 0.15 * (i - 1) for k in (2, 4, 8)]
        ax.errorbar(x, [e["d"] if e["d"] is not None else math.nan for e in es], yerr=[e["se"] or 0.0 for e in es],
                    marker="o", capsize=3, label=f"SFT seed {seed}")
    if estimates and all(e["se"] for e in estimates.values()):
        p = pooled(list(estimates.values()))
        ax.errorbar([8.5], [p["mean"]], yerr=[[p["mean"] - p["low"]], [p["high"] - p["mean"]]], fmt="s", color="k",
                    capsize=4, label="pooled (95 %)")
    ax.set_xticks([2, 4, 8])
    ax.set_xlabel("objectives k (test split)")
    ax.set_ylabel(f"EM {arm} - grpo (paired; mean ± SE)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(folder / f"ablation_e{execution(folder)}.png", dpi=100)
    plt.close(fig)


def main(argv: Sequence[str]) -> int:
    command = argv[0] if argv else ""
    folder = Path(argv[1]) if len(argv) > 1 else Path(__file__).parent
    try:
        return _command(command, folder, argv[2:])
    except (OSError, ValueError, KeyError) as error:
        print(f"ex7: {command}: {error!r}", file=sys.stderr)
        return 2


def _command(command: str, folder: Path, rest: Sequence[str] = ()) -> int:
    if command == "gate":
        print(json.dumps(folder_gate(folder)))
        return 0
    if command == "next":
        print(" ".join(map(str, folder_gate(folder)["next"])))
        return 0
    if command == "models":
        state = folder_gate(folder)
        print(" ".join(map(str, state["models"])))
        if not state["settled"]:
            raise ValueError(f"the gate is not settled: run seeds {state['next']} first")
        if len(state["models"]) < MODELS:
            print(f"ex7: {len(state['models'])} of seeds {state['judged']} passed the SFT gate (EM >= {GATE_EM} at "
                  f"k = {GATE_K} on validation), fewer than {MODELS}: execution {execution(folder)} is not a test",
                  file=sys.stderr)
            return 3
        return 0
    if command == "same-weights":
        kept, remade = (json.loads(Path(p).read_text().splitlines()[-1])["weights_sha256"] for p in (folder, *rest))
        if kept != remade:
            print(f"ex7: the remade SFT model's weights ({remade}) are not the kept row's ({kept}): another CPU or "
                  "float path (docs/experiments/X1-another-cpu.md); continue only on the machine that made them",
                  file=sys.stderr)
            return 2
        return 0
    if command == "choose":
        settled = folder_gate(folder)
        signals = {s: json.loads((folder / f"signal_s{s}" / "results.json").read_text()) for s in settled["models"]}
        chosen = choose(signals)
        presence = {str(s): signal_present(signals[s], chosen["best"]) for s in settled["models"]}
        if (folder / "best.txt").is_file() and _best(folder) != chosen["best"]:
            print(f"ex7: best.txt says {_best(folder)}, the rule now {chosen['best']}: the files changed",
                  file=sys.stderr)
            return 2
        (folder / "best.txt").write_text(chosen["best"] + "\n")
        (folder / "signal.json").write_text(json.dumps({"models": settled["models"], **chosen, "signal": presence},
                                                       indent=1) + "\n")
        print(chosen["best"])
        return 0
    if command == "summary":
        text = _summary(folder)
        (folder / "results.md").write_text(text + "\n")
        print(text)
        return 0
    print("usage: ex7.py gate|next|models|choose|summary [DIR] or same-weights KEPT REMADE", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
