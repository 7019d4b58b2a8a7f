"""How much the demo's SFT result depends on its seeds: the demo's stages up to the evaluation before
RL (world, held-out split, oracle cold start, tokenizer, model, copy warm-up, SFT; `mempo.apps.demo`'s
own stage functions), for several seeds, with greedy EM at k = 2 under the memory context.

    python tools/sft_seeds.py --seeds 0 1 2 --out bench/sft_seeds/default.jsonl [overrides ...]

A seed s sets ``synthetic.world_seed``, ``synthetic.model_seed`` and ``synthetic.oracle_drop_seed``
to s (``data.seed`` stays: the evaluation questions are drawn from each world with the same seeds).
Each seed's evaluated episodes are written to ``--episodes-dir``. The held-out split is the demo's (every k of ``eval.objectives``); only k = 2 is evaluated, without
the closed-book pass. One JSON line per finished seed is appended to ``--out``; seeds already there
(with the same overrides) are skipped, so an interrupted run continues.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

from mempo.apps import demo
from mempo.eval import eval_episodes, evaluate
from mempo.synthetic.heldout import held_out_subjects


def run_seed(seed: int, overrides: list[str], episodes_path: Path) -> dict:
    cfg = demo.load_demo_config(overrides=[f"synthetic.world_seed={seed}", f"synthetic.model_seed={seed}",
                                           f"synthetic.oracle_drop_seed={seed}", *overrides])
    threads = demo._set_threads(cfg.synthetic.torch_threads)
    began = time.perf_counter()
    env = demo._world_stage(cfg).value
    episodes_by_k = eval_episodes(env.world, cfg)
    held_out = held_out_subjects(episodes_by_k)
    cold = demo._oracle_stage(cfg, env, held_out, False).value
    tokenizer = demo._tokenizer_stage(cfg, env.world, cold.trajectories).value
    model = demo._model_stage(cfg, tokenizer).value
    if cfg.synthetic.copy_warmup_steps:
        demo._copy_stage(cfg, model, tokenizer, env.world)
    with tempfile.TemporaryDirectory() as tmp:
        sft = demo._sft_stage(cfg, model, tokenizer, cold.trajectories + cold.copy_records, Path(tmp)).value
    sft_seconds = time.perf_counter() - began
    eval_cfg = demo.load_demo_config(overrides=[*overrides, "eval.closed_book=false"])
    report = evaluate(model, tokenizer, {2: episodes_by_k[2]}, env.retriever, eval_cfg, label="sft", log=lambda _: None,
                      show_progress=False, trajectories_path=episodes_path)
    row = report.rows[0]
    return {"seed": seed, "overrides": overrides, "em_k2": row.em, "em_se_k2": row.em_se, "format_k2": row.format_rate,
            "turns_k2": row.mean_turns, "eval_seconds": row.seconds, "sft_steps": sft["steps"], "sft_last_loss": sft["last_loss"],
            "sft_time_bound": sft["time_bound"], "seconds_to_sft_end": round(sft_seconds, 1),
            "seconds": round(time.perf_counter() - began, 1), "threads": threads,
            "load_start": os.getloadavg()[0]}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--episodes-dir", type=Path, default=Path("scratch/sft_seeds"),
                        help="each seed's evaluated episodes (EpisodeRecord jsonl) go here")
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args(argv)
    done = set()
    if args.out.exists():
        done = {r["seed"] for r in map(json.loads, args.out.read_text().splitlines()) if r["overrides"] == args.overrides}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    for seed in args.seeds:
        if seed in done:
            continue
        tag = "_".join(o.replace("=", "-") for o in args.overrides) or "default"
        row = run_seed(seed, args.overrides, args.episodes_dir / f"{tag}_s{seed}.jsonl")
        print(json.dumps(row), flush=True)
        with args.out.open("a") as f:
            f.write(json.dumps(row) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
