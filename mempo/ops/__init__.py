"""mempo.ops: the public numeric ops of MemPO.

Advantages (`mempo.ops.advantage`): `grpo_outcome_advantage`, `memory_advantage`,
`mempo_advantage`, `group_zscore`.
Teacher scoring (`mempo.ops.answer_logprob`): `answer_logprob_from_hidden`, `AnswerLogProb`. The
function `answer_logprob` is imported from its module (``from mempo.ops.answer_logprob import
answer_logprob``): here the name `answer_logprob` is always the submodule, never a function under
its module's name.
Span scanner (`mempo.ops.spans`, C++): `find_spans`, `TokenTable`, `SpanBatch`, `TAGS`.

Each op dispatches CUDA tensors to a Triton kernel and CPU tensors to a vectorised torch path
(`backend="auto" | "triton" | "torch"`). Loop references live in `mempo.ops.reference`.
Importing this package imports torch and numpy only; Triton and the kernels load on first use.
"""
from mempo.ops.advantage import (
    csr_offsets_from_rows, group_ids, group_zscore, grpo_outcome_advantage, memory_advantage, mempo_advantage,
)
from mempo.ops.answer_logprob import AnswerLogProb, answer_logprob_from_hidden
from mempo.ops.spans import TAGS, Span, SpanBatch, TokenTable, find_spans

__all__ = [
    "group_ids", "group_zscore", "grpo_outcome_advantage", "memory_advantage", "mempo_advantage",
    "csr_offsets_from_rows", "answer_logprob_from_hidden", "AnswerLogProb",
    "find_spans", "TokenTable", "SpanBatch", "Span", "TAGS",
]
