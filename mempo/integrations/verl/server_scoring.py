"""Teacher scoring through the policy's own inference servers (verl's ``prompt_logprobs``).

For every scored round of a trajectory, two requests go to ``server_manager.generate`` (the same
servers that generated it, so the same weights in verl's sync modes)::

    prompt_ids = full_ctx[r] + answer_ids     sampling_params = {"max_tokens": 1, "temperature": 1.0,
    prompt_ids = mem_ctx[r]  + answer_ids                        "prompt_logprobs": 0}

Both verl servers (vLLM ``extract_prompt_logprobs``, SGLang ``_extract_prompt_logprobs_sglang``)
return ``TokenOutput.extra_fields["prompt_logprobs"]``: ``len(prompt_ids)`` rows, row k =
``[log p(prompt_ids[k+1] | prompt_ids[:k+1])]``, the last row a dummy; ``extra_fields["prompt_ids"]``
holds the matching ids (checked here when present). For a context of length Lc the answer token j
is row ``Lc - 1 + j``. The contexts, the answer and its mask come from `mempo.algo.contexts`
(`scoring_requests`), the reduction (mask, threshold, geometric mean) from
`mempo.ops.answer_logprob_from_token_logp`, the reward from
`mempo.algo.memory_reward.round_memory_rewards`: the numbers are `mempo.scoring`'s for the same
log-probs. These are the only requests that hold a gold answer; they generate one token that is
thrown away. Prompt-logprob requests do not reuse the engines' prefix caches (both engines recompute
the prefill), and the scorer cannot share prefixes as `mempo.scoring`'s packed method does.

The same ``prompt_logprobs`` requests give the rollout log-probs of the forced ``<mem>`` ids, which
were prompt input of their round's generation request (`forced_prefix_logprobs`).
"""
from __future__ import annotations

import asyncio
from typing import Any, Optional, Sequence

import torch

from mempo.algo.contexts import scoring_requests
from mempo.algo.memory_reward import RoundMemoryReward, round_memory_rewards
from mempo.config import ScoringConfig
from mempo.ops import answer_logprob_from_token_logp
from mempo.protocol.grammar import answer_template_text
from mempo.records.scoring import ScoringResult
from mempo.records.trajectory import Trajectory

__all__ = ["SCORING_SAMPLING_PARAMS", "ServerScorer", "ServerScoringError", "answer_row_logprobs",
           "forced_prefix_logprobs", "prompt_row_logprobs"]

#: the sampling parameters of a scoring request (verl's distillation teacher sends the same)
SCORING_SAMPLING_PARAMS = {"max_tokens": 1, "temperature": 1.0, "prompt_logprobs": 0}


class ServerScoringError(RuntimeError):
    """An inference server answered a scoring request without usable prompt log-probs."""


def prompt_row_logprobs(output: Any, prompt_ids: Sequence[int], start: int, end: int) -> list[float]:
    """log p(prompt_ids[k] | prompt_ids[:k]) for k in [start, end) (1 <= start <= end <= len), read off
    a verl ``TokenOutput`` of a ``prompt_logprobs=0`` request over ``prompt_ids`` (row k - 1).
    ServerScoringError naming what is wrong when the rows are missing, of the wrong count, for other
    ids, or not finite-or--inf numbers."""
    extra = getattr(output, "extra_fields", None) or {}
    rows = extra.get("prompt_logprobs")
    if rows is None:
        raise ServerScoringError("the inference server returned no extra_fields['prompt_logprobs'] for a "
                                 "prompt-logprob request (mempo_agent needs rollout.name vllm or sglang)")
    if len(rows) != len(prompt_ids):
        raise ServerScoringError(f"prompt_logprobs has {len(rows)} rows for a prompt of {len(prompt_ids)} ids "
                                 "(verl's layout: one row per prompt id, the last a dummy)")
    ids = extra.get("prompt_ids")
    values = []
    for k in range(start - 1, end - 1):
        row = rows[k]
        if not row:
            raise ServerScoringError(f"prompt_logprobs row {k} is empty")
        if ids is not None and int(ids[k][0]) != int(prompt_ids[k + 1]):
            raise ServerScoringError(f"prompt_logprobs row {k} is for token {ids[k][0]}, not for prompt id "
                                     f"{prompt_ids[k + 1]} at position {k + 1}")
        value = float(row[0])
        if value != value or value > 0:
            raise ServerScoringError(f"prompt_logprobs row {k} holds {value!r}, not a log-probability")
        values.append(value)
    return values


def answer_row_logprobs(output: Any, prompt_ids: Sequence[int], context_len: int) -> list[float]:
    """log p(answer token j | context, answer[:j]) for every answer token, read off a verl
    ``TokenOutput`` of a ``prompt_logprobs=0`` request over ``prompt_ids`` (context + answer)
    (`prompt_row_logprobs` from ``context_len``; its errors)."""
    return prompt_row_logprobs(output, prompt_ids, context_len, len(prompt_ids))


