"""The run report: ``report.md`` plus PNG plots from a training run directory.

Conventions
-----------
* Inputs (all optional; whatever is missing is said so in the report, never invented):
  ``metrics.jsonl`` (the trainer's `mempo.train.logging.MetricsLogger` records; found in the run
  directory, in ``rl/`` or another sub-directory), ``sft/metrics.jsonl`` (``sft/loss`` per step),
  ``eval_before.json`` / ``eval_after.json``
  (`mempo.eval.EvalReport` files: before and after RL), ``stages.json`` (`StageTimes`: wall times
  of the run's stages, written by `mempo.apps.demo`). Each can also be passed explicitly to
  `write_report`; `load_run` reads them into a `RunFiles`.
* Metric names: one per metric, `mempo.train.metric_names` (the names the training step writes);
  the report reads exactly those keys (`CURVE`). Keys starting with ``time/`` are stage seconds per
  step (`mempo.train.logging.StageTimer.metrics`).
* Plots (matplotlib, Agg backend, PNG): ``reward.png`` (reward and the other outcome metrics per
  step), ``memory_reward.png`` (the memory reward, P_mem and P_full per step), ``kl.png`` (KL,
  entropy, clip fraction per step), ``tokens.png`` (prompt tokens per episode by objectives, memory
  vs full context, before vs after), ``sft.png`` (the SFT loss, when logged). A plot with no data is
  not written (and the report says so).
* The report states the measured numbers: machine facts (CPU count, torch version, ...), stage wall
  times, a before/after table (EM, F1, prompt tokens per episode, peak prompt tokens per turn) for
  every evaluated number of objectives under the memory context (and the full context when
  evaluated; and closed-book, ``eval.closed_book``: the same model with a search that finds nothing,
  with the EM that retrieval adds, `closed_book_lines`), the training curve (per step, the main
  metrics) and a first/last/mean summary of every numeric metric.
"""
from __future__ import annotations

import json
import math
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Mapping, Optional, Sequence, Union

from mempo.eval import CLOSED_BOOK_SUFFIX, EpisodeRecord, EvalReport, standard_error
from mempo.train import metric_names as names
from mempo.train.logging import METRICS_FILE, read_metrics
from mempo.utils.machine import machine_facts
from mempo.utils.types import PathLike

__all__ = ["write_report", "ReportResult", "RunFiles", "StageRecord", "StageTimes", "CURVE", "metric_series",
           "load_run", "em_change", "closed_book_lines"]

#: The training curve's metrics: (label, metric name), in table order.
CURVE: tuple[tuple[str, str], ...] = (
    ("reward", names.REWARD), ("em", names.EM), ("f1", names.F1), ("format_rate", names.FORMAT_RATE),
    ("mem_reward", names.MEM_REWARD), ("mem_keeps", names.MEM_KEEPS), ("p_mem", names.P_MEM), ("p_full", names.P_FULL),
    ("kl", names.KL), ("entropy", names.ENTROPY), ("clip_fraction", names.CLIP_FRACTION), ("tokens", names.TOKENS),
    ("loss", names.LOSS),
)


@dataclass
class StageRecord:
    """One stage of a run: its name, wall seconds and what it did (one line)."""

    name: str
    seconds: float
    summary: str

    @classmethod
    def from_dict(cls, obj: Mapping[str, Any]) -> "StageRecord":
        return cls(str(obj["name"]), float(obj["seconds"]), str(obj.get("summary", "")))


@dataclass
class StageTimes:
    """``stages.json``: the stages in order, the total wall seconds and the machine's facts
    (`mempo.utils.machine.machine_facts`)."""

    stages: list[StageRecord] = field(default_factory=list)
    total_seconds: float = 0.0
    machine: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, obj: Mapping[str, Any]) -> "StageTimes":
        stages = [StageRecord.from_dict(s) for s in obj.get("stages", [])]
        return cls(stages, float(obj.get("total_seconds", sum(s.seconds for s in stages))),
                   dict(obj.get("machine", {})))

    @classmethod
    def load(cls, path: PathLike) -> "StageTimes":
        return cls.from_dict(json.loads(Path(path).read_text(encoding="utf-8")))

    def write(self, path: PathLike) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), indent=2) + "\n", encoding="utf-8")


