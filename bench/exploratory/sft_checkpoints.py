"""Exploratory (issue 20): how EM at k = 2 moves along one SFT run, and whether a validation set drawn from
the training questions tracks it (what choosing the SFT checkpoint by validation would need). The demo's
stages for one seed as `tools/sft_seeds.py` runs them (same configuration, threads, allocator), SFT with a
checkpoint every --every steps, then each checkpoint evaluated greedily at k = 2 on the demo's held-out
evaluation episodes (128) and on --val validation episodes of training questions (`training_episodes`, question
seed 1000 + data.seed, no held-out subject). The last checkpoint is the model sft_seeds.py reports.

    PYTHONPATH=. python bench/exploratory/sft_checkpoints.py --seed 0 --out OUT.jsonl [overrides ...]
"""
import argparse
import dataclasses
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools"))
import sft_seeds  # noqa: E402
from mempo.apps import demo  # noqa: E402
from mempo.eval import evaluate  # noqa: E402
from mempo.synthetic.heldout import training_episodes  # noqa: E402
from mempo.train.checkpoint import load_checkpoint  # noqa: E402
from mempo.train.sft import run_sft  # noqa: E402
from mempo.utils.allocator import keep_freed_memory  # noqa: E402

parser = argparse.ArgumentParser()
parser.add_argument("--seed", type=int, default=0)
parser.add_argument("--every", type=int, default=400)
parser.add_argument("--val", type=int, default=128)
parser.add_argument("--out", type=Path, required=True)
parser.add_argument("overrides", nargs="*")
args = parser.parse_args()
keep_freed_memory()
cfg = sft_seeds.seed_config(args.seed, [f"trainer.save_every={args.every}", "trainer.keep_last=null", *args.overrides])
demo._set_threads(2)
env, episodes_by_k, held_out, cold, tokenizer, model, _ = sft_seeds.before_sft(cfg)
val = training_episodes(env.world, 2, args.val, 1000 + cfg.data.seed, held_out)
eval_cfg = dataclasses.replace(cfg, eval=dataclasses.replace(cfg.eval, closed_book=False))
with tempfile.TemporaryDirectory() as tmp:
    run_sft(cfg, model, tokenizer, cold.sft_records, seed=cfg.synthetic.model_seed, checkpoint_root=Path(tmp))
    for ckpt in sorted(Path(tmp).glob("step_*"), key=lambda p: int(p.name.split("_")[1])):
        load_checkpoint(ckpt, model, restore_rng=False)
        model.eval()
        row = {"seed": args.seed, "overrides": args.overrides, "step": int(ckpt.name.split("_")[1]),
               **sft_seeds.cpu_facts()}
        for name, episodes in (("eval", episodes_by_k[2]), ("val", val)):
            began = time.perf_counter()
            with tempfile.TemporaryDirectory() as tmp2:
                rep = evaluate(model, tokenizer, {2: episodes}, env.retriever, eval_cfg, label=name, log=lambda _: None,
                               show_progress=False, trajectories_path=Path(tmp2) / "e.jsonl")
                kinds = sft_seeds.mem_kinds(Path(tmp2) / "e.jsonl")
            r = rep.rows[0]
            row.update({f"{name}_em": r.em, f"{name}_se": r.em_se, f"{name}_format": r.format_rate,
                        f"{name}_gold": kinds["gold"], f"{name}_dropped": kinds["dropped"],
                        f"{name}_seconds": round(time.perf_counter() - began, 1)})
        print(json.dumps(row), flush=True)
        with args.out.open("a") as f:
            f.write(json.dumps(row) + "\n")
