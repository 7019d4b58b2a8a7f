"""Seconds per copy-warm-up and SFT step of a recipe (STEPS steps each, one torch thread), with the size of its SFT
data, for execution 8's cost estimate (docs/experiments/E8-ablation-execution-8.md). Run E7's and E8's recipes side
by side, as the gate runs its jobs (two of one thread on 2 cores):

    PYTHONPATH=. python bench/learning_runs8/step_cost.py configs/demo_k8.yaml 60 &
    PYTHONPATH=. python bench/learning_runs8/step_cost.py configs/demo_k8_e8.yaml 60; wait

The SFT seconds exclude building the data (`run_sft`'s ``seconds``); the copy warm-up runs its first STEPS steps
(no loss target). Outputs: smoke/step_cost.txt.
"""
import os
import sys
import tempfile
import time
from pathlib import Path

import torch

from mempo.apps import demo
from mempo.eval import held_out_of_training
from mempo.train.sft import examples_from_trajectories
from mempo.utils.allocator import keep_freed_memory


def main(argv):
    keep_freed_memory()
    steps = int(argv[1])
    cfg = demo.load_demo_config(Path(argv[0]), [f"synthetic.copy_warmup_steps={steps}", f"sft.steps={steps}",
                                                 "synthetic.copy_warmup_until_loss=null", "sft.max_seconds=null"])
    torch.set_num_threads(1)
    began = time.perf_counter()
    env = demo._world_stage(cfg).value
    cold = demo._oracle_stage(cfg, env, held_out_of_training(env.world, cfg), False).value
    tok = demo._tokenizer_stage(cfg, env.world, cold.trajectories).value
    model = demo._model_stage(cfg, tok).value
    examples = examples_from_trajectories(cold.sft_records, tok, chat_template=cfg.rollout.chat_template)
    setup = time.perf_counter() - began
    load = os.getloadavg()[0]
    copy = demo._copy_stage(cfg, model, tok, env.world).value
    with tempfile.TemporaryDirectory() as tmp:
        sft = demo._sft_stage(cfg, model, tok, cold.sft_records, Path(tmp)).value
    params = sum(p.numel() for p in model.parameters())
    print(f"{argv[0]}: {model.config.num_hidden_layers} layers, {params / 1e6:.2f} M parameters; copy "
          f"{copy.seconds / steps:.3f} s/step, sft {sft['seconds'] / steps:.3f} s/step ({steps} steps each, 1 thread); "
          f"SFT data {len(examples)} sequences, {sum(len(e.input_ids) for e in examples)} ids; setup {setup:.0f} s "
          f"(load {load:.1f} -> {os.getloadavg()[0]:.1f})", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
