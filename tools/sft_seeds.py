"""How much the demo's SFT result depends on its seeds: the demo's stages up to the evaluation before
RL (world, held-out split, oracle cold start, tokenizer, model, copy warm-up, SFT; `mempo.apps.demo`'s
own stage functions), for several seeds, with greedy EM at k = 2 under the memory context.

    python tools/sft_seeds.py --seeds 0 1 2 --out bench/sft_seeds/default.jsonl [overrides ...]

A seed s sets ``synthetic.world_seed``, ``synthetic.model_seed`` and ``synthetic.oracle_drop_seed``
to s (``data.seed`` stays: the evaluation questions are drawn from each world with the same seeds).
Each seed's evaluated episodes are written to ``--episodes-dir``. The held-out split is the demo's
(every k of ``eval.objectives``); only k = 2 is evaluated, without the closed-book pass. Torch threads
are fixed (``--threads``) and SFT is bounded by its steps only (``sft.max_seconds`` null). One JSON line
per finished seed is appended to ``--out``; seeds already there (with the same overrides, made on the
same CPU model) are skipped, so an interrupted run continues. Each line names the CPU model and the
instruction set of torch's kernels (`mempo.utils.machine`): the SFT model follows them
(docs/experiments/X1-another-cpu.md), so seeds run on another CPU are another measurement. With
``--models-dir`` each seed's SFT model is kept as ``<dir>/<tag>_s<seed>/`` with ``config.yaml`` and
``model_sft/``, the layout of a demo output (`bench/bench_signal.py --demo-out`,
`bench/bench_learning.py --demo-out`).
"""
from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, NamedTuple

from mempo.apps import demo
from mempo.utils.allocator import keep_freed_memory
from mempo.config import MempoConfig, dump_config
from mempo.eval import eval_episodes, evaluate
from mempo.protocol.grammar import last_mem
from mempo.protocol.reward import em_check
from mempo.synthetic.oracle_memory import MEMORY_LINE_KINDS, memory_line_kinds
from mempo.synthetic.heldout import held_out_subjects
from mempo.utils.machine import machine_facts


def episodes_tag(overrides: list[str]) -> str:
    """The file-name tag of a run's episode records: its overrides joined (``default`` for none), cut
    to 60 characters plus a digest of the whole when longer (file names have a length limit)."""
    joined = "_".join(o.replace("=", "-").replace("/", "-") for o in overrides) or "default"
    if len(joined) <= 80:
        return joined
    return f"{joined[:60]}-{hashlib.sha256(joined.encode()).hexdigest()[:10]}"


def mem_kinds(episodes_path: Path) -> dict[str, float]:
    """Shares of the objectives by what the last ``<mem>`` of their episode holds for them
    (`memory_line_kinds`: gold, dropped, other text, pending), from an evaluation's episode records."""
    counts = dict.fromkeys(MEMORY_LINE_KINDS, 0)
    for line in episodes_path.read_text().splitlines():
        record = json.loads(line)
        for kind in memory_line_kinds(last_mem(r["assistant"] for r in record["rounds"]), record["golds"]):
            counts[kind] += 1
    total = max(1, sum(counts.values()))
    return {kind: round(n / total, 3) for kind, n in counts.items()}


def right_by_position(episodes_path: Path) -> list[float]:
    """Share of the episodes whose answer to objective i (0-based position i of the answer) is right
    (`em_check` against that objective's golds), per position, from an evaluation's episode records.
    The demo's agents of the line answer template scored 0 at position 0 (docs/experiments/T14-first-question.md)."""
    records = [json.loads(line) for line in episodes_path.read_text().splitlines()]
    width = max((len(r["golds"]) for r in records), default=0)
    right = [0] * width
    for record in records:
        predictions = list(record.get("predictions") or []) + [None] * len(record["golds"])
        for i, golds in enumerate(record["golds"]):
            right[i] += em_check(predictions[i], golds)
    return [round(n / max(1, len(records)), 3) for n in right]


def seed_config(seed: int, overrides: list[str]) -> "MempoConfig":
    """The demo's configuration for seed s (world, model and teacher-drop seeds = s), SFT bounded by its
    steps only (``sft.max_seconds`` null: the probe measures the step-bounded model, whatever else runs on
    the machine), then `overrides`."""
    return demo.load_demo_config(overrides=[f"synthetic.world_seed={seed}", f"synthetic.model_seed={seed}",
                                            f"synthetic.oracle_drop_seed={seed}", "sft.max_seconds=null", *overrides])