@dataclass
class RunFiles:
    """What `load_run` found in a run directory (None: not there): the training metrics records and
    their file, the SFT metrics records, the evaluations before and after RL, the stage times."""

    metrics: Optional[list[dict[str, Any]]] = None
    metrics_path: Optional[Path] = None
    sft: Optional[list[dict[str, Any]]] = None
    before: Optional[EvalReport] = None
    after: Optional[EvalReport] = None
    stages: Optional[StageTimes] = None


@dataclass
class ReportResult:
    """What `write_report` wrote: the markdown path and the plot paths by name."""

    path: Path
    plots: dict[str, Path] = field(default_factory=dict)
    missing: list[str] = field(default_factory=list)


# ------------------------------------------------------------------------------------------------
# inputs
# ------------------------------------------------------------------------------------------------
def _numeric(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def metric_series(records: Sequence[Mapping[str, Any]], name: str) -> tuple[list[int], list[float]]:
    """(steps, values) of metric `name` (a record key) over the records where it is a finite number."""
    steps, values = [], []
    for record in records:
        value = record.get(name)
        if _numeric(value):
            steps.append(int(record["step"]))
            values.append(float(value))
    return steps, values


def load_run(run_dir: PathLike) -> RunFiles:
    """The inputs found in `run_dir`: the metrics records (``metrics.jsonl`` there, in ``rl/`` or in
    another sub-directory but ``sft/``), ``sft/metrics.jsonl``, ``eval_before.json`` /
    ``eval_after.json`` and ``stages.json``; what is missing stays None."""
    root = Path(run_dir)
    found = RunFiles()
    candidates = [root / METRICS_FILE, root / "rl" / METRICS_FILE] + [
        p for p in sorted(root.glob(f"*/{METRICS_FILE}")) if p.parent.name not in ("rl", "sft")]
    sft_path = root / "sft" / METRICS_FILE
    found.sft = read_metrics(sft_path) if sft_path.is_file() else None
    for path in candidates:
        if path.is_file():
            found.metrics, found.metrics_path = read_metrics(path), path
            break
    for which in ("before", "after"):
        path = root / f"eval_{which}.json"
        if path.is_file():
            setattr(found, which, EvalReport.load(path))
    path = root / "stages.json"
    if path.is_file():
        found.stages = StageTimes.load(path)
    return found


# ------------------------------------------------------------------------------------------------
# plots
# ------------------------------------------------------------------------------------------------
def _pyplot():
    import matplotlib  # reason: optional dependency (the demo extra); plots only

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt  # reason: after selecting the Agg backend

    return plt


def _line_plot(path: Path, title: str, panels: Sequence[tuple[str, Sequence[tuple[str, list, list]]]]) -> bool:
    """One figure with a panel per (ylabel, [(label, steps, values)]); False (nothing written) when empty."""
    panels = [(ylabel, [s for s in series if s[1]]) for ylabel, series in panels]
    panels = [p for p in panels if p[1]]
    if not panels:
        return False
    plt = _pyplot()
    fig, axes = plt.subplots(1, len(panels), figsize=(5.5 * len(panels), 3.8), squeeze=False)
    for ax, (ylabel, series) in zip(axes[0], panels):
        for label, steps, values in series:
            ax.plot(steps, values, marker="o" if len(steps) < 30 else None, label=label)
        ax.set_xlabel("step")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
        if len(series) > 1:
            ax.legend()
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, format="png", dpi=100)
    plt.close(fig)
    return True


