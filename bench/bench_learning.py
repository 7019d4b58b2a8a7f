"""The pre-registered, powered ablation (issue 20; protocol in docs/experiments/E2-ablation-execution-2.md):
does the memory reward help? From one SFT checkpoint, RL in every arm for every seed, equal steps and
questions:

    grpo            algorithm.memory_weight = 0 (the outcome reward only; scoring as the config's)
    mempo           the paper's MemPO: memory_weight = 1, the library's default scoring (definition
                    ``paper`` of bench/bench_signal.py: threshold 0.5; the demo config's own threshold
                    is null), pooling per group, no std floor
    mempo_nothresh  as mempo with definition ``paper_nothresh`` (threshold null: every answer token counts)
    mempo_<name>    (``--best NAME``) as mempo with the scoring of bench_signal's definition NAME, plus
                    ``--best-overrides`` (dotted ``algorithm.`` / ``scoring.`` overrides for this arm only,
                    e.g. ``algorithm.memory_pooling=group_seen algorithm.memory_std_floor=0.05``)

then evaluation under the memory context (greedy) at the evaluated k (``--ks``, default the config's
``eval.objectives``): EM, F1, prompt tokens per episode, the share of scored ``<mem>`` blocks that keep
every gold retrieved so far (`Trajectory.memory_keeps`) and of those that drop one. RL trains on
k = ``data.num_objectives``.

Paired by seed: seed index s uses, in every arm, the same SFT weights, the same RL questions
(`mempo.apps.demo.rl_episodes`, question seed ``data.seed``, the same order: ``data.seed`` shuffles),
``rollout.seed = s`` (the training rollouts' sampling) and ``trainer.seed = s`` (torch's global seed,
set by `train`); the evaluation episodes are the same for every run and evaluation is greedy. Per arm
the results give the paired difference to grpo at every evaluated k: per seed (arm - grpo) and its
mean ± SE over the seeds both ran (SE = sample std / sqrt(n); null with one seed), and "ahead" when
the mean is at least 2 SE above 0.

Held out: the evaluation asks only about entities no SFT or RL question asks about
(`mempo.synthetic.heldout`). The SFT model is the demo's, whose data left out the subjects of the
demo's held-out splits (`mempo.eval.held_out_of_training`: the test split, ``eval.objectives`` x
``eval.episodes``, and the validation split, ``eval.validation_episodes`` per k); an evaluation here
(``--ks``, ``--episodes``) asking about any other entity is refused before anything runs (run the
demo with ``eval.episodes=256`` for the default 256 episodes here), and the RL questions leave out
both sets. The evaluated split is the config's ``eval.split`` (``test``, the demo's default; the
override ``eval.split=validation`` evaluates the first ``--episodes`` validation episodes per k, for
every choice a pre-registered test run must not be tuned on); the results and the table name it.

Resumable: every finished (arm, seed) run is written at once, atomically, to
``<runs>/<arm>_s<seed>.json`` (its settings, evaluation rows and training totals; its per-step training metrics
just before it, to ``<runs>/metrics/<arm>_s<seed>.jsonl``; ``--runs``, default
``<out>/runs``: the executions in docs/experiments keep them under git in ``bench/learning_runs*/``, so
that a fresh machine continues one once its SFT model is remade), the SFT model's evaluation to
``<runs>/sft.json``; a rerun with the same settings reuses them and runs only the missing ones (the
training directory ``<out>/<arm>/seed<s>`` of a run without a run file is started over); a run file
made with other settings is refused (exit 2) unless ``--rerun`` (which replaces it).

Run (after the demo, whose output holds the SFT model and the configuration):

    bash tools/demo.sh eval.episodes=256                 # writes demo_out/ (model_sft, config.yaml)
    .venv-test/bin/python bench/bench_learning.py --demo-out demo_out --out bench_learning_out --best NAME

Options: --seeds (default 0..7), --steps (RL steps per run; default the demo config's
trainer.total_steps), --ks (default the config's eval.objectives), --episodes (evaluation episodes per
k; default 256), --variants (default grpo mempo; given empty, only the --best arm), --best,
--best-overrides, --rerun, --threads, --runs, and
dotted config overrides for every arm (``key=value``, anywhere; one that an arm replaces, such as
``algorithm.memory_weight``, is refused: the --best arm's go in --best-overrides). Writes ``<out>/results.json`` (every
run, the per-arm statistics and paired differences), ``<out>/results.md`` (the tables) and
``<out>/ablation.png``.
"""
from __future__ import annotations

