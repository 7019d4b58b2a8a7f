"""The ablation: does the memory reward help? From one SFT checkpoint, RL with

    grpo            algorithm.memory_weight = 0       (the outcome reward only)
    mempo           algorithm.memory_weight = 1, scoring.threshold = 0.5 (outcome + memory reward; set
                    explicitly: the demo config's own threshold is null)
    mempo_nothresh  memory_weight = 1, scoring.threshold = null (every answer token counts)

for several seeds each, equal RL steps and questions, then evaluation under the memory context at
the demo's evaluated k (its ``eval.objectives``; with k = 6 in it, beyond the trained k, as the
paper does): EM, F1, prompt tokens per episode; means and standard deviations over seeds; one plot.

Held out: the evaluation asks only about entities no SFT or RL question asks about
(`mempo.synthetic.heldout`). The SFT model is the demo's, whose data left out the subjects of the
demo's evaluation (``eval.objectives`` x ``eval.episodes``); an evaluation here (``--ks``,
``--episodes``) asking about any other entity is refused before anything runs (run the demo with
``eval.objectives=[2,4,6]`` to evaluate k = 6 here), and the RL questions leave out both sets.

Run (after the demo, whose output holds the SFT model and the configuration):

    bash tools/demo.sh                                   # writes demo_out/ (model_sft, config.yaml)
    .venv-test/bin/python bench/bench_learning.py --demo-out demo_out --out bench_learning_out

Options: --seeds (default 0 1 2), --steps (RL steps per run; default the demo config's
trainer.total_steps), --ks (default the demo config's eval.objectives), --episodes (evaluation episodes per k; default the
config's eval.episodes), --variants, and dotted config overrides (``key=value``, anywhere). Writes
``<out>/results.json`` (every run's rows and training totals), ``<out>/results.md`` (the table) and
``<out>/ablation.png``.

Seeds: run seed s sets ``rollout.seed = s`` (the training rollouts' sampling) and ``torch`` 's
global seed; the training questions (`mempo.apps.demo.rl_episodes`) and the evaluation episodes
(`mempo.eval.eval_episodes`, question seed from ``data.seed``) are the same for every run, and
evaluation is greedy, so the seeds vary exactly the RL. Every run starts from the same saved SFT
weights.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Optional, Sequence

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from mempo.apps.demo import rl_episodes
from mempo.config import MempoConfig, load_config, split_overrides
from mempo.synthetic.build import build_world
from mempo.synthetic.heldout import held_out_subjects
from mempo.eval import eval_episodes, evaluate
from mempo.train.logging import read_metrics
from mempo.train.metric_names import TOKENS
from mempo.train.trainer import train

VARIANTS = {
    "grpo": {"algorithm.memory_weight": 0.0},
    "mempo": {"algorithm.memory_weight": 1.0, "scoring.threshold": 0.5},
    "mempo_nothresh": {"algorithm.memory_weight": 1.0, "scoring.threshold": None},
}
METRICS = ("em", "f1", "prompt_tokens_per_episode")


def _variant_config(cfg: MempoConfig, variant: str, seed: int, steps: int, out_dir: Path) -> MempoConfig:
    settings = VARIANTS[variant]
    algorithm = dataclasses.replace(cfg.algorithm, memory_weight=settings["algorithm.memory_weight"])
    scoring = cfg.scoring
    if "scoring.threshold" in settings:
        scoring = dataclasses.replace(scoring, threshold=settings["scoring.threshold"])
    return dataclasses.replace(
        cfg, algorithm=algorithm, scoring=scoring, rollout=dataclasses.replace(cfg.rollout, seed=seed),
        trainer=dataclasses.replace(cfg.trainer, total_steps=steps, out_dir=str(out_dir), save_every=0,
                                    eval_every=0, progress=False, resume="never"))


def _rows(report: Any, ks: Sequence[int]) -> dict[str, dict[str, float]]:
    rows = {}
    for k in ks:
        row = report.row(k, "memory")
        rows[str(k)] = {m: float(getattr(row, m)) for m in METRICS}
    return rows


def _mean_std(values: Sequence[float]) -> tuple[float, float]:
    return statistics.fmean(values), (statistics.stdev(values) if len(values) > 1 else 0.0)


class NotHeldOut(ValueError):
    """The evaluation asks about entities the demo's SFT data may have asked about."""


def check_held_out(sft_held_out: frozenset[str], eval_held_out: frozenset[str]) -> None:
    """NotHeldOut unless every subject of this evaluation (`eval_held_out`) was held out of the SFT
    data (`sft_held_out`: the demo's evaluation subjects)."""
    missing = eval_held_out - sft_held_out
    if missing:
        raise NotHeldOut(f"{len(missing)} of the {len(eval_held_out)} entities this evaluation asks about were not "
                         "held out of the demo's SFT data (its eval.objectives x eval.episodes); evaluate the demo's "
                         "k and episodes (--ks / --episodes) or rerun the demo with them in eval.objectives / "
                         "eval.episodes")