def _tokens_plot(path: Path, evals: Mapping[str, Any]) -> bool:
    bars = []  # (label, {k: value})
    for which in ("before", "after"):
        report = evals.get(which)
        if report is None:
            continue
        for policy in ("memory", "full"):
            values = {r.objectives: r.prompt_tokens_per_episode for r in report.rows if r.policy == policy}
            if values:
                bars.append((f"{policy} context, {which} RL", values))
    if not bars:
        return False
    plt = _pyplot()
    ks = sorted({k for _, values in bars for k in values})
    width = 0.8 / len(bars)
    fig, ax = plt.subplots(figsize=(max(5.5, 1.6 * len(ks) + 3), 3.8))
    for i, (label, values) in enumerate(bars):
        xs = [j + (i - (len(bars) - 1) / 2) * width for j in range(len(ks))]
        ax.bar(xs, [values.get(k, 0.0) for k in ks], width, label=label)
    ax.set_xticks(range(len(ks)))
    ax.set_xticklabels([f"{k} objectives" for k in ks])
    ax.set_ylabel("prompt tokens per episode")
    ax.set_title("Prompt tokens per episode (model tokenizer)")
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, format="png", dpi=100)
    plt.close(fig)
    return True


# ------------------------------------------------------------------------------------------------
# markdown
# ------------------------------------------------------------------------------------------------
def _fmt(value: Any, digits: int = 3) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            return str(value)
        if abs(value) >= 1000:
            return f"{value:.0f}"
        return f"{value:.{digits}f}" if abs(value) >= 10 ** -digits or value == 0 else f"{value:.2e}"
    return str(value)


def _table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(_fmt(c) if not isinstance(c, str) else c for c in row) + " |" for row in rows]
    return lines


def _machine_section(machine: Mapping[str, Any]) -> list[str]:
    names = (("cpu_count", "CPU count (os.cpu_count)"), ("cpu_affinity", "CPUs usable by this process"),
             ("cpu_model", "CPU model"), ("cpu_capability", "torch CPU kernels (instruction set)"),
             ("float_path", "instruction set pinned by"), ("torch_threads", "torch threads"),
             ("allocator", "C allocator"), ("torch", "torch"), ("transformers", "transformers"),
             ("tokenizers", "tokenizers"), ("python", "Python"), ("platform", "platform"), ("cuda", "CUDA device"))
    rows = [(label, str(machine[key])) for key, label in names if key in machine]
    return ["## Machine", ""] + _table(("fact", "value"), rows) + [""]


def _with_se(row: Any, name: str) -> Optional[str]:
    """``mean ± standard error`` of a row's metric (``em`` / ``f1``), or None without the row."""
    if row is None:
        return None
    return f"{getattr(row, name):.3f} ± {getattr(row, name + '_se'):.3f}"


def _token_economy_lines(before: Any, after: Any, ks: Sequence[int]) -> list[str]:
    """Memory-context prompt tokens against the full context of the same rounds, per k."""
    lines = []
    for which, report in (("before", before), ("after", after)):
        for k in ks:
            row = report.row(k, "memory") if report is not None else None
            if row is None or row.token_ratio is None:
                continue
            lines.append(f"* {which} RL, k={k}: memory context {row.prompt_tokens_per_episode:.0f} prompt tokens per "
                         f"episode, the full context of the same rounds {row.full_context_tokens_per_episode:.0f} "
                         f"(ratio {row.token_ratio:.2f})")
    return lines + ([""] if lines else [])


def _paired_se(before: Any, after: Any, row: Any, policy: str) -> Optional[float]:
    """The standard error of the mean per-episode EM change when both evaluations kept their
    trajectories of the same episodes (paired), else None."""
    key = (row.dataset, row.objectives, policy)
    first, last = before.trajectories.get(key), after.trajectories.get(key)
    if not first or not last or len(first) != len(last) or len(first) < 2 or any(
            x.episode_id != y.episode_id for x, y in zip(first, last)):
        return None
    return standard_error([float((y.outcome or {}).get("em", 0.0)) - float((x.outcome or {}).get("em", 0.0))
                           for x, y in zip(first, last)])


def em_change(before: Any, after: Any, objectives: int, policy: str = "memory") -> Optional[tuple[float, float]]:
    """(EM after - EM before, its standard error) for one cell of two `mempo.eval.EvalReport`s, or
    None when either lacks the cell. The SE is the paired one (`_paired_se`) when both kept the
    trajectories of the same episodes, else sqrt(SE_before² + SE_after²)."""
    b = before.row(objectives, policy) if before is not None else None
    a = after.row(objectives, policy) if after is not None else None
    if b is None or a is None:
        return None
    se = _paired_se(before, after, b, policy)
    return a.em - b.em, (math.hypot(b.em_se, a.em_se) if se is None else se)


