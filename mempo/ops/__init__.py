"""mempo.ops: the public numeric ops of MemPO.

Advantages (`mempo.ops.advantage`): `grpo_outcome_advantage`, `memory_advantage`,
`mempo_advantage`, `group_zscore`.
Teacher scoring (`mempo.ops.answer_logprob`): `answer_logprob`, `answer_logprob_from_hidden`.
Span scanner (`mempo.ops.spans`, C++): `find_spans`, `TokenTable`, `SpanBatch`, `TAGS`.

Each op dispatches CUDA tensors to a Triton kernel and CPU tensors to a vectorised torch path
(`backend="auto" | "triton" | "torch"`). Loop references live in `mempo.ops.reference`.
Importing this package imports torch and numpy only; Triton, the kernels and the compiled scanner
load on first use.
"""
from __future__ import annotations

from mempo._lazy import lazy_exports

_EXPORTS = {
    "group_ids": "advantage",
    "group_zscore": "advantage",
    "grpo_outcome_advantage": "advantage",
    "memory_advantage": "advantage",
    "mempo_advantage": "advantage",
    "csr_offsets_from_rows": "advantage",
    "answer_logprob": "answer_logprob",
    "answer_logprob_from_hidden": "answer_logprob",
    "AnswerLogProb": "answer_logprob",
    "find_spans": "spans",
    "TokenTable": "spans",
    "SpanBatch": "spans",
    "Span": "spans",
    "TAGS": "spans",
}

__all__, __getattr__, __dir__ = lazy_exports('mempo.ops', _EXPORTS, globals())
