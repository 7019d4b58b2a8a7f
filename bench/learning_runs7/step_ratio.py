"""Seconds per copy-warm-up and SFT step of a config's recipe (40 steps each, THREADS torch threads), for the
ratio of execution 7's recipe to the demo's, measured back to back under the same load (E7's cost estimate).

    PYTHONPATH=. python bench/learning_runs7/step_ratio.py configs/demo.yaml 1
    PYTHONPATH=. python bench/learning_runs7/step_ratio.py configs/demo_k8.yaml 1

Outputs of 2026-12-04: smoke/step_ratio.txt.
"""
import os
import sys
import tempfile
import time
from pathlib import Path

import torch

from mempo.apps import demo
from mempo.eval import held_out_of_training
from mempo.utils.allocator import keep_freed_memory


def main(argv):
    keep_freed_memory()
    cfg = demo.load_demo_config(Path(argv[0]), ["synthetic.copy_warmup_steps=40", "sft.steps=40",
                                                 "sft.max_seconds=null"])
    torch.set_num_threads(int(argv[1]))
    env = demo._world_stage(cfg).value
    cold = demo._oracle_stage(cfg, env, held_out_of_training(env.world, cfg), False).value
    tok = demo._tokenizer_stage(cfg, env.world, cold.trajectories).value
    model = demo._model_stage(cfg, tok).value
    load = os.getloadavg()[0]
    began = time.perf_counter()
    demo._copy_stage(cfg, model, tok, env.world)
    copy = (time.perf_counter() - began) / 40
    with tempfile.TemporaryDirectory() as tmp:
        began = time.perf_counter()
        demo._sft_stage(cfg, model, tok, cold.sft_records, Path(tmp))
        sft = (time.perf_counter() - began) / 40
    print(f"{argv[0]}: copy {copy:.3f} s/step, sft {sft:.3f} s/step (load {load:.1f} -> {os.getloadavg()[0]:.1f})")


if __name__ == "__main__":
    main(sys.argv[1:])