def closed_book_lines(before: Any, after: Any) -> list[str]:
    """Per evaluation, policy and k with a closed-book row (`mempo.eval.closed_book_policy`): EM with
    search, EM closed-book and their difference (what retrieval adds); no lines without such rows."""
    lines = []
    for which, report in (("before", before), ("after", after)):
        for closed in (report.rows if report is not None else []):
            if not closed.policy.endswith(CLOSED_BOOK_SUFFIX):
                continue
            policy = closed.policy[:-len(CLOSED_BOOK_SUFFIX)]
            opened = report.row(closed.objectives, policy, closed.dataset)
            if opened is None:
                continue
            where = f"{closed.dataset} " if closed.dataset else ""
            lines.append(f"* {which} RL, {where}k={closed.objectives}, {policy} context: EM with search "
                         f"{opened.em:.3f} ± {opened.em_se:.3f}, closed-book {closed.em:.3f} ± {closed.em_se:.3f}: "
                         f"retrieval adds {opened.em - closed.em:+.3f}")
    if not lines:
        return []
    return ["### Closed book", "", "The same model, every search answered with no results "
            "(`eval.closed_book`): how much of the EM comes from retrieval.", "", *lines, ""]


def _before_after_section(before: Any, after: Any) -> list[str]:
    lines = ["## Before / after RL", "",
             "Means over the held-out episodes ± their standard errors (sample std / sqrt(episodes)). The EM "
             "change's SE is that of the mean per-episode change when both evaluations kept the trajectories "
             "of the same episodes (paired: the demo's case), else sqrt(SE_before² + SE_after²).", ""]
    if before is None and after is None:
        return lines + ["No evaluation files (eval_before.json / eval_after.json) were found.", ""]
    policies = []
    for report in (before, after):
        for row in (report.rows if report is not None else []):
            if row.policy not in policies:
                policies.append(row.policy)
    policies.sort(key=lambda p: (p != "memory", p))
    for policy in policies:
        ks = sorted({r.objectives for rep in (before, after) if rep is not None
                     for r in rep.rows if r.policy == policy})
        rows = []
        for k in ks:
            b = before.row(k, policy) if before is not None else None
            a = after.row(k, policy) if after is not None else None

            def get(row, name):
                return getattr(row, name) if row is not None else None

            change = None
            delta = em_change(before, after, k, policy)
            if delta is not None:
                change = f"{delta[0]:+.3f}" + (f" ({delta[0] / delta[1]:+.1f} SE)" if delta[1] > 0 else "")
            rows.append((k, get(b, "episodes") or get(a, "episodes"),
                         _with_se(b, "em"), _with_se(a, "em"), change, _with_se(b, "f1"), _with_se(a, "f1"),
                         get(b, "format_rate"), get(a, "format_rate"),
                         get(b, "mean_turns"), get(a, "mean_turns"),
                         get(b, "answered_pending"), get(a, "answered_pending"),
                         get(b, "looped"), get(a, "looped"),
                         get(b, "prompt_tokens_per_episode"), get(a, "prompt_tokens_per_episode"),
                         get(b, "peak_prompt_tokens"), get(a, "peak_prompt_tokens")))
        lines += [f"### {policy} context", ""]
        lines += _table(("objectives", "episodes", "EM before", "EM after", "EM change", "F1 before", "F1 after",
                         "format before", "format after", "turns before", "turns after",
                         "answered pending before", "answered pending after", "looped before", "looped after",
                         "prompt tok/episode before", "prompt tok/episode after",
                         "peak prompt tok/turn before", "peak prompt tok/turn after"), rows)
        lines.append("")
        if policy == "memory":
            lines += _token_economy_lines(before, after, ks)
    lines += closed_book_lines(before, after)
    for which, report in (("before", before), ("after", after)):
        if report is not None:
            meta = report.metadata
            lines.append(f"Evaluation {which} RL: {meta.get('seconds', 0.0):.1f} s, max_turns "
                         f"{meta.get('max_turns')}, max_new_tokens {meta.get('max_new_tokens')}, temperature "
                         f"{meta.get('temperature')}, model {meta.get('model')} "
                         f"({meta.get('parameters', '?')} parameters).")
    lines.append("")
    return lines