import argparse
import dataclasses
import hashlib
import importlib.util
import json
import math
import operator
import shutil
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Optional, Sequence

import torch

from mempo.apps.demo import rl_episodes
from mempo.config import MempoConfig, config_from_dict, config_to_dict, load_config, split_overrides
from mempo.errors import MempoError
from mempo.eval import eval_episodes, evaluate, held_out_of_training, standard_error
from mempo.model.loading import pretrained_causal_lm, pretrained_tokenizer
from mempo.synthetic.build import build_world
from mempo.synthetic.heldout import held_out_subjects
from mempo.train.logging import read_metrics
from mempo.train.metric_names import MEM_KEEPS, MEM_REWARD, REWARD, TOKENS
from mempo.train.trainer import train
from mempo.utils.allocator import keep_freed_memory
from mempo.utils.atomic import replace_file_atomically
from mempo.utils.machine import machine_facts


def _load_bench_signal() -> Any:
    """bench/bench_signal.py as a module (bench/ is not a package): its `DEFINITIONS`,
    `definition_config` and `model_digest`."""
    if "bench_signal" in sys.modules:
        return sys.modules["bench_signal"]
    spec = importlib.util.spec_from_file_location("bench_signal", Path(__file__).with_name("bench_signal.py"))
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


bench_signal = _load_bench_signal()
DEFINITIONS = bench_signal.DEFINITIONS


@dataclasses.dataclass(frozen=True)
class Arm:
    """One arm of the ablation: ``definition``, a name of bench_signal's `DEFINITIONS` (the run's
    ``scoring`` section reset to the library defaults, then that definition's overrides; None: the
    config's scoring kept), then ``overrides`` (dotted ``key=value`` text, as on a command line)."""

    name: str
    definition: Optional[str]
    overrides: tuple[str, ...]


#: The memory arms' advantage settings: the paper's (weight 1, all rounds of a group pooled, no floor).
PAPER_ALGORITHM = ("algorithm.memory_weight=1", "algorithm.memory_pooling=group", "algorithm.memory_std_floor=0")
VARIANTS = {
    "grpo": Arm("grpo", None, ("algorithm.memory_weight=0",)),
    "mempo": Arm("mempo", "paper", PAPER_ALGORITHM),
    "mempo_nothresh": Arm("mempo_nothresh", "paper_nothresh", PAPER_ALGORITHM),
}
#: The sections `--best-overrides` may set (what the memory reward and its advantage compute).
ARM_SECTIONS = ("algorithm", "scoring")
BASELINE = "grpo"
#: Per k, what each run's evaluation records and the tables summarise (`_rows`); the last three are the
#: monitors of execution 7 (docs/experiments/E7-ablation-execution-7.md): turns per episode, the share of
#: answers given with a question pending (an agent that learnt to answer early) and the memory context's
#: prompt tokens over the full context's of the same rounds.
METRICS = ("em", "f1", "prompt_tokens_per_episode", "memory_keeps", "memory_drops", "turns", "answered_pending",
           "token_ratio")
RUN_FORMAT = "mempo-bench-learning-run/1"


class AblationError(MempoError):
    """Bad input to the ablation (printed as one ``bench_learning: ...`` line, exit 2)."""


class NotHeldOut(AblationError):
    """The evaluation asks about entities the demo's SFT data may have asked about."""


def check_held_out(sft_held_out: frozenset[str], eval_held_out: frozenset[str]) -> None:
    """NotHeldOut unless every subject of this evaluation (`eval_held_out`) was held out of the SFT
    data (`sft_held_out`: the demo's evaluation subjects)."""
    missing = eval_held_out - sft_held_out
    if missing:
        raise NotHeldOut(f"{len(missing)} of the {len(eval_held_out)} entities this evaluation asks about were not "
                         "held out of the demo's SFT data (its eval.objectives x eval.episodes, and "
                         "eval.validation_episodes); evaluate the demo's k and episodes (--ks / --episodes) or rerun "
                         "the demo with them in eval.objectives / eval.episodes")