class BeforeSFT(NamedTuple):
    """What the demo's stages make before SFT (`before_sft`)."""
    env: Any
    episodes_by_k: dict
    held_out: frozenset
    cold: Any
    tokenizer: Any
    model: Any
    copy_losses: list


def before_sft(cfg) -> BeforeSFT:
    """The demo's own stages up to SFT: world, evaluation episodes and their held-out subjects, oracle
    cold start, tokenizer, model, copy warm-up (`mempo.apps.demo`'s stage functions)."""
    env = demo._world_stage(cfg).value
    episodes_by_k = eval_episodes(env.world, cfg)
    held_out = held_out_subjects(episodes_by_k)
    cold = demo._oracle_stage(cfg, env, held_out, False).value
    tokenizer = demo._tokenizer_stage(cfg, env.world, cold.trajectories).value
    model = demo._model_stage(cfg, tokenizer).value
    copy_losses = []
    if cfg.synthetic.copy_warmup_steps:
        copy_losses = demo._copy_stage(cfg, model, tokenizer, env.world).value.losses
    return BeforeSFT(env, episodes_by_k, held_out, cold, tokenizer, model, copy_losses)


def run_seed(seed: int, overrides: list[str], episodes_path: Path, threads: int,
             model_dir: Path | None = None) -> dict:
    cfg = seed_config(seed, overrides)
    threads = demo._set_threads(threads)
    began = time.perf_counter()
    env, episodes_by_k, held_out, cold, tokenizer, model, copy_losses = before_sft(cfg)
    with tempfile.TemporaryDirectory() as tmp:
        sft = demo._sft_stage(cfg, model, tokenizer, cold.sft_records, Path(tmp)).value
    sft_seconds = time.perf_counter() - began
    if model_dir is not None:  # a demo output's layout: the run's configuration and its SFT model
        model_dir.mkdir(parents=True, exist_ok=True)
        dump_config(cfg, model_dir / "config.yaml")
        demo._save_model(model_dir / "model_sft", model, tokenizer)
    eval_cfg = dataclasses.replace(cfg, eval=dataclasses.replace(cfg.eval, closed_book=False))
    report = evaluate(model, tokenizer, {2: episodes_by_k[2]}, env.retriever, eval_cfg, label="sft", log=lambda _: None,
                      show_progress=False, trajectories_path=episodes_path)
    row = report.rows[0]
    return {"seed": seed, "overrides": overrides, "em_k2": row.em, "em_se_k2": row.em_se, "format_k2": row.format_rate,
            "turns_k2": row.mean_turns, "eval_seconds": row.seconds,
            "copy_loss_last50": round(sum(copy_losses[-50:]) / max(1, len(copy_losses[-50:])), 3),
            "sft_steps": sft["steps"], "sft_last_loss": sft["last_loss"],
            "sft_time_bound": sft["time_bound"], "seconds_to_sft_end": round(sft_seconds, 1),
            "seconds": round(time.perf_counter() - began, 1), "threads": threads,
            "load_start": os.getloadavg()[0], "mem_kinds": mem_kinds(episodes_path),
            "right_by_position": right_by_position(episodes_path), **cpu_facts()}


def cpu_facts() -> dict[str, str]:
    """This machine's CPU model and torch's kernel instruction set (`machine_facts`), as a row records them."""
    facts = machine_facts()
    return {key: str(facts[key]) for key in ("cpu_model", "cpu_capability") if key in facts}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--threads", type=int, default=2,
                        help="torch threads (fixed, so the floats do not follow the machine's load; default 2)")
    parser.add_argument("--episodes-dir", type=Path, default=Path("scratch/sft_seeds"),
                        help="each seed's evaluated episodes (EpisodeRecord jsonl) go here")
    parser.add_argument("--models-dir", type=Path, default=None,
                        help="keep each seed's SFT model here, as <dir>/<tag>_s<seed>/{config.yaml,model_sft}")
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args(argv)
    keep_freed_memory()  # the demo's allocator setting: bit-identical floats, faster steps
    rows = [json.loads(line) for line in args.out.read_text().splitlines()] if args.out.exists() else []
    here = cpu_facts().get("cpu_model")  # rows from before the CPU was recorded count as this CPU's
    done = {row["seed"] for row in rows if row["overrides"] == args.overrides and row.get("cpu_model", here) == here}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    for seed in args.seeds:
        if seed in done:
            continue
        tag = f"{episodes_tag(args.overrides)}_s{seed}"
        row = run_seed(seed, args.overrides, args.episodes_dir / f"{tag}.jsonl", args.threads,
                       None if args.models_dir is None else args.models_dir / tag)
        print(json.dumps(row), flush=True)
        with args.out.open("a") as f:
            f.write(json.dumps(row) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