def _episode_pair_section(before: EpisodeRecord, after: EpisodeRecord) -> list[str]:
    lines = ["## One held-out episode before and after RL", "",
             f"Episode `{before.episode_id}` ({before.objectives} objectives, {before.policy} context): "
             f"EM {before.em:.2f} before RL, {after.em:.2f} after.", ""]
    for which, record in (("Before RL", before), ("After RL", after)):
        lines += [f"### {which}", "", "```text", record.render(), "```", ""]
    return lines


def _curve_section(records: Optional[Sequence[Mapping[str, Any]]], metrics_path: Optional[Path]) -> list[str]:
    lines = ["## Training curve", ""]
    if not records:
        return lines + ["No training metrics (metrics.jsonl) were found.", ""]
    lines.append(f"{len(records)} logged steps from `{metrics_path.name if metrics_path else 'metrics.jsonl'}`.")
    lines.append("")
    present = {key for record in records for key in record}
    columns = [(name, key) for name, key in CURVE if key in present]
    if columns:
        chosen = list(records)
        if len(chosen) > 40:  # keep the table readable: 40 evenly spaced steps (first and last included)
            idx = sorted({round(i * (len(chosen) - 1) / 39) for i in range(40)})
            chosen = [chosen[i] for i in idx]
        rows = [[r["step"]] + [r.get(key) if _numeric(r.get(key)) else None for _, key in columns] for r in chosen]
        lines += _table(["step"] + [f"{name} (`{key}`)" for name, key in columns], rows) + [""]
    numeric_keys = []
    for record in records:
        for key, value in record.items():
            if key not in ("step", "time") and _numeric(value) and key not in numeric_keys:
                numeric_keys.append(key)
    summary = []
    for key in numeric_keys:
        values = [float(r[key]) for r in records if _numeric(r.get(key))]
        summary.append((f"`{key}`", len(values), values[0], values[-1], sum(values) / len(values)))
    lines += ["### Every logged metric", ""]
    lines += _table(("metric", "steps", "first", "last", "mean"), summary) + [""]
    time_keys = [k for k in numeric_keys if k.startswith("time/")]
    if time_keys:
        rows = []
        for key in time_keys:
            values = [float(r[key]) for r in records if _numeric(r.get(key))]
            rows.append((key[len("time/"):], sum(values) / len(values), sum(values)))
        lines += ["### Seconds per training stage", ""]
        lines += _table(("stage", "mean s/step", "total s"), rows) + [""]
    return lines


def _stages_section(stages: Optional[StageTimes]) -> list[str]:
    lines = ["## Wall time per stage", ""]
    if stages is None or not stages.stages:
        return lines + ["No stage timings (stages.json) were found.", ""]
    rows = [(s.name, s.seconds, s.summary) for s in stages.stages]
    rows.append(("**total**", float(stages.total_seconds), ""))
    lines += _table(("stage", "seconds", "what it did"), rows) + [""]
    return lines


