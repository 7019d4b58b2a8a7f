"""The C allocator setting (`mempo.utils.allocator.keep_freed_memory`) on the demo's training steps:
seconds per step of the copy warm-up's step (32 rows of ``s + s``, |s| = 16) and of an SFT-sized
step (8 rows x 256 tokens, loss on every position), for the demo's model (Qwen2 'mini', 4,096 ids,
tied embeddings, fp32), each setting in a fresh interpreter, alternating, ``--repeats`` times.
The losses of both settings are compared for exact equality. With ``--demo``: the demo's own steps
instead (its world, oracle data, tokenizer and model; 200 copy warm-up steps, then the first 420 SFT
steps of `mempo.train.sft.run_sft` after 20 untimed ones), whose logits stay below glibc's 32 MiB
dynamic mmap threshold.

    python bench/bench_allocator.py [--steps 30] [--repeats 3] [--threads 2] [--demo]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

# One interpreter's measurement: {"copy": s/step, "sft": s/step, "losses": [...]}
PROBE = """
import json, random, sys, time
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM
from mempo.model.builtin import SIZES
from mempo.utils.allocator import keep_freed_memory
mode, steps, threads = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
if mode == "keep":
    keep_freed_memory()
torch.set_num_threads(threads)
torch.manual_seed(0)
model = Qwen2ForCausalLM(Qwen2Config(vocab_size=4096, max_position_embeddings=2048, tie_word_embeddings=True,
                                     **SIZES["mini"])).float().train()
opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.0)
rng = random.Random(0)
losses = []

def train(ids, first):
    logits = model(input_ids=ids).logits
    loss = torch.nn.functional.cross_entropy(logits[:, first:-1].reshape(-1, 4096), ids[:, first + 1:].reshape(-1))
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    losses.append(loss.item())

def copy_step():  # the copy warm-up's step (mempo.synthetic.copy_warmup)
    halves = [[rng.randrange(4096) for _ in range(16)] for _ in range(32)]
    train(torch.tensor([h + h for h in halves]), 15)

def sft_step():  # about sft.batch_tokens = 2048 tokens, every position trained
    train(torch.tensor([[rng.randrange(4096) for _ in range(256)] for _ in range(8)]), 0)

out = {}
for name, step in (("copy", copy_step), ("sft", sft_step)):
    for _ in range(5):
        step()
    began = time.perf_counter()
    for _ in range(steps):
        step()
    out[name] = (time.perf_counter() - began) / steps
out["losses"] = losses
print(json.dumps(out))
"""


# The demo's steps: {"copy": s/step, "sft": s/step, "losses": [the SFT losses]}
DEMO_PROBE = """
import json, sys, time
from mempo.apps import demo
from mempo.eval import held_out_of_training
from mempo.train.sft import run_sft
from mempo.utils.allocator import keep_freed_memory
mode, threads = sys.argv[1], int(sys.argv[3])
if mode == "keep":
    keep_freed_memory()
cfg = demo.load_demo_config(overrides=["sft.max_seconds=null", "synthetic.copy_warmup_steps=200"])
demo._set_threads(threads)
env = demo._world_stage(cfg).value
cold = demo._oracle_stage(cfg, env, held_out_of_training(env.world, cfg), False).value
tokenizer = demo._tokenizer_stage(cfg, env.world, cold.trajectories).value
model = demo._model_stage(cfg, tokenizer).value
copy = demo._copy_stage(cfg, model, tokenizer, env.world).value.seconds / 200
run_sft(cfg, model, tokenizer, cold.sft_records, max_steps=20)
began = time.perf_counter()
metrics = run_sft(cfg, model, tokenizer, cold.sft_records, max_steps=420)
print(json.dumps({"copy": copy, "sft": (time.perf_counter() - began) / 420, "losses": metrics["losses"]}))
"""


def measure(mode: str, steps: int, threads: int, probe: str = PROBE) -> dict:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-c", probe, mode, str(steps), str(threads)], env=env, check=True,
                          capture_output=True, text=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--demo", action="store_true", help="the demo's own copy and SFT steps")
    args = parser.parse_args(argv)
    probe = DEMO_PROBE if args.demo else PROBE
    runs: dict[str, list[dict]] = {"default": [], "keep": []}
    for _ in range(args.repeats):
        for mode in runs:
            runs[mode].append(measure(mode, args.steps, args.threads, probe))
    identical = all(run["losses"] == runs["default"][0]["losses"] for mode in runs for run in runs[mode])
    steps = "200 copy and 420 SFT steps of the demo" if args.demo else f"{args.steps} timed steps"
    print(f"{args.repeats} interpreters per setting, {steps} each, {args.threads} threads; "
          f"losses bit-identical across settings: {identical}")
    print("| step | default s/step (median) | keep_freed_memory s/step (median) | speed-up |")
    print("|---|---|---|---|")
    for name in ("copy", "sft"):
        default = statistics.median(r[name] for r in runs["default"])
        keep = statistics.median(r[name] for r in runs["keep"])
        print(f"| {name} | {default:.4f} | {keep:.4f} | {default / keep:.2f}x |")
    return 0 if identical else 1


if __name__ == "__main__":
    sys.exit(main())