def best_arm(definition: str, overrides: Sequence[str] = ()) -> Arm:
    """The arm ``mempo_<definition>``: the paper's advantage settings, bench_signal's `definition`,
    then `overrides` (``algorithm.*`` / ``scoring.*`` only). AblationError naming what is wrong."""
    if definition not in DEFINITIONS:
        raise AblationError(f"--best: unknown definition {definition!r}; known: {list(DEFINITIONS)}")
    bad = [o for o in overrides if "=" not in o or o.split("=", 1)[0].strip().split(".")[0] not in ARM_SECTIONS]
    if bad:
        raise AblationError(f"--best-overrides: {bad}: only 'section.field=value' of the "
                            f"{'/'.join(ARM_SECTIONS)} sections may differ between arms")
    return Arm(f"mempo_{definition}", definition, PAPER_ALGORITHM + tuple(overrides))


def arm_config(cfg: MempoConfig, arm: Arm, seed: int, steps: int, out_dir: Path) -> MempoConfig:
    """The configuration of `arm`'s run of seed `seed`: the arm's scoring and overrides, ``rollout.seed``
    and ``trainer.seed`` = `seed`, `steps` RL steps into `out_dir` (no checkpoints, no periodic
    evaluation), evaluation without the closed-book pass. ConfigError naming a bad override."""
    if arm.definition is not None:
        cfg = bench_signal.definition_config(cfg, DEFINITIONS[arm.definition])
    data = config_to_dict(cfg)
    data["rollout"]["seed"] = seed
    data["trainer"].update(seed=seed, total_steps=steps, out_dir=str(out_dir), save_every=0, eval_every=0,
                           progress=False, resume="never")
    data["eval"]["closed_book"] = False
    return config_from_dict(data, list(arm.overrides))


def check_overrides_kept(overrides: Sequence[str], cfg: MempoConfig, run_cfg: MempoConfig, arm: Arm) -> None:
    """AblationError when an override for every arm (`overrides`, applied in `cfg`) is replaced in
    `arm`'s run configuration `run_cfg` (the arm's definition or overrides set that field, or the run
    sets it: seeds, steps, output, the closed-book pass), instead of being dropped silently."""
    for override in overrides:
        key = override.split("=", 1)[0].strip()
        given, used = operator.attrgetter(key)(cfg), operator.attrgetter(key)(run_cfg)
        if given != used:
            raise AblationError(f"the override {override!r} is replaced in arm {arm.name}'s runs ({key} = "
                                f"{used!r} there): the arms set algorithm.* and scoring.* (give the --best "
                                "arm's in --best-overrides); --seeds and --steps set the seeds and steps")


def episodes_digest(episodes: Sequence[Any]) -> str:
    """sha256 of the episodes' ids and questions, in order (the same digest: the same questions)."""
    text = json.dumps([[e.id, list(e.questions)] for e in episodes])
    return hashlib.sha256(text.encode()).hexdigest()


def _settings(cfg: MempoConfig, **facts: Any) -> dict[str, Any]:
    """What a run file must match to be reused: `facts` and the run's configuration (output paths
    aside), as JSON reads them back."""
    data = config_to_dict(cfg)
    data["trainer"].pop("out_dir", None)
    return json.loads(json.dumps({"format": RUN_FORMAT, **facts, "config": data}))


def finished_run(path: Path, settings: dict[str, Any], rerun: bool) -> Optional[dict[str, Any]]:
    """The record saved at `path` when it was made with `settings`; None when there is none (or
    `rerun` and it differs). AblationError for a file of other settings (naming the fields that
    differ) or an unreadable one, unless `rerun`."""
    if not path.is_file():
        return None
    try:
        record = json.loads(path.read_text())
        saved = record["settings"]
    except (OSError, ValueError, KeyError, TypeError) as error:
        if rerun:
            return None
        raise AblationError(f"{path}: not a readable run file ({error}); --rerun replaces it") from None
    if saved == settings:
        return record
    if rerun:
        return None
    differs = sorted(key for key in settings.keys() | saved.keys() if saved.get(key) != settings.get(key))
    if "config" in differs:
        differs.remove("config")
        differs += sorted(f"config.{section}" for section in settings["config"].keys() | saved["config"].keys()
                          if saved["config"].get(section) != settings["config"].get(section))
    raise AblationError(f"{path}: made with other settings (differs in {', '.join(differs)}); give another --out, "
                        "or --rerun to replace the runs of other settings")