def write_report(run_dir: PathLike, *, out_path: Optional[PathLike] = None,
                 metrics: Optional[Sequence[Mapping[str, Any]]] = None, metrics_path: Optional[PathLike] = None,
                 before: Union[EvalReport, PathLike, None] = None, after: Union[EvalReport, PathLike, None] = None,
                 stages: Optional[StageTimes] = None, machine: Optional[Mapping[str, Any]] = None,
                 title: str = "MemPO run report", notes: Sequence[str] = (),
                 episode_pair: Optional[tuple[EpisodeRecord, EpisodeRecord]] = None,
                 sections: Sequence[Sequence[str]] = ()) -> ReportResult:
    """Write ``report.md`` and the PNG plots into `run_dir`; a plot without data is not written and
    the report says what is missing.

    Explicit arguments win over the files found in `run_dir`: `metrics` (records) or
    `metrics_path`; `before` / `after` (`EvalReport` objects or paths to their JSON);
    `stages` (`StageTimes`); `machine` (default: the stages' machine facts, else this machine's).
    `notes`: extra lines for the top of the report. `episode_pair`: one held-out episode as the
    agent played it before and after RL (`mempo.eval.EpisodeRecord`), rendered one after the other.
    `sections`: more markdown sections (each a list of lines), placed after the before/after tables.
    """
    root = Path(run_dir)
    root.mkdir(parents=True, exist_ok=True)
    found = load_run(root)
    if metrics is None and metrics_path is not None:
        metrics, found.metrics_path = read_metrics(metrics_path), Path(metrics_path)
    records = list(metrics) if metrics is not None else found.metrics
    before = EvalReport.load(before) if isinstance(before, (str, os.PathLike)) else (before or found.before)
    after = EvalReport.load(after) if isinstance(after, (str, os.PathLike)) else (after or found.after)
    stages = stages if stages is not None else found.stages
    machine = machine or (stages.machine if stages is not None else None) or machine_facts()

    plots: dict[str, Path] = {}
    missing: list[str] = []
    recs = records or []

    def named(*keys: str) -> list[tuple[str, list, list]]:
        series = [(label, key, *metric_series(recs, key)) for label, key in CURVE if key in keys]
        return [(f"{label} ({key})", steps, values) for label, key, steps, values in series if steps]

    plan = {
        "reward": ("Outcome reward per step", [("reward", named(names.REWARD)),
                                               ("EM / F1 / format", named(names.EM, names.F1, names.FORMAT_RATE))]),
        "memory_reward": ("Memory reward per step", [("memory reward", named(names.MEM_REWARD)),
                                                     ("P(answer | context)", named(names.P_MEM, names.P_FULL)),
                                                     ("<mem> keeping the retrieved golds",
                                                      named(names.MEM_KEEPS))]),
        "kl": ("KL to the reference policy", [("KL", named(names.KL)),
                                              ("entropy / clip fraction", named(names.ENTROPY, names.CLIP_FRACTION))]),
    }
    for name, (plot_title, panels) in plan.items():
        path = root / f"{name}.png"
        if _line_plot(path, plot_title, panels):
            plots[name] = path
        else:
            missing.append(f"{name}.png (no such metrics logged)")
    sft_records = found.sft or []
    sft_steps, sft_losses = metric_series(sft_records, names.SFT_LOSS)
    sft_panel = [("loss", [(names.SFT_LOSS, sft_steps, sft_losses)])]
    if sft_steps and _line_plot(root / "sft.png", "SFT cold start", sft_panel):
        plots["sft"] = root / "sft.png"
    path = root / "tokens.png"
    if _tokens_plot(path, {"before": before, "after": after}):
        plots["tokens"] = path
    else:
        missing.append("tokens.png (no evaluation results)")

    lines = [f"# {title}", "", f"Written {time.strftime('%Y-%m-%d %H:%M:%S')} from `{root}`. Every number below "
             "is measured in this run; nothing is copied from the paper.", ""]
    lines += [f"* {note}" for note in notes] + ([""] if notes else [])
    lines += _machine_section(machine)
    lines += _stages_section(stages)
    if sft_losses:
        lines += ["## SFT cold start", "", f"{len(sft_losses)} optimiser steps; loss {sft_losses[0]:.3f} (first) -> "
                  f"{sft_losses[-1]:.3f} (last), mean of the last 10 "
                  f"{sum(sft_losses[-10:]) / len(sft_losses[-10:]):.3f}.", ""]
    lines += _before_after_section(before, after)
    for section in sections:
        lines += list(section)
    lines += _curve_section(records, found.metrics_path)
    if episode_pair is not None:
        lines += _episode_pair_section(*episode_pair)
    lines += ["## Plots", ""]
    for name, path in plots.items():
        lines += [f"![{name}]({path.name})", ""]
    for item in missing:
        lines.append(f"* not written: {item}")
    if missing:
        lines.append("")
    for which, report in (("before", before), ("after", after)):
        if report is not None:
            lines.append(report.markdown(f"Evaluation {which} RL (all cells)"))
    out = Path(out_path) if out_path is not None else root / "report.md"
    out.write_text("\n".join(lines).rstrip() + "\n", encoding="utf-8")
    return ReportResult(out, plots, missing)
