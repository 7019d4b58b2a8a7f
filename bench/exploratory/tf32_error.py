"""Error of answer log-probs when the fp32 GEMM runs in TF32 (`answer_logprob_from_hidden(allow_tf32=True)`),
estimated on CPU by emulating TF32's operand rounding (how the bound in the op's docstring was obtained;
the GPU check measures the real cuBLAS TF32 GEMM against fp64 on the device).

TF32 keeps fp32's 8-bit exponent and 10 of its 23 mantissa bits: a tensor-core GEMM reads each fp32
operand rounded to that grid (relative error <= 2^-11 when rounded to nearest, < 2^-10 when the low
13 bits are dropped) and accumulates the products in fp32. The emulation rounds hidden and weight
both ways, multiplies them (a) in fp64 (the operand rounding alone) and (b) in IEEE fp32 (adding
fp32 accumulation, as the tensor cores do, in the CPU's summation order), and compares
log p = z_t - logsumexp(z) with fp64 on the unrounded operands, for sampled rows at V = 151,936 and
H = 896 / 3,584 under three input regimes:

* check:    the GPU check's inputs (tools/gpu_check.py `_hidden_case`): hidden ~ N(0, 1) pushed toward
            the target's weight row, weight ~ N(0, 1/H); logits ~ N(0, 1), the target's up to log V + 6.
* sharp:    the same with hidden x 3: logits ~ N(0, 9), target logits up to ~50 (a confident LM).
* outliers: the check's inputs with 4 hidden dimensions 30x larger (LLM "massive activations"), so
            that a few products dominate each logit.

    python bench/exploratory/tf32_error.py [--rows 64] [--regimes check,sharp,outliers] [--hidden 896,3584]
                                           [--out tf32_error.json]

Prints one JSON line per (regime, H, rounding, accumulation) with the max and mean |error| over the
rows, and the bound: the largest max.
"""
import argparse
import json
import math
import time

import torch

V = 151_936


def tf32(x: torch.Tensor, mode: str) -> torch.Tensor:
    """fp32 -> the nearest TF32 value (mode "rn", ties to even) or the one toward zero ("rz")."""
    bits = x.contiguous().view(torch.int32)
    if mode == "rn":
        bits = bits + (0xFFF + ((bits >> 13) & 1))
    return (bits & ~0x1FFF).view(torch.float32)


def case(regime: str, M: int, H: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    weight = torch.randn(V, H, generator=g) / H ** 0.5
    targets = torch.randint(0, V, (M,), generator=g)
    w_t = weight[targets]
    boost = torch.rand(M, 1, generator=g) * (math.log(V) + 6.0)
    hidden = torch.randn(M, H, generator=g) + boost * w_t / w_t.pow(2).sum(1, keepdim=True)
    if regime == "sharp":
        hidden = hidden * 3
    elif regime == "outliers":
        hidden[:, :4] *= 30
    return hidden, weight, targets


def logp(z: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    z = z.double()
    return z.gather(1, targets[:, None])[:, 0] - z.logsumexp(1)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=64)
    parser.add_argument("--regimes", default="check,sharp,outliers")
    parser.add_argument("--hidden", default="896,3584")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    torch.set_float32_matmul_precision("highest")
    rows = []
    for regime in args.regimes.split(","):
        for H in map(int, args.hidden.split(",")):
            hidden, weight, targets = case(regime, args.rows, H, seed=H)
            exact = logp(hidden.double() @ weight.double().T, targets)
            z_exact = hidden.double() @ weight.double().T
            spread = dict(logit_std=float(z_exact.std()),
                          target_logit_max=float(z_exact.gather(1, targets[:, None]).max()),
                          logp_min=float(exact.min()), logp_median=float(exact.median()))
            for mode in ("rn", "rz"):
                h, w = tf32(hidden, mode), tf32(weight, mode)
                for accumulate in ("fp64", "fp32"):
                    t0 = time.perf_counter()
                    z = h.double() @ w.double().T if accumulate == "fp64" else (h @ w.T)
                    err = (logp(z, targets) - exact).abs()
                    row = dict(regime=regime, H=H, V=V, rows=args.rows, rounding=mode, accumulate=accumulate,
                               max_abs_err=float(err.max()), mean_abs_err=float(err.mean()),
                               seconds=round(time.perf_counter() - t0, 1), **spread)
                    print(json.dumps(row), flush=True)
                    rows.append(row)
            # the IEEE fp32 GEMM itself, for scale
            err = (logp(hidden @ weight.T, targets) - exact).abs()
            row = dict(regime=regime, H=H, V=V, rows=args.rows, rounding="none (IEEE fp32)", accumulate="fp32",
                       max_abs_err=float(err.max()), mean_abs_err=float(err.mean()), **spread)
            print(json.dumps(row), flush=True)
            rows.append(row)
    bound = max(r["max_abs_err"] for r in rows if r["rounding"] != "none (IEEE fp32)")
    print(json.dumps({"bound_max_abs_err": bound}))
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"rows": rows, "bound_max_abs_err": bound}, f, indent=1)


if __name__ == "__main__":
    main()