def _rows(report: Any, ks: Sequence[int], tokenizer: Any) -> dict[str, dict[str, Optional[float]]]:
    """Per k: EM, F1, prompt tokens per episode (memory context), the shares of scored ``<mem>``
    blocks keeping / dropping a gold retrieved before them (None when no block had one), turns per
    episode, the share of the answered episodes answered with a question pending
    (`Trajectory.answered_pending`; None when none was answered), the full context's prompt tokens of
    the same rounds and the memory / full ratio (``EvalRow.token_ratio``); ``em_per_episode``: each
    episode's EM in the evaluation's episode order (the pairing of `gain_over_sft`)."""
    rows = {}
    for k in ks:
        row = report.row(k, "memory")
        episodes = report.trajectories[("", k, "memory")]
        flags = [flag for t in episodes for flag in t.memory_keeps(tokenizer)
                 if flag is not None]
        keeps = statistics.fmean(float(f) for f in flags) if flags else None
        # computed here, not read from EvalRow.answered_pending: bench/demo_seeds/screen.sh runs this script
        # against the mempo of an earlier commit, whose rows lack that field
        pending = [p for t in episodes for p in [t.answered_pending(tokenizer)]
                   if p is not None]
        rows[str(k)] = {"em": float(row.em), "f1": float(row.f1),
                        "prompt_tokens_per_episode": float(row.prompt_tokens_per_episode),
                        "memory_keeps": keeps, "memory_drops": None if keeps is None else 1.0 - keeps,
                        "memory_judged": len(flags), "turns": float(row.mean_turns),
                        "answered_pending": statistics.fmean(float(p) for p in pending) if pending else None,
                        "answered": len(pending),
                        "full_context_tokens_per_episode": float(row.full_context_tokens_per_episode),
                        "token_ratio": row.token_ratio,
                        "em_per_episode": [float((t.outcome or {}).get("em", 0.0)) for t in episodes]}
    return rows


