"""Loop reference for `mempo.ops.answer_logprob` (tests and benchmarks only; slow on purpose).

Plain Python loops over contexts and rows, each row's log-softmax computed in float64 from its own
logits. Same conventions as the op: masked rows report token_logp 0.0 and are never read; keep is
`mask and logp > log(threshold)` (strict; threshold None keeps every masked-in row); a context with
no kept row has P = empty_value and mean_logp 0.0. Outputs are float64 (token_logp, p, mean_logp)
so that fp32 / bf16 / fp16 results of the op can be compared with a known error.
No input validation beyond what the loops need.
"""
from __future__ import annotations

import math
from typing import Optional

import torch

from mempo.ops.logprob import AnswerLogProb


def _contexts(row_shape, cu_seqlens):
    if len(row_shape) == 2:
        n, t = row_shape
        return [(i * t, (i + 1) * t) for i in range(n)]
    if cu_seqlens is None:
        return [(0, row_shape[0])]
    cu = [int(x) for x in cu_seqlens.tolist()]
    return [(cu[c], cu[c + 1]) for c in range(len(cu) - 1)]


def _reduce(row_logit_fn, targets, answer_mask, cu_seqlens, threshold, temperature, empty_value):
    row_shape = tuple(targets.shape)
    tgt = targets.reshape(-1).tolist()
    mask = [bool(x) for x in answer_mask.reshape(-1).tolist()]
    M = len(tgt)
    token_logp = torch.zeros(M, dtype=torch.float64)
    keep = torch.zeros(M, dtype=torch.bool)
    spans = _contexts(row_shape, cu_seqlens)
    p = torch.zeros(len(spans), dtype=torch.float64)
    mean_logp = torch.zeros(len(spans), dtype=torch.float64)
    num_kept = torch.zeros(len(spans), dtype=torch.int64)
    log_th = None if threshold is None else math.log(threshold)
    for c, (lo, hi) in enumerate(spans):
        kept = []
        for i in range(lo, hi):
            if not mask[i]:
                continue  # masked rows: not computed, reported as 0.0
            z = row_logit_fn(i) / temperature
            lp = float(torch.log_softmax(z, dim=0)[tgt[i]])
            token_logp[i] = lp
            if log_th is None or lp > log_th:
                keep[i] = True
                kept.append(lp)
        num_kept[c] = len(kept)
        if kept:
            mean_logp[c] = sum(kept) / len(kept)
            p[c] = math.exp(mean_logp[c])
        else:
            p[c] = empty_value
    return AnswerLogProb(token_logp.view(row_shape), keep.view(row_shape), p, mean_logp, num_kept)


def answer_logprob_reference(
    logits: torch.Tensor,
    targets: torch.Tensor,
    answer_mask: torch.Tensor,
    cu_seqlens: Optional[torch.Tensor] = None,
    *,
    threshold: Optional[float] = 0.5,
    temperature: float = 1.0,
    empty_value: float = 0.0,
) -> AnswerLogProb:
    """Loop reference of `answer_logprob` (logits `[M, V]` + cu_seqlens, or `[N, T, V]`); float64."""
    flat = logits.detach().reshape(-1, logits.shape[-1]).cpu()
    return _reduce(lambda i: flat[i].double(), targets.cpu(), answer_mask.cpu(), cu_seqlens,
                   threshold, temperature, empty_value)


def answer_logprob_from_hidden_reference(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    answer_mask: torch.Tensor,
    cu_seqlens: Optional[torch.Tensor] = None,
    *,
    bias: Optional[torch.Tensor] = None,
    threshold: Optional[float] = 0.5,
    temperature: float = 1.0,
    empty_value: float = 0.0,
) -> AnswerLogProb:
    """Loop reference of `answer_logprob_from_hidden`: row logits = weight @ hidden_i + bias in
    float64, one row at a time."""
    flat = hidden.detach().reshape(-1, hidden.shape[-1]).cpu().double()
    w = weight.detach().cpu().double()
    b = None if bias is None else bias.detach().cpu().double()

    def row_logits(i):
        z = w @ flat[i]
        return z if b is None else z + b

    return _reduce(row_logits, targets.cpu(), answer_mask.cpu(), cu_seqlens,
                   threshold, temperature, empty_value)
