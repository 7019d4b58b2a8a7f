"""mempo.ops: the public numeric ops of MemPO.

Advantages (`mempo.ops.advantage`): `grpo_outcome_advantage`, `memory_advantage`,
`mempo_advantage`, `group_zscore`.
Teacher scoring (`mempo.ops.logprob`): `answer_logprob` (from logits), `answer_logprob_from_hidden`
(from final hidden states and the lm_head, never materialising the [M, V] logits: blocks of them through
the GEMM by default, or the fused Triton kernel), `answer_logprob_from_token_logp`
(from per-row log-probs computed elsewhere, e.g. an inference server's prompt log-probs), `AnswerLogProb`.
Span scanner (`mempo.ops.spans`, C++): `find_spans`, `TokenTable`, `SpanBatch`, `TAGS`.

Each op dispatches CUDA tensors to a Triton kernel and CPU tensors to a vectorised torch path
(`backend="auto" | "triton" | "torch"`). Loop references live in `mempo.ops.reference`.
Importing this package imports torch and numpy only; Triton and the kernels load on first use.
"""
from mempo.ops.advantage import (
    csr_offsets_from_rows, group_ids, group_zscore, grpo_outcome_advantage, memory_advantage, mempo_advantage,
)
from mempo.ops.logprob import AnswerLogProb, answer_logprob, answer_logprob_from_hidden, answer_logprob_from_token_logp
from mempo.ops.spans import TAGS, Span, SpanBatch, TokenTable, find_spans

__all__ = [
    "group_ids", "group_zscore", "grpo_outcome_advantage", "memory_advantage", "mempo_advantage",
    "csr_offsets_from_rows", "answer_logprob", "answer_logprob_from_hidden", "answer_logprob_from_token_logp",
    "AnswerLogProb",
    "find_spans", "TokenTable", "SpanBatch", "Span", "TAGS",
]