async def forced_prefix_logprobs(server_manager: Any, trajectory: Trajectory, request_id: str,
                                 spans: Sequence[tuple[int, int]], max_concurrent: int = 8) -> list[list[float]]:
    """The policy's log-prob of every forced-prefix id, as the servers that generated the trajectory
    give it: one list per span of `spans` (response offsets ``[start, start + prefix_len)`` of rounds),
    log p(id | the round's context and the prefix before it).

    The forced ``<mem>`` ids were prompt input of their round's generation request, so the engine
    reports no sampled log-prob for them; they are read off ``prompt_logprobs=0`` requests
    (`SCORING_SAMPLING_PARAMS`, temperature 1: the engines' prompt log-probs are not temperature
    scaled) over each round's context + its prefix. A round whose sequence is a prefix of another's
    (every round under context policy "full") is read off that one request: "full" needs one request
    per trajectory, "memory" one per round."""
    needed = []  # (span, the sequence its generation saw through the prefix)
    by_start = {r.start: r for r in trajectory.rounds}
    for start, end in spans:
        round_ = by_start[start]
        needed.append(((start, end), trajectory.round_context_ids(round_) + trajectory.response_ids[start:end]))
    requests: list[list[int]] = []
    owner = []
    for span, sequence in sorted(needed, key=lambda item: -len(item[1])):
        home = next((i for i, ids in enumerate(requests) if ids[:len(sequence)] == sequence), None)
        if home is None:
            requests.append(sequence)
            home = len(requests) - 1
        owner.append((span, sequence, home))
    gate = asyncio.Semaphore(max_concurrent)

    async def send(prompt_ids: list[int]) -> Any:
        async with gate:
            return await server_manager.generate(request_id, prompt_ids=prompt_ids,
                                                 sampling_params=dict(SCORING_SAMPLING_PARAMS))

    outputs = await asyncio.gather(*(send(ids) for ids in requests))
    values = {}
    for (start, end), sequence, home in owner:
        length = len(sequence)
        values[(start, end)] = prompt_row_logprobs(outputs[home], requests[home], length - (end - start), length)
    return [values[(start, end)] for start, end in spans]


class ServerScorer:
    """The memory rewards of one trajectory, scored through ``server_manager.generate``.

    server_manager: verl's ``LLMServerClient`` (or anything with its async ``generate(request_id, *,
    prompt_ids, sampling_params)``). tokenizer: the policy's (the answer template is tokenised with
    character offsets). config: `mempo.config.ScoringConfig`; read: ``threshold``, ``comparator``, ``answer_template``,
    ``reward``, ``log_clip`` (``scored_objectives`` must be "all"). max_concurrent: scoring requests
    of this trajectory in flight at once.
    """

    def __init__(self, server_manager: Any, tokenizer: Any, config: ScoringConfig, max_concurrent: int = 8) -> None:
        if config.scored_objectives != "all":
            raise ValueError("scoring.scored_objectives: server scoring supports 'all' only, got "
                             f"{config.scored_objectives!r}")
        if isinstance(max_concurrent, bool) or not isinstance(max_concurrent, int) or max_concurrent < 1:
            raise ValueError(f"max_concurrent_scoring must be an integer >= 1, got {max_concurrent!r}")
        self.server_manager = server_manager
        self.tokenizer = tokenizer
        self.config = config
        self.max_concurrent = max_concurrent

    async def _answer_logps(self, request_id: str, context: list[int], answer: list[int],
                            gate: asyncio.Semaphore) -> list[float]:
        prompt_ids = context + answer
        async with gate:
            output = await self.server_manager.generate(request_id, prompt_ids=prompt_ids,
                                                        sampling_params=dict(SCORING_SAMPLING_PARAMS))
        return answer_row_logprobs(output, prompt_ids, len(context))

    async def score(self, trajectory: Trajectory, request_id: str
                    ) -> tuple[list[Optional[float]], list[RoundMemoryReward]]:
        """(rewards, details) of the trajectory's scored rounds, in order, as
        `mempo.scoring.compute_memory_rewards` returns them for one trajectory."""
        cfg = self.config
        [request] = scoring_requests([trajectory], self.tokenizer, comparator=cfg.comparator,
                                     template=answer_template_text(cfg.answer_template))
        if not request.rounds:
            return [], []
        sequence = request.sequence_ids
        contexts = []
        for scored in request.rounds:
            contexts.append(sequence[:scored.full_end])
            contexts.append(list(scored.mem_ctx_ids))
        gate = asyncio.Semaphore(self.max_concurrent)
        answer = list(request.answer_ids)
        rows = await asyncio.gather(*(self._answer_logps(request_id, ctx, answer, gate) for ctx in contexts))
        token_logp = torch.tensor([v for row in rows for v in row], dtype=torch.float32)
        mask = torch.tensor(list(request.answer_mask) * len(contexts), dtype=torch.bool)
        cu = torch.arange(len(contexts) + 1, dtype=torch.int64) * len(answer)
        out = answer_logprob_from_token_logp(token_logp, mask, cu, threshold=cfg.threshold)
        p, mean, kept = out.p.tolist(), out.mean_logp.tolist(), [int(n) for n in out.num_kept.tolist()]
        result = ScoringResult(p_full=p[0::2], p_mem=p[1::2], num_kept_full=kept[0::2], num_kept_mem=kept[1::2],
                               mean_logp_full=mean[0::2], mean_logp_mem=mean[1::2])
        details = round_memory_rewards(trajectory, result, None, scored_objectives="all", reward=cfg.reward,
                                       log_clip=cfg.log_clip)
        return [item.reward for item in details], details
