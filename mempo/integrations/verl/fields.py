"""The memory fields a mempo agent loop writes into ``AgentLoopOutput.extra_fields``, and their CSR form.

Every output of a mempo loop, train or validation, carries every key of `EXTRA_KEYS` (verl's
``DataProto.concat`` asserts that all worker chunks have the same keys), as plain Python values:

    mempo_mem_rewards   list[float]       memory reward of each scored round that enters the advantage
    mempo_mem_spans     list[[int, int]]  its <mem> span [start, end) in this row's response coordinates
    mempo_p_mem         list[float]       P(answer | mem_ctx[r]) of every scored round (empty: not scored)
    mempo_p_full        list[float]       P(answer | full_ctx[r]) of the same rounds
    mempo_scored_rounds list[int]         round index of each of those rounds
    mempo_rounds        int               rounds in the trajectory
    mempo_finish_reason str               why it ended (`mempo.records.trajectory.FINISH_REASONS`)
    mempo_score_mode    str               ``rollout.score_mode`` (how per-objective EM becomes the outcome)
    mempo_protocol_text str or None       the text the outcome is scored on (round and tool texts as
                                          generated; the trajectory's last output only, None on the
                                          others): verl's reward function reads it
                                          (`mempo.integrations.verl.reward`)
    mempo_prompt        str or None       the question the trajectory ran (last output only, None on the
                                          others): the example a mempo outcome reward reads
    mempo_action_format str               ``rollout.action_format`` ("tags" or "json")
    mempo_tools         list[str]         the loop's tool names, in order (with the action format: the
                                          tag set the outcome's format check uses)
    mempo_forced_spans  list[[int, int]]  trained forced-prefix ids whose ``rollout_log_probs`` are not
                                          the engine's (0.0 placeholders; rollout temperature != 1): the
                                          ``mempo_sync`` trainer keeps them out of rollout correction

Legacy trainer: each key is a ``non_tensor_batch`` object array (one entry per row); V1: one dict per
row in the TransferQueue field ``extra_fields``. `memory_inputs` turns either into the CSR inputs of
`mempo.ops.advantage` (rows in batch order).
"""
from __future__ import annotations

import math
from typing import Any, Mapping, Optional, Sequence

import torch

__all__ = ["EXTRA_KEYS", "FORCED_SPANS_KEY", "empty_extra_fields", "forced_mask", "memory_inputs",
           "memory_extra_fields"]

FORCED_SPANS_KEY = "mempo_forced_spans"
EXTRA_KEYS = ("mempo_mem_rewards", "mempo_mem_spans", "mempo_p_mem", "mempo_p_full", "mempo_scored_rounds",
              "mempo_rounds", "mempo_finish_reason", "mempo_score_mode", "mempo_protocol_text", "mempo_prompt",
              "mempo_action_format", "mempo_tools", FORCED_SPANS_KEY)


def empty_extra_fields() -> dict[str, Any]:
    """Every key of `EXTRA_KEYS` with its empty value (no round, nothing scored)."""
    return {"mempo_mem_rewards": [], "mempo_mem_spans": [], "mempo_p_mem": [], "mempo_p_full": [],
            "mempo_scored_rounds": [], "mempo_rounds": 0, "mempo_finish_reason": "", "mempo_score_mode": "mean",
            "mempo_protocol_text": None, "mempo_prompt": None, "mempo_action_format": "tags", "mempo_tools": [],
            FORCED_SPANS_KEY: []}


def memory_extra_fields(rewards: Sequence[Optional[float]], spans: Sequence[Sequence[int]],
                        offset: int = 0) -> dict[str, list]:
    """``mempo_mem_rewards`` / ``mempo_mem_spans`` of one output row: the scored rounds whose reward is
    not None (None: the definition does not score the round; it gets no memory advantage, as
    `mempo.algo.advantages.advantage_inputs` does), spans shifted by ``-offset`` (the row's response
    start in the trajectory's response coordinates)."""
    if len(rewards) != len(spans):
        raise ValueError(f"{len(rewards)} memory rewards for {len(spans)} <mem> spans")
    kept = [(float(r), [int(s[0]) - offset, int(s[1]) - offset]) for r, s in zip(rewards, spans) if r is not None]
    return {"mempo_mem_rewards": [r for r, _ in kept], "mempo_mem_spans": [s for _, s in kept]}


def _row_lists(row: int, rewards: Any, spans: Any) -> tuple[list[float], list[list[int]]]:
    rewards = [] if rewards is None else list(rewards)
    spans = [] if spans is None else [list(s) for s in spans]
    if len(rewards) != len(spans):
        raise ValueError(f"row {row}: mempo_mem_rewards has {len(rewards)} entries but mempo_mem_spans {len(spans)}")
    for value in rewards:
        if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(float(value)):
            raise ValueError(f"row {row}: mempo_mem_rewards must be finite numbers, got {value!r}")
    for span in spans:
        if len(span) != 2:
            raise ValueError(f"row {row}: a <mem> span must be [start, end], got {span!r}")
    return [float(v) for v in rewards], [[int(a), int(b)] for a, b in spans]


def memory_inputs(rows: Sequence[Optional[Mapping[str, Any]]]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """CSR memory inputs of a batch from one mapping per row (V1 ``extra_fields`` dicts, or the legacy
    ``non_tensor_batch`` entries zipped per row): (mem_rewards float32 [R], mem_offsets int64 [B+1],
    mem_spans int64 [R, 2]). A row without the keys (None, or a dict from another agent loop) has no
    scored round. ValueError naming the row for lists of different lengths or a non-finite reward."""
    rewards: list[float] = []
    spans: list[list[int]] = []
    offsets = [0]
    for row, fields in enumerate(rows):
        fields = fields or {}
        row_rewards, row_spans = _row_lists(row, fields.get("mempo_mem_rewards"), fields.get("mempo_mem_spans"))
        rewards.extend(row_rewards)
        spans.extend(row_spans)
        offsets.append(len(rewards))
    return (torch.tensor(rewards, dtype=torch.float32), torch.tensor(offsets, dtype=torch.int64),
            torch.tensor(spans, dtype=torch.int64).reshape(-1, 2))


def forced_mask(rows: Sequence[Optional[Mapping[str, Any]]], shape: tuple[int, int]) -> torch.Tensor:
    """bool [B, L]: True on every row's ``mempo_forced_spans`` positions (inside [0, L)); rows without
    the key (another agent loop) have none. ValueError naming the row for a malformed span."""
    mask = torch.zeros(shape, dtype=torch.bool)
    for row, fields in enumerate(rows):
        for span in (fields or {}).get(FORCED_SPANS_KEY) or ():
            if len(span) != 2 or not 0 <= int(span[0]) <= int(span[1]) <= shape[1]:
                raise ValueError(f"row {row}: {FORCED_SPANS_KEY} entry {span!r} is not a span inside [0, {shape[1]}]")
            mask[row, int(span[0]):int(span[1])] = True
    return mask