def _row_summary(rows: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """`_rows` for a log line: without the per-episode lists."""
    return {k: {m: v for m, v in row.items() if m != "em_per_episode"} for k, row in rows.items()}


def gain_over_sft(sft_rows: dict[str, Any], runs: Sequence[dict[str, Any]], arm: str,
                  ks: Sequence[int]) -> dict[str, dict[str, dict[str, Optional[float]]]]:
    """Per k and seed of `arm`: RL's EM gain over the SFT model on the same episodes, ``{"gain": EM after -
    EM before, "se": the SE of the per-episode differences}`` (the demo report's paired SE); ``se`` None
    when either row lacks ``em_per_episode`` (run files made before it) or the two differ in length."""
    gains: dict[str, dict[str, dict[str, Optional[float]]]] = {}
    for k in ks:
        before = sft_rows[str(k)]
        per_seed = {}
        for record in sorted((r for r in runs if r["arm"] == arm), key=lambda r: r["seed"]):
            after = record["rows"][str(k)]
            first, last = before.get("em_per_episode"), after.get("em_per_episode")
            paired = first is not None and last is not None and len(first) == len(last) >= 2
            per_seed[str(record["seed"])] = {
                "gain": after["em"] - before["em"],
                "se": standard_error([b - a for a, b in zip(first, last)]) if paired else None}
        gains[str(k)] = per_seed
    return gains


def _training_totals(metrics: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Steps, trained tokens, and the step means of outcome reward, memory reward and keeps share."""
    def mean(key: str) -> Optional[float]:
        values = [float(r[key]) for r in metrics if isinstance(r.get(key), (int, float)) and math.isfinite(r[key])]
        return statistics.fmean(values) if values else None

    return {"steps": len(metrics), "trained_tokens": sum(float(r.get(TOKENS, 0.0)) for r in metrics),
            "reward_mean": mean(REWARD), "memory_reward_mean": mean(MEM_REWARD), "memory_keeps_mean": mean(MEM_KEEPS)}


def mean_se(values: Sequence[float]) -> tuple[Optional[float], Optional[float]]:
    """(mean, standard error = sample std / sqrt(n)); SE None with one value, both None with none."""
    if not values:
        return None, None
    mean = statistics.fmean(values)
    return mean, (statistics.stdev(values) / math.sqrt(len(values)) if len(values) > 1 else None)


def arm_summary(runs: Sequence[dict[str, Any]], arm: str, ks: Sequence[int]) -> dict[str, dict[str, Any]]:
    """Per k and metric of `METRICS`: mean, SE and n over the arm's seeds (seeds without a value left out)."""
    summary: dict[str, dict[str, Any]] = {}
    for k in ks:
        summary[str(k)] = {}
        for metric in METRICS:
            values = [r["rows"][str(k)][metric] for r in runs if r["arm"] == arm
                      and r["rows"][str(k)].get(metric) is not None]  # a run file from before a metric: left out
            mean, se = mean_se(values)
            summary[str(k)][metric] = {"mean": mean, "se": se, "n": len(values)}
    return summary


def paired_differences(runs: Sequence[dict[str, Any]], arm: str, ks: Sequence[int],
                       baseline: str = BASELINE) -> dict[str, dict[str, Any]]:
    """Per k and metric: ``per_seed`` {seed: arm - baseline} over the seeds both ran (and both have a
    value), its mean ± SE (`mean_se`), n, and ``ahead`` (mean >= 2 SE and > 0; None without an SE)."""
    by_seed = {(r["arm"], r["seed"]): r for r in runs}
    paired: dict[str, dict[str, Any]] = {}
    for k in ks:
        paired[str(k)] = {}
        for metric in METRICS:
            per_seed = {}
            for (name, seed), record in sorted(by_seed.items(), key=lambda item: item[0][1]):
                base = by_seed.get((baseline, seed))
                if name != arm or base is None:
                    continue
                value, base_value = record["rows"][str(k)].get(metric), base["rows"][str(k)].get(metric)
                if value is not None and base_value is not None:
                    per_seed[str(seed)] = value - base_value
            mean, se = mean_se(list(per_seed.values()))
            ahead = None if se is None else bool(mean > 0 and mean >= 2 * se)
            paired[str(k)][metric] = {"per_seed": per_seed, "mean": mean, "se": se, "n": len(per_seed),
                                      "ahead": ahead}
    return paired


def run(demo_out: Path, out: Path, *, seeds: Sequence[int] = tuple(range(8)), steps: Optional[int] = None,
        ks: Optional[Sequence[int]] = None, episodes: int = 256,
        arms: Sequence[Arm] = (VARIANTS["grpo"], VARIANTS["mempo"]), overrides: Sequence[str] = (),
        rerun: bool = False, runs_dir: Optional[Path] = None, log=print) -> dict[str, Any]:
    """Run every missing (arm, seed) of the ablation (module docstring), reusing finished ones from
    `runs_dir` (default ``<out>/runs``); writes the outputs and returns the results. AblationError
    before anything runs for a bad input or a run file of other settings."""
    names = [a.name for a in arms]
    if len(set(names)) != len(names) or not arms:
        raise AblationError(f"the arms must be distinct and at least one, got {names}")
    if len(set(seeds)) != len(seeds) or not seeds:
        raise AblationError(f"--seeds must be distinct and at least one, got {list(seeds)}")
    if episodes < 1 or (steps is not None and steps < 1):
        raise AblationError(f"--episodes and --steps must be >= 1, got {episodes} and {steps}")
    sft_model = demo_out / "model_sft"
    if not (demo_out / "config.yaml").is_file() or not sft_model.is_dir():
        raise AblationError(f"{demo_out}: not a demo output (config.yaml and model_sft/ are needed; run mempo demo)")
    cfg = load_config(demo_out / "config.yaml", list(overrides))
    steps = int(steps if steps is not None else cfg.trainer.total_steps)
    ks = [int(k) for k in (ks if ks is not None else cfg.eval.objectives)]
    env = build_world(cfg)
    episodes_by_k = eval_episodes(env.world, cfg, num_episodes=episodes, objectives=ks)
    sft_held_out = held_out_of_training(env.world, cfg)  # what the demo's SFT data left out (both splits)
    eval_held_out = held_out_subjects(episodes_by_k)
    check_held_out(sft_held_out, eval_held_out)
    training = rl_episodes(cfg, env.world, sft_held_out | eval_held_out, steps)
    digest = bench_signal.model_digest(sft_model)
    facts = {"model_sha256": digest, "ks": ks, "episodes": episodes, "split": cfg.eval.split,
             "eval_episodes_sha256": {str(k): episodes_digest(e) for k, e in episodes_by_k.items()}}
    rl_facts = {"steps": steps, "rl_k": cfg.data.num_objectives, "rl_episodes_sha256": episodes_digest(training)}
    runs_dir = out / "runs" if runs_dir is None else Path(runs_dir)
    plan = []  # (arm, seed, config, settings, path, finished record or None): every file checked first
    for seed in seeds:  # seed-major: an interrupted ablation leaves complete pairs
        for arm in arms:
            run_cfg = arm_config(cfg, arm, seed, steps, out / arm.name / f"seed{seed}")
            check_overrides_kept(overrides, cfg, run_cfg, arm)
            settings = _settings(run_cfg, arm=arm.name, definition=arm.definition, arm_overrides=list(arm.overrides),
                                 seed=seed, **facts, **rl_facts)
            path = runs_dir / f"{arm.name}_s{seed}.json"
            plan.append((arm, seed, run_cfg, settings, path, finished_run(path, settings, rerun)))
    sft_cfg = dataclasses.replace(cfg, eval=dataclasses.replace(cfg.eval, closed_book=False))
    sft_settings = _settings(sft_cfg, arm="sft", **facts)
    sft_record = finished_run(runs_dir / "sft.json", sft_settings, rerun)
    tokenizer = pretrained_tokenizer(sft_model)
    runs_dir.mkdir(parents=True, exist_ok=True)
    out.mkdir(parents=True, exist_ok=True)
    began = time.perf_counter()
    if sft_record is None:
        model = pretrained_causal_lm(sft_model)
        report = evaluate(model, tokenizer, episodes_by_k, env.retriever, sft_cfg, show_progress=False,
                          log=lambda s: None, keep_trajectories=True)
        sft_record = {"settings": sft_settings, "arm": "sft", "rows": _rows(report, ks, tokenizer),
                      "eval_seconds": time.perf_counter() - began}
        replace_file_atomically(runs_dir / "sft.json", json.dumps(sft_record, indent=2) + "\n")
    log(f"sft: {_row_summary(sft_record['rows'])}")
    records, reused = [], 0
    for arm, seed, run_cfg, settings, path, record in plan:
        if record is not None:
            reused += 1
            log(f"{arm.name} seed {seed}: finished before ({path}), skipped")
            records.append(record)
            continue
        run_dir = Path(run_cfg.trainer.out_dir)
        if run_dir.exists():  # an interrupted (or replaced) run's steps and checkpoint: this run starts over
            shutil.rmtree(run_dir)
        model = pretrained_causal_lm(sft_model)
        start = time.perf_counter()
        trained = train(run_cfg, model=model, tokenizer=tokenizer, episodes=training, retriever=env.retriever,
                        out_dir=str(run_dir))
        rl_seconds = time.perf_counter() - start
        report = evaluate(trained.model, tokenizer, episodes_by_k, env.retriever, run_cfg, show_progress=False,
                          log=lambda s: None, keep_trajectories=True)
        metrics = run_dir / "metrics.jsonl"
        record = {"settings": settings, "arm": arm.name, "seed": seed, "rl_seconds": rl_seconds,
                  "eval_seconds": time.perf_counter() - start - rl_seconds,
                  "training": _training_totals(read_metrics(metrics)), "rows": _rows(report, ks, tokenizer)}
        # its per-step metrics kept beside it, before it: a run file's presence says both are whole
        (runs_dir / "metrics").mkdir(parents=True, exist_ok=True)
        replace_file_atomically(runs_dir / "metrics" / f"{arm.name}_s{seed}.jsonl", metrics.read_bytes())
        replace_file_atomically(path, json.dumps(record, indent=2) + "\n")
        records.append(record)
        log(f"{arm.name} seed {seed}: {_row_summary(record['rows'])} ({rl_seconds:.0f} s RL, "
            f"{time.perf_counter() - began:.0f} s so far)")
    results: dict[str, Any] = {
        "demo_out": str(demo_out), "model_sha256": digest, "steps": steps, "rl_k": cfg.data.num_objectives,
        "seeds": list(seeds), "ks": ks, "episodes": episodes, "split": cfg.eval.split,
        "questions_per_step": cfg.data.questions_per_step, "group_size": cfg.rollout.group_size, "baseline": BASELINE,
        "arms": {a.name: {"definition": a.definition,
                          "scoring": None if a.definition is None else DEFINITIONS[a.definition],
                          "overrides": list(a.overrides)} for a in arms},
        "sft": sft_record["rows"], "runs": records, "reused_runs": reused,
        "summary": {a.name: arm_summary(records, a.name, ks) for a in arms},
        "paired": ({a.name: paired_differences(records, a.name, ks) for a in arms if a.name != BASELINE}
                   if BASELINE in names else {}),
        "gain_over_sft": {a.name: gain_over_sft(sft_record["rows"], records, a.name, ks) for a in arms},
        "seconds": time.perf_counter() - began, "machine": machine_facts(),
    }
    results["table"] = _table(results, names, ks)
    replace_file_atomically(out / "results.json", json.dumps(results, indent=2) + "\n")
    replace_file_atomically(out / "results.md", results["table"] + "\n")
    _plot(results, names, ks, out / "ablation.png")
    return results


def _pm(mean: Optional[float], se: Optional[float], spec: str = "{:.3f}") -> str:
    if mean is None:
        return "-"
    return spec.format(mean) + (" ± " + spec.replace("+", "").format(se) if se is not None else " (one seed)")


def _rl_k_text(rl_k: Any) -> str:
    """`data.num_objectives` as said: ``2``, or a mixed-k cycle ``2, 4 in turn``."""
    return str(rl_k) if isinstance(rl_k, int) else f"{', '.join(map(str, rl_k))} in turn"


def _table(results: dict[str, Any], arms: Sequence[str], ks: Sequence[int]) -> str:
    n = len(results["seeds"])
    lines = [f"RL: {results['steps']} steps on k = {_rl_k_text(results['rl_k'])} "
             f"from `{results['demo_out']}/model_sft` "
             f"(sha256 {results['model_sha256'][:12]}), seeds {results['seeds']} paired; evaluation: "
             f"{results['episodes']} held-out {results.get('split', 'test')} episodes per k, greedy, memory context. "
             "Mean ± SE over seeds.", "",
             f"| arm | k | EM ({n} seeds) | F1 | prompt tokens / episode | <mem> keeps | <mem> drops | turns | "
             "answered with a question pending | memory / full prompt tokens |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for k in ks:
        sft = results["sft"][str(k)]
        lines.append(f"| SFT (no RL) | {k} | " + " | ".join(
            "-" if sft.get(m) is None else ("{:.0f}" if m == "prompt_tokens_per_episode" else "{:.3f}").format(sft[m])
            for m in METRICS) + " |")
    for arm in arms:
        for k in ks:
            s = results["summary"][arm][str(k)]
            lines.append(f"| {arm} | {k} | " + " | ".join(
                _pm(s[m]["mean"], s[m]["se"], "{:.0f}" if m == "prompt_tokens_per_episode" else "{:.3f}")
                for m in METRICS) + " |")
    lines += ["", "RL's EM gain over the SFT model per seed, on the same episodes (SE of the per-episode "
              "differences; - for run files made without per-episode EM).", "",
              "| arm | k | gain (SE) per seed |", "|---|---|---|"]
    for arm in arms:
        for k in ks:
            per_seed = results["gain_over_sft"][arm][str(k)]
            lines.append(f"| {arm} | {k} | " + ", ".join(
                f"{seed}: {g['gain']:+.3f} ({'-' if g['se'] is None else format(g['se'], '.3f')})"
                for seed, g in per_seed.items()) + " |")
    if results["paired"]:
        lines += ["", f"Paired difference to {results['baseline']} (arm - {results['baseline']}, same seed); "
                  "ahead: mean >= 2 paired SE.", "",
                  "| arm | k | EM diff (mean ± SE) | n | ahead | per seed | F1 diff | prompt tokens diff | "
                  "keeps diff | turns diff | answered-pending diff |",
                  "|---|---|---|---|---|---|---|---|---|---|---|"]
        for arm, paired in results["paired"].items():
            for k in ks:
                p = paired[str(k)]
                em, tokens = p["em"], p["prompt_tokens_per_episode"]
                per_seed = ", ".join(f"{s}: {d:+.3f}" for s, d in em["per_seed"].items())
                ahead = "-" if em["ahead"] is None else ("yes" if em["ahead"] else "no")
                lines.append(f"| {arm} | {k} | {_pm(em['mean'], em['se'], '{:+.3f}')} | {em['n']} | {ahead} | "
                             f"{per_seed} | {_pm(p['f1']['mean'], p['f1']['se'], '{:+.3f}')} | "
                             f"{_pm(tokens['mean'], tokens['se'], '{:+.0f}')} | "
                             f"{_pm(p['memory_keeps']['mean'], p['memory_keeps']['se'], '{:+.3f}')} | "
                             f"{_pm(p['turns']['mean'], p['turns']['se'], '{:+.2f}')} | "
                             f"{_pm(p['answered_pending']['mean'], p['answered_pending']['se'], '{:+.3f}')} |")
    return "\n".join(lines)


def _plot(results: dict[str, Any], arms: Sequence[str], ks: Sequence[int], path: Path) -> None:
    try:
        import matplotlib  # reason: optional (the demo extra); the table is written without it
    except ImportError:
        return
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # reason: as above

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    colors = {arm: f"C{i}" for i, arm in enumerate(arms)}  # one colour per arm in both panels
    left.plot(ks, [results["sft"][str(k)]["em"] for k in ks], "k--", marker="o", label="SFT (no RL)")
    for arm in arms:
        stats = [results["summary"][arm][str(k)]["em"] for k in ks]
        left.errorbar(ks, [s["mean"] for s in stats], yerr=[s["se"] or 0.0 for s in stats], marker="o", capsize=3,
                      color=colors[arm], label=arm)
    left.set_xticks(ks)
    left.set_xlabel("objectives k (memory context)")
    left.set_ylabel("EM (mean ± SE over seeds)")
    left.set_title(f"RL on k = {_rl_k_text(results['rl_k'])}, {len(results['seeds'])} seeds, {results['steps']} steps")
    left.legend()
    right.axhline(0.0, color="k", linewidth=0.8)
    for i, (arm, paired) in enumerate(results["paired"].items()):
        x = [k + 0.08 * (i - (len(results["paired"]) - 1) / 2) for k in ks]
        em = [paired[str(k)]["em"] for k in ks]
        right.errorbar(x, [p["mean"] if p["mean"] is not None else math.nan for p in em],
                       yerr=[p["se"] or 0.0 for p in em], marker="o", capsize=3, color=colors[arm], label=arm)
        for xi, p in zip(x, em):
            right.plot([xi] * len(p["per_seed"]), list(p["per_seed"].values()), ".", color="grey", alpha=0.6)
    right.set_xticks(ks)
    right.set_xlabel("objectives k (memory context)")
    right.set_ylabel(f"EM - {results['baseline']} (paired by seed; mean ± SE, dots: seeds)")
    right.set_title("paired difference to GRPO")
    if results["paired"]:
        right.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def split_best_overrides(argv: Sequence[str]) -> tuple[list[str], list[str]]:
    """``(best_overrides, rest)``: the words after ``--best-overrides`` up to the next option, and the
    other words in order (so `split_overrides` does not take them for every arm)."""
    best, rest, inside = [], [], False
    for word in argv:
        if word == "--best-overrides":
            inside = True
            continue
        if word.startswith("-"):
            inside = False
        (best if inside else rest).append(word)
    return best, rest


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--demo-out", type=Path, default=Path("demo_out"))
    parser.add_argument("--out", type=Path, default=Path("bench_learning_out"))
    parser.add_argument("--seeds", type=int, nargs="+", default=list(range(8)))
    parser.add_argument("--steps", type=int, default=None, help="default: the config's trainer.total_steps")
    parser.add_argument("--ks", type=int, nargs="+", default=None, help="default: the config's eval.objectives")
    parser.add_argument("--episodes", type=int, default=256, help="evaluation episodes per k")
    parser.add_argument("--variants", nargs="*", default=["grpo", "mempo"], choices=list(VARIANTS),
                        help="the fixed arms (none: only --best)")
    parser.add_argument("--best", default=None, choices=list(DEFINITIONS),
                        help="add the arm mempo_<BEST>: bench_signal's definition BEST")
    parser.add_argument("--best-overrides", nargs="*", default=[], metavar="KEY=VALUE",
                        help="algorithm.* / scoring.* overrides for the --best arm only (up to the next option)")
    parser.add_argument("--rerun", action="store_true", help="replace run files made with other settings")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    parser.add_argument("--runs", type=Path, default=None,
                        help="where the finished run files live (default <out>/runs; a folder under git keeps "
                             "them past the machine)")
    parser.add_argument("overrides", nargs="*", help="dotted config overrides for every arm (key=value), anywhere")
    best_overrides, words = split_best_overrides(sys.argv[1:] if argv is None else argv)
    overrides, rest = split_overrides(words)
    args = parser.parse_args(rest)
    keep_freed_memory()  # the demo's allocator setting: bit-identical floats, faster steps
    if args.threads:
        torch.set_num_threads(args.threads)
    try:
        if best_overrides and args.best is None:
            raise AblationError("--best-overrides needs --best (they are that arm's)")
        arms = [VARIANTS[name] for name in args.variants]
        if args.best is not None:
            arms.append(best_arm(args.best, best_overrides))
        results = run(args.demo_out, args.out, seeds=args.seeds, steps=args.steps, ks=args.ks,
                      episodes=args.episodes, arms=arms, overrides=overrides, rerun=args.rerun,
                      runs_dir=args.runs, log=lambda line: print(line, flush=True))
    except MempoError as error:
        print(f"bench_learning: {error}", file=sys.stderr)
        return 2
    print(results["table"])
    print(f"{results['seconds']:.0f} s; {args.out / 'results.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
