"""Times the fused hidden x lm_head kernel (`mempo.kernels.answer_logprob.hidden_logp`) under candidate
tile configs on one CUDA device, at Qwen2.5 shapes (V = 151,936; M = 4,608 answer rows), against the
default config and the materialised path; checks each against the torch path. GPU only; exploratory
(how the default config in `_default_hidden_config` was chosen; numbers: bench/RESULTS.md "GPU").

    python bench/exploratory/fused_configs.py [--out configs.json]
"""
import argparse
import json
import time

import torch

import mempo.kernels.answer_logprob as kernel_mod
from mempo.ops import answer_logprob, answer_logprob_from_hidden

V = 151_936
# (block_m, block_v, block_h, num_warps, num_stages, maxnreg)
CANDIDATES = {
    "fp32": [(64, 128, 16, 8, 2, None), (64, 64, 16, 8, 2, 255), (32, 128, 16, 8, 2, 255),
             (64, 128, 16, 8, 2, 255), (128, 64, 16, 8, 2, None), (64, 64, 32, 8, 2, None)],
    "bf16": [(64, 128, 64, 8, 3, None), (128, 128, 64, 8, 3, None), (128, 256, 64, 8, 3, None),
             (64, 256, 64, 8, 3, None), (128, 128, 64, 8, 4, None), (128, 128, 32, 8, 4, None),
             (64, 128, 64, 4, 3, None), (128, 64, 64, 4, 4, None)],
}
SHAPES = {"fp32": [(4608, 896)], "bf16": [(4608, 896), (4608, 3584)]}


def timed_ms(fn, reps):
    fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / reps * 1e3


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    default_config = kernel_mod._default_hidden_config
    rows = []
    for dname, shapes in SHAPES.items():
        dtype = torch.float32 if dname == "fp32" else torch.bfloat16
        reps = 3 if dname == "fp32" else 10
        for M, H in shapes:
            g = torch.Generator(device="cuda").manual_seed(0)
            hidden = torch.randn(M, H, device="cuda", generator=g).to(dtype)
            weight = (torch.randn(V, H, device="cuda", generator=g) / H ** 0.5).to(dtype)
            targets = torch.randint(0, V, (M,), device="cuda", generator=g)
            mask = torch.ones(M, dtype=torch.bool, device="cuda")
            want = answer_logprob_from_hidden(hidden, weight, targets, mask, backend="torch").token_logp
            run = lambda: answer_logprob_from_hidden(hidden, weight, targets, mask, backend="triton",  # noqa: E731
                                                     method="fused")
            mat = lambda: answer_logprob(hidden @ weight.T, targets, mask, backend="triton")  # noqa: E731
            ms_mat = timed_ms(mat, reps)
            for cand in [None] + CANDIDATES[dname]:
                if cand is not None:
                    def patched(M_, V_, H_, device, interpret, dot_fp32, aligned=True, cand=cand):
                        bm, bv, bh, nw, ns, mx = cand
                        return bm, bv, bh, kernel_mod.vocab_splits(M_, V_, bm, bv, device), nw, ns, mx
                    kernel_mod._default_hidden_config = patched
                try:
                    got = run().token_logp
                    err = float((got - want).abs().max())
                    ms = timed_ms(run, reps)
                    row = dict(dtype=dname, M=M, H=H, config="default" if cand is None else list(cand), ms=round(ms, 3),
                               ms_materialised=round(ms_mat, 3), max_abs_err=err,
                               tflops=round(2 * M * H * V / ms / 1e9, 1))
                except Exception as error:  # a config that does not compile is a result too
                    row = dict(dtype=dname, M=M, H=H, config=list(cand),
                               error=f"{type(error).__name__}: {str(error)[:200]}")
                finally:
                    kernel_mod._default_hidden_config = default_config
                print("CONFIG", json.dumps(row), flush=True)
                rows.append(row)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
