"""How much the demo's SFT result depends on its seeds: the demo's stages up to the evaluation before
RL (world, held-out split, oracle cold start, tokenizer, model, copy warm-up, SFT; `mempo.apps.demo`'s
own stage functions), for several seeds, with greedy EM at k = 2 (``--ks``) under the memory context.

    python tools/sft_seeds.py --seeds 0 1 2 --out bench/sft_seeds/default.jsonl [overrides ...]
    python tools/sft_seeds.py --config configs/demo_k8.yaml --ks 2 4 8 --seeds 0 1 2 --out rows.jsonl \
        eval.split=validation                   # an SFT gate judged on the validation split

A seed s sets ``synthetic.world_seed``, ``synthetic.model_seed`` and ``synthetic.oracle_drop_seed``
to s (``data.seed`` stays: the evaluation questions are drawn from each world with the same seeds).
``--config``: the configuration (default the demo's, ``configs/demo.yaml``). Each seed's evaluated
episodes are written to ``--episodes-dir``. The held-out splits are the demo's
(`mempo.eval.held_out_of_training`: the test split and, with ``eval.validation_episodes``, the
validation split, every k of ``eval.objectives``); the k of ``--ks`` (each one of ``eval.objectives``)
are evaluated on the split ``eval.split`` names (the row records it), without the closed-book pass.
Torch threads are fixed (``--threads``) and SFT is bounded by its steps only (``sft.max_seconds``
null). One JSON line per finished seed is appended to ``--out``: per evaluated k ``em_k<k>``,
``em_se_k<k>``, ``format_k<k>``, ``turns_k<k>``, ``eval_seconds_k<k>``, ``mem_kinds_k<k>`` and
``right_by_position_k<k>`` (for k = 2 also under the names without the suffix, as rows before
``--ks`` had them); seeds already there (with the same config, overrides and ``--ks``, made on the
same CPU model) are skipped, so an interrupted run continues. Each
line names the CPU model and the instruction set of torch's kernels (`mempo.utils.machine`): the SFT
model follows them (docs/experiments/X1-another-cpu.md), so seeds run on another CPU are another
measurement. With ``--models-dir`` each
seed's SFT model is kept as ``<dir>/<tag>_s<seed>/`` with ``config.yaml`` and ``model_sft/``, the
layout of a demo output (`bench/bench_signal.py --demo-out`, `bench/bench_learning.py --demo-out`),
and its row records the weights' digest (``weights_sha256``, `mempo.utils.digest.weights_digest`).
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
from mempo.config import ConfigError, MempoConfig, dump_config, split_overrides
from mempo.errors import MempoError
from mempo.eval import eval_episodes, evaluate, held_out_of_training
from mempo.protocol.grammar import last_mem
from mempo.protocol.reward import em_check
from mempo.synthetic.oracle_memory import MEMORY_LINE_KINDS, memory_line_kinds
from mempo.utils.digest import weights_digest
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


def seed_config(seed: int, overrides: list[str], config: Path | None = None) -> "MempoConfig":
    """The demo's configuration (`config`; None: the demo's own) for seed s (world, model and
    teacher-drop seeds = s), SFT bounded by its steps only (``sft.max_seconds`` null: the probe measures
    the step-bounded model, whatever else runs on the machine), then `overrides`."""
    return demo.load_demo_config(config, overrides=[f"synthetic.world_seed={seed}", f"synthetic.model_seed={seed}",
                                                    f"synthetic.oracle_drop_seed={seed}", "sft.max_seconds=null",
                                                    *overrides])


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
    """The demo's own stages up to SFT: world, the evaluation episodes of the split ``eval.split`` names
    and the held-out subjects of both splits (`held_out_of_training`), oracle cold start, tokenizer,
    model, copy warm-up (`mempo.apps.demo`'s stage functions)."""
    env = demo._world_stage(cfg).value
    episodes_by_k = eval_episodes(env.world, cfg)
    held_out = held_out_of_training(env.world, cfg)
    cold = demo._oracle_stage(cfg, env, held_out, False).value
    tokenizer = demo._tokenizer_stage(cfg, env.world, cold.trajectories).value
    model = demo._model_stage(cfg, tokenizer).value
    copy_losses = []
    if cfg.synthetic.copy_warmup_steps:
        copy_losses = demo._copy_stage(cfg, model, tokenizer, env.world).value.losses
    return BeforeSFT(env, episodes_by_k, held_out, cold, tokenizer, model, copy_losses)


def tail_mean(losses: list[float], last: int = 50) -> float:
    """The mean of the last `last` losses (all when fewer; 0.0 for none), to 3 places: a row's ``copy_loss_last50``."""
    tail = losses[-last:]
    return round(sum(tail) / max(1, len(tail)), 3)


def check_ks(cfg: "MempoConfig", ks: list[int]) -> None:
    """ConfigError naming ``--ks`` unless every k is one of ``eval.objectives`` (only those are held out)."""
    outside = [k for k in ks if k not in cfg.eval.objectives]
    if outside or not ks:
        raise ConfigError("--ks", f"k={outside or ks} is not among eval.objectives {list(cfg.eval.objectives)}, "
                                  "whose episodes alone are held out of SFT")


def episodes_file(episodes_dir: Path, tag: str, k: int) -> Path:
    """Where the evaluated episodes of k go: ``<dir>/<tag>.jsonl`` for k = 2 (the name before
    ``--ks``), ``<dir>/<tag>_k<k>.jsonl`` otherwise."""
    return episodes_dir / (f"{tag}.jsonl" if k == 2 else f"{tag}_k{k}.jsonl")


def run_seed(seed: int, overrides: list[str], episodes_dir: Path, tag: str, threads: int,
             model_dir: Path | None = None, ks: tuple[int, ...] = (2,), config: Path | None = None) -> dict:
    cfg = seed_config(seed, overrides, config)
    check_ks(cfg, list(ks))
    threads = demo._set_threads(threads)
    began = time.perf_counter()
    env, episodes_by_k, held_out, cold, tokenizer, model, copy_losses = before_sft(cfg)
    with tempfile.TemporaryDirectory() as tmp:
        sft = demo._sft_stage(cfg, model, tokenizer, cold.sft_records, Path(tmp)).value
    sft_seconds = time.perf_counter() - began
    weights = None
    if model_dir is not None:  # a demo output's layout: the run's configuration and its SFT model
        model_dir.mkdir(parents=True, exist_ok=True)
        dump_config(cfg, model_dir / "config.yaml")
        demo._save_model(model_dir / "model_sft", model, tokenizer)
        weights = weights_digest(model_dir / "model_sft")
    eval_cfg = dataclasses.replace(cfg, eval=dataclasses.replace(cfg.eval, closed_book=False))
    per_k: dict[str, Any] = {}
    for k in ks:
        path = episodes_file(episodes_dir, tag, k)
        report = evaluate(model, tokenizer, {k: episodes_by_k[k]}, env.retriever, eval_cfg, label="sft",
                          log=lambda _: None, show_progress=False, trajectories_path=path)
        row = report.rows[0]
        per_k.update({f"em_k{k}": row.em, f"em_se_k{k}": row.em_se, f"format_k{k}": row.format_rate,
                      f"turns_k{k}": row.mean_turns, f"eval_seconds_k{k}": row.seconds,
                      f"mem_kinds_k{k}": mem_kinds(path), f"right_by_position_k{k}": right_by_position(path)})
        if k == 2:  # the names rows had before --ks
            per_k.update({"eval_seconds": row.seconds, "mem_kinds": per_k["mem_kinds_k2"],
                          "right_by_position": per_k["right_by_position_k2"]})
    return {"seed": seed, "overrides": overrides, "config": None if config is None else str(config),
            "ks": list(ks), "split": cfg.eval.split, "weights_sha256": weights, **per_k,
            "copy_loss_last50": tail_mean(copy_losses), "copy_steps": len(copy_losses),
            "sft_steps": sft["steps"], "sft_last_loss": sft["last_loss"],
            "sft_time_bound": sft["time_bound"], "seconds_to_sft_end": round(sft_seconds, 1),
            "seconds": round(time.perf_counter() - began, 1), "threads": threads,
            "load_start": os.getloadavg()[0], **cpu_facts()}


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
    parser.add_argument("--config", type=Path, default=None, help="the configuration (default: the demo's)")
    parser.add_argument("--ks", type=int, nargs="+", default=[2],
                        help="the k evaluated after SFT (each one of eval.objectives; default 2)")
    overrides, rest = split_overrides(argv)
    args = parser.parse_args(rest)
    args.overrides = overrides
    keep_freed_memory()  # the demo's allocator setting: bit-identical floats, faster steps
    rows = [json.loads(line) for line in args.out.read_text().splitlines()] if args.out.exists() else []
    here = cpu_facts().get("cpu_model")  # rows from before the CPU was recorded count as this CPU's
    config = None if args.config is None else str(args.config)
    done = {row["seed"] for row in rows if row["overrides"] == args.overrides and row.get("cpu_model", here) == here
            and row.get("config") == config and row.get("ks", [2]) == args.ks}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    try:
        check_ks(seed_config(0, args.overrides, args.config), args.ks)  # a bad k, config or override: before any run
    except MempoError as error:
        print(f"sft_seeds: {error}", file=sys.stderr)
        return 2
    for seed in args.seeds:
        if seed in done:
            continue
        tag = f"{'' if args.config is None else args.config.stem + '_'}{episodes_tag(args.overrides)}_s{seed}"
        row = run_seed(seed, args.overrides, args.episodes_dir, tag, args.threads,
                       None if args.models_dir is None else args.models_dir / tag, tuple(args.ks), args.config)
        print(json.dumps(row), flush=True)
        with args.out.open("a") as f:
            f.write(json.dumps(row) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