def run(demo_out: Path, out: Path, *, seeds: Sequence[int], steps: Optional[int], ks: Optional[Sequence[int]],
        episodes: Optional[int], variants: Sequence[str], overrides: Sequence[str] = ()) -> dict[str, Any]:
    cfg = load_config(demo_out / "config.yaml", list(overrides))
    sft_model = demo_out / "model_sft"
    steps = int(steps if steps is not None else cfg.trainer.total_steps)
    ks = [int(k) for k in (ks if ks is not None else cfg.eval.objectives)]
    env = build_world(cfg)
    episodes_by_k = eval_episodes(env.world, cfg, num_episodes=episodes, objectives=ks)
    sft_held_out = held_out_subjects(eval_episodes(env.world, cfg))  # what the demo's SFT data left out
    eval_held_out = held_out_subjects(episodes_by_k)
    check_held_out(sft_held_out, eval_held_out)
    training = rl_episodes(cfg, env.world, sft_held_out | eval_held_out, steps)
    tokenizer = AutoTokenizer.from_pretrained(sft_model)
    out.mkdir(parents=True, exist_ok=True)
    results: dict[str, Any] = {"demo_out": str(demo_out), "steps": steps, "seeds": list(seeds), "ks": list(ks),
                               "episodes": len(next(iter(episodes_by_k.values()))),
                               "questions_per_step": cfg.data.questions_per_step,
                               "group_size": cfg.rollout.group_size, "runs": []}

    def log(line: str) -> None:
        print(line, flush=True)

    began = time.perf_counter()
    model = AutoModelForCausalLM.from_pretrained(sft_model)
    report = evaluate(model, tokenizer, episodes_by_k, env.retriever, cfg, show_progress=False, log=lambda s: None)
    results["sft"] = _rows(report, ks)
    log(f"sft: {results['sft']}")
    for variant in variants:
        for seed in seeds:
            torch.manual_seed(seed)
            run_dir = out / variant / f"seed{seed}"
            run_cfg = _variant_config(cfg, variant, seed, steps, run_dir)
            model = AutoModelForCausalLM.from_pretrained(sft_model)
            start = time.perf_counter()
            trained = train(run_cfg, model=model, tokenizer=tokenizer, episodes=training, retriever=env.retriever,
                            out_dir=str(run_dir))
            rl_seconds = time.perf_counter() - start
            metrics = read_metrics(run_dir / "metrics.jsonl")
            report = evaluate(trained.model, tokenizer, episodes_by_k, env.retriever, run_cfg, show_progress=False,
                              log=lambda s: None)
            record = {"variant": variant, "seed": seed, "rl_seconds": rl_seconds,
                      "trained_tokens": sum(float(r.get(TOKENS, 0.0)) for r in metrics), "rows": _rows(report, ks)}
            results["runs"].append(record)
            log(f"{variant} seed {seed}: {record['rows']} ({rl_seconds:.0f} s RL, "
                f"{time.perf_counter() - began:.0f} s so far)")
            (out / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    results["seconds"] = time.perf_counter() - began
    results["table"] = _table(results, variants, ks)
    (out / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    (out / "results.md").write_text(results["table"] + "\n")
    _plot(results, variants, ks, out / "ablation.png")
    return results


def _table(results: dict[str, Any], variants: Sequence[str], ks: Sequence[int]) -> str:
    n = len(results["seeds"])
    lines = [f"| variant | k | EM (mean ± std, {n} seeds) | F1 | prompt tokens / episode | trained tokens |",
             "|---|---|---|---|---|---|"]
    for k in ks:
        sft = results["sft"][str(k)]
        lines.append(f"| SFT (no RL) | {k} | {sft['em']:.3f} | {sft['f1']:.3f} | "
                     f"{sft['prompt_tokens_per_episode']:.0f} | - |")
    for variant in variants:
        runs = [r for r in results["runs"] if r["variant"] == variant]
        if not runs:
            continue
        tokens, _ = _mean_std([r["trained_tokens"] for r in runs])
        for k in ks:
            cells = []
            for metric, fmt in (("em", "{:.3f} ± {:.3f}"), ("f1", "{:.3f} ± {:.3f}"),
                                ("prompt_tokens_per_episode", "{:.0f} ± {:.0f}")):
                mean, std = _mean_std([r["rows"][str(k)][metric] for r in runs])
                cells.append(fmt.format(mean, std))
            lines.append(f"| {variant} | {k} | " + " | ".join(cells) + f" | {tokens:.0f} |")
    return "\n".join(lines)


def _plot(results: dict[str, Any], variants: Sequence[str], ks: Sequence[int], path: Path) -> None:
    try:
        import matplotlib  # reason: optional (the demo extra); the table is written without it
    except ImportError:
        return
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # reason: as above

    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot(ks, [results["sft"][str(k)]["em"] for k in ks], "k--", marker="o", label="SFT (no RL)")
    for variant in variants:
        runs = [r for r in results["runs"] if r["variant"] == variant]
        if not runs:
            continue
        stats = [_mean_std([r["rows"][str(k)]["em"] for r in runs]) for k in ks]
        ax.errorbar(ks, [m for m, _ in stats], yerr=[s for _, s in stats], marker="o", capsize=3, label=variant)
    ax.set_xlabel("objectives k (memory context)")
    ax.set_ylabel("EM")
    ax.set_title(f"RL from one SFT model, {len(results['seeds'])} seeds, {results['steps']} steps")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--demo-out", type=Path, default=Path("demo_out"))
    parser.add_argument("--out", type=Path, default=Path("bench_learning_out"))
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--steps", type=int, default=None)
    parser.add_argument("--ks", type=int, nargs="+", default=None, help="default: the config's eval.objectives")
    parser.add_argument("--episodes", type=int, default=None)
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    parser.add_argument("overrides", nargs="*", help="dotted config overrides (key=value), anywhere on the line")
    overrides, rest = split_overrides(sys.argv[1:] if argv is None else argv)
    args = parser.parse_args(rest)
    args.overrides = overrides
    if args.threads:
        torch.set_num_threads(args.threads)
    try:
        results = run(args.demo_out, args.out, seeds=args.seeds, steps=args.steps, ks=args.ks,
                      episodes=args.episodes, variants=args.variants, overrides=args.overrides)
    except NotHeldOut as error:
        print(f"bench_learning: {error}", file=sys.stderr)
        return 2
    print(results["table"])
    print(f"{results['seconds']:.0f} s; {args.out / 'results.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
