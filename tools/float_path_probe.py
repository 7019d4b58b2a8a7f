"""Does this CPU's kernel choice change the floats of a training run? Runs the demo's copy warm-up
(`mempo.synthetic.copy_warmup`) for STEPS steps on a randomly initialised model of the demo's shape
(`mempo.model.builtin.SIZES['mini']`, vocabulary 4,096, tied embeddings; seed 0, 2 torch threads) and
prints one line: the instruction set of torch's CPU kernels, the variables that pin kernels
(`mempo.utils.machine.FLOAT_PATH_VARIABLES`) as set, the last loss, a digest of the whole loss
sequence and the seconds. Run it under different variables and compare the digests, e.g.

    python tools/float_path_probe.py 300
    MKL_CBWR=AVX2 python tools/float_path_probe.py 300
    ATEN_CPU_CAPABILITY=avx2 python tools/float_path_probe.py 300

(the variables are read when the libraries start, so each setting is its own process). Measured
results: docs/experiments/X1-another-cpu.md."""
from __future__ import annotations

import argparse
import hashlib

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from mempo.model.builtin import SIZES
from mempo.synthetic.copy_warmup import copy_warmup
from mempo.utils.machine import machine_facts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("steps", type=int, nargs="?", default=300)
    args = parser.parse_args()
    torch.set_num_threads(2)
    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=4096, max_position_embeddings=2048, tie_word_embeddings=True, **SIZES["mini"])
    result = copy_warmup(Qwen2ForCausalLM(config), list(range(100, 2100)), steps=args.steps, seed=0)
    facts = machine_facts()
    digest = hashlib.sha256(repr(result.losses).encode()).hexdigest()[:12]
    print(f"cpu {facts.get('cpu_model')!r} kernels {facts['cpu_capability']} pinned {facts.get('float_path', 'none')}: "
          f"{args.steps} steps, last loss {result.last_loss!r}, losses sha256 {digest}, {result.seconds:.1f} s")


if __name__ == "__main__":
    main()
