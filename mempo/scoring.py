"""Teacher scoring: P(answer | context) for both contexts of every scored round, by one of three
methods that give the same numbers (to fp32 rounding).

Contexts (`mempo.records.scoring.ScoringRequest`): ``full_ctx[r] = sequence_ids[:full_end]``,
``mem_ctx[r] = mem_ctx_ids``; each continued by the same answer ``a = answer_ids``, teacher-forced, with
logp_i = log pi(a_i | ctx, a_<i) (fp32, logits / temperature, temperature 1 by default):

    keep_i = answer_mask_i and logp_i > log(threshold)       (threshold None: keep_i = answer_mask_i)
    P(ctx) = exp(mean_{keep} logp_i)                           (no kept token: P = empty_value = 0.0)

The reduction is `mempo.ops.answer_logprob`'s, fused from the final hidden states and the lm_head
weight when the model allows it, else from the model's logits on the answer rows
(`mempo.model.adapter.ScoringModel`). The row predicting a_0 is the context's last row; a_i (i >= 1)
is predicted at the row of a_{i-1}, so an answer copy after a context needs only ``a' = a[:-1]``.
The memory reward itself is `mempo.algo.memory_reward`; `compute_memory_rewards` goes from
trajectories to rewards by the ``scoring`` section's definition in one call. With
``ScoringRequest.answer_objectives`` every context is also reduced per objective (one CSR segment per
objective's gold tokens, in the same reduction call). `token_budget` (tokens per forward,
default 16384) bounds every forward; a unit or context longer than it runs alone. Everything runs in
eval mode under ``torch.no_grad()`` (the mode is restored); results are Python floats. Imports torch
only (no transformers).

Sharded models (FSDP2 under torch.distributed: each decoder layer gathers its weights in every
forward, a collective) need every process to run the same number of forwards; `lockstep`
(`ForwardSync`) keeps them in step: a process out of forwards of its own runs one-token forwards
until every process is done.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Optional, Sequence

import torch

from mempo.algo.contexts import scoring_requests
from mempo.algo.memory_reward import PER_OBJECTIVE, RoundMemoryReward, round_memory_rewards
from mempo.config.schema import ScoringConfig
from mempo.model.adapter import ScoringModel, check_dense_mask_support, crop_cache, inference
from mempo.protocol.grammar import answer_template_text
from mempo.records.scoring import ScoringRequest, ScoringResult
from mempo.records.trajectory import Trajectory

__all__ = ["METHODS", "DEFAULT_TOKEN_BUDGET", "ForwardSync", "ScoringStats", "compute_memory_rewards", "resolve_method",
           "score", "score_cached", "score_packed", "score_reference"]

METHODS = ("packed", "cached", "reference")  # the ways to score; "auto" (`resolve_method`) picks one of them
DEFAULT_TOKEN_BUDGET = 16384

ForwardSync = Callable[[bool], bool]
"""Lockstep of the forwards of several processes: called with True before each of this process's
forwards, then with False until it returns False; returns whether any process has a forward to run
now. Each call is collective (e.g. an all-reduce MAX of the flag: `mempo.train.actor.Actor.lockstep`)."""


@dataclass
class ScoringStats:
    """Work done by one scoring call (pass an instance as `stats=`; it is added to).

    forwards: model forward calls. tokens: token positions run through the model, padding included
    (for the cached form: the root tokens plus the query tokens; cache reads are not counted).
    padding_tokens: of which padding (reference only). contexts: contexts scored (2 per round).
    """

    forwards: int = 0
    tokens: int = 0
    padding_tokens: int = 0
    contexts: int = 0


# ------------------------------------------------------------------------------------------------
# validation and small helpers
# ------------------------------------------------------------------------------------------------
def _common_prefix_len(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    lo, hi = 0, n  # a[:lo] == b[:lo], a[:hi] != b[:hi]: bisect on list-slice equality (C speed)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a[lo:mid] == b[lo:mid]:
            lo = mid
        else:
            hi = mid
    return lo


def _validate(requests: Sequence[ScoringRequest], vocab_size: Optional[int]) -> None:
    for i, req in enumerate(requests):
        A = len(req.answer_ids)
        if A == 0:
            raise ValueError(f"request {i}: answer_ids is empty")
        if len(req.answer_mask) != A:
            raise ValueError(f"request {i}: answer_mask has {len(req.answer_mask)} entries, "
                             f"answer_ids {A}")
        if req.answer_objectives is not None:
            K = req.num_objectives
            if isinstance(K, bool) or not isinstance(K, int) or K < 1:
                raise ValueError(f"request {i}: num_objectives must be an int >= 1, got {K!r}")
            if len(req.answer_objectives) != A:
                raise ValueError(f"request {i}: answer_objectives has {len(req.answer_objectives)} entries, "
                                 f"answer_ids {A}")
            for t, (j, m) in enumerate(zip(req.answer_objectives, req.answer_mask)):
                if (m and not 0 <= j < K) or (not m and j != -1):
                    raise ValueError(f"request {i}: answer_objectives[{t}] = {j} must be in [0, {K}) on a "
                                     f"gold token and -1 elsewhere (answer_mask {m})")
        L = len(req.sequence_ids)
        for k, rnd in enumerate(req.rounds):
            if not 1 <= rnd.full_end <= L:
                raise ValueError(f"request {i} round {k}: full_end {rnd.full_end} outside "
                                 f"[1, {L}] (len(sequence_ids))")
            if len(rnd.mem_ctx_ids) == 0:
                raise ValueError(f"request {i} round {k}: mem_ctx_ids is empty")
        if vocab_size is not None and req.rounds:
            lists = [req.sequence_ids, req.answer_ids] + [r.mem_ctx_ids for r in req.rounds]
            lo = min(min(x) for x in lists)
            hi = max(max(x) for x in lists)
            if lo < 0 or hi >= vocab_size:
                raise ValueError(f"request {i}: token id out of range [0, {vocab_size}) "
                                 f"(min {lo}, max {hi})")


def _check_budget(token_budget) -> int:
    if isinstance(token_budget, bool) or not isinstance(token_budget, int) or token_budget < 1:
        raise ValueError(f"token_budget must be a positive int, got {token_budget!r}")
    return token_budget


# ------------------------------------------------------------------------------------------------
# the answer rows of every context
# ------------------------------------------------------------------------------------------------
class _Rows:
    """Collects, over all forwards of a call, the states of the masked-in answer rows of every
    context. Context id: 2 * (global round index) + (0 full, 1 mem)."""

    def __init__(self, requests: Sequence[ScoringRequest], lockstep: Optional[ForwardSync] = None):
        self.requests = requests
        self.lockstep = lockstep
        self.round_base = []
        n = 0
        for req in requests:
            self.round_base.append(n)
            n += len(req.rounds)
        self.num_contexts = 2 * n
        self.gold = [[i for i, m in enumerate(req.answer_mask) if m] for req in requests]
        self.chunks: list[torch.Tensor] = []
        self.count = 0
        self.where: list[dict] = [dict() for _ in range(self.num_contexts)]

    def ctx(self, req: int, rnd: int, kind: int) -> int:
        return 2 * (self.round_base[req] + rnd) + kind

    def take(self, model: ScoringModel, forward_args: dict, picks: list[tuple[int, int, int]]):
        """Run model.run(**forward_args) for the flat rows of `picks` = [(ctx, answer index i,
        flat row)], store the states. Returns the cache (when forward_args asks for one)."""
        rows = torch.tensor([p[2] for p in picks], dtype=torch.int64, device=model.device)
        if self.lockstep is not None:
            self.lockstep(True)
        states, cache = model.run(rows=rows, **forward_args)
        self.chunks.append(states)
        for n, (ctx, i, _) in enumerate(picks):
            self.where[ctx][i] = self.count + n
        self.count += len(picks)
        return cache

    def _drain(self, model: ScoringModel) -> None:
        """Out of forwards of its own: one-token forwards while another process still runs one."""
        if self.lockstep is None:
            return
        one = torch.zeros(1, 1, dtype=torch.int64, device=model.device)
        while self.lockstep(False):
            model.run(one, one, None, rows=torch.zeros(0, dtype=torch.int64, device=model.device))

    def _segments(self, req_i: int) -> list[list[int]]:
        """The answer indices of each CSR segment of one context of request `req_i`: all gold tokens
        (no objectives), or one segment per objective (its gold tokens in answer order)."""
        req = self.requests[req_i]
        if req.answer_objectives is None:
            return [self.gold[req_i]]
        return [[i for i in self.gold[req_i] if req.answer_objectives[i] == j] for j in range(req.num_objectives)]

    def results(self, model: ScoringModel, threshold, temperature, empty_value, backend) -> list[ScoringResult]:
        self._drain(model)
        order, targets, cu = [], [], [0]
        segments = [self._segments(req_i) for req_i in range(len(self.requests))]
        for req_i, req in enumerate(self.requests):
            for rnd in range(len(req.rounds)):
                for kind in (0, 1):
                    where = self.where[self.ctx(req_i, rnd, kind)]
                    for segment in segments[req_i]:
                        for i in segment:
                            order.append(where[i])
                            targets.append(req.answer_ids[i])
                        cu.append(len(order))
        dev = model.device
        if self.chunks:
            states = torch.cat(self.chunks, 0)
        else:
            states = torch.zeros(0, model.state_width, dtype=model.dtype, device=dev)
        states = states.index_select(0, torch.tensor(order, dtype=torch.int64, device=dev))
        out = model.reduce(states, torch.tensor(targets, dtype=torch.int64, device=dev),
                           torch.tensor(cu, dtype=torch.int64, device=dev),
                           threshold, temperature, empty_value, backend)
        p = out.p.cpu().tolist()
        kept = [int(n) for n in out.num_kept.cpu().tolist()]
        mean = out.mean_logp.cpu().tolist()
        results = []
        at = 0  # the first segment of the next context
        for req_i, req in enumerate(self.requests):
            res = ScoringResult()
            k = len(segments[req_i])
            for rnd in range(len(req.rounds)):
                for kind, name in ((0, "full"), (1, "mem")):
                    seg = slice(at, at + k)
                    at += k
                    if req.answer_objectives is None:
                        ctx_p, ctx_mean, ctx_kept = p[seg.start], mean[seg.start], kept[seg.start]
                    else:
                        ctx_p, ctx_mean, ctx_kept = _merge_segments(p[seg], mean[seg], kept[seg], empty_value)
                        getattr(res, f"objective_p_{name}").append(p[seg])
                        getattr(res, f"objective_mean_logp_{name}").append(mean[seg])
                        getattr(res, f"objective_num_kept_{name}").append(kept[seg])
                    getattr(res, f"p_{name}").append(ctx_p)
                    getattr(res, f"mean_logp_{name}").append(ctx_mean)
                    getattr(res, f"num_kept_{name}").append(ctx_kept)
            results.append(res)
        return results


def _merge_segments(p: list[float], mean: list[float], kept: list[int], empty_value: float):
    """(P, mean kept log-prob, kept count) of a context from its per-objective segments:
    mean = sum_j mean_j * n_j / sum_j n_j (fp64; -inf when a segment's mean is -inf), P = exp(mean),
    or (empty_value, 0.0, 0) when no token is kept. Equals one segment over all of them up to fp32
    rounding."""
    n = sum(kept)
    if n == 0:
        return float(empty_value), 0.0, 0
    if any(m == -math.inf for m, c in zip(mean, kept) if c):
        return 0.0, -math.inf, n
    total = math.fsum(m * c for m, c in zip(mean, kept) if c)
    return math.exp(total / n), total / n, n


# ------------------------------------------------------------------------------------------------
# the packed layout
# ------------------------------------------------------------------------------------------------
@dataclass
class _Unit:
    """A group of segments placed together after the root: an answer copy (full_ctx[k]) or a mem
    suffix + its answer copy (mem_ctx[k]). `root_len` = root columns [0, root_len) it may see."""

    ctx: int
    root_len: int
    suffix: list[int]                  # mem suffix (empty for an answer copy)
    answer: list[int]                  # answer_ids[:-1]
    pos0: int                          # position id of the unit's first token

    @property
    def size(self) -> int:
        return len(self.suffix) + len(self.answer)


def _plan(rows: _Rows, req_i: int, req: ScoringRequest):
    """Root length and units of one trajectory."""
    answer_head = list(req.answer_ids[:-1])
    units = []
    root_len = 0
    for k, rnd in enumerate(req.rounds):
        root_len = max(root_len, rnd.full_end)
        units.append(_Unit(rows.ctx(req_i, k, 0), rnd.full_end, [], answer_head, rnd.full_end))
    for k, rnd in enumerate(req.rounds):
        p = _common_prefix_len(rnd.mem_ctx_ids, req.sequence_ids)
        root_len = max(root_len, p)
        units.append(_Unit(rows.ctx(req_i, k, 1), p, list(rnd.mem_ctx_ids[p:]), answer_head, p))
    return root_len, units


def _chunks(units: list[_Unit], root_len: int, token_budget: int) -> list[list[_Unit]]:
    """Consecutive units with root_len + sum(size) <= token_budget (at least one per chunk). Units
    of size 0 (|a| = 1 and no suffix: all rows are root rows) join the current chunk."""
    out, cur, used = [], [], root_len
    for u in units:
        if cur and u.size and used + u.size > token_budget:
            out.append(cur)
            cur, used = [], root_len
        cur.append(u)
        used += u.size
    if cur:
        out.append(cur)
    return out


def _layout(units: list[_Unit], root_len: int, gold: list[int]):
    """Place `units` after a root of root_len tokens.

    Returns (ids [Q] of the query part, positions [Q], blocks, picks): blocks = list of
    (row offset, length, visible column intervals) in pack coordinates (root = [0, root_len)),
    picks = [(ctx, answer index i, pack row)] for the gold rows."""
    ids, pos, blocks, picks = [], [], [], []
    at = root_len
    for u in units:
        ctx_last = u.root_len - 1
        visible = [(0, u.root_len)] if u.root_len else []
        if u.suffix:
            n = len(u.suffix)
            blocks.append((at, n, list(visible)))
            ids.extend(u.suffix)
            pos.extend(range(u.pos0, u.pos0 + n))
            visible = visible + [(at, at + n)]
            ctx_last = at + n - 1
            at += n
        n = len(u.answer)
        if n:
            blocks.append((at, n, visible))
            ids.extend(u.answer)
            first_pos = u.pos0 + len(u.suffix)
            pos.extend(range(first_pos, first_pos + n))
        for i in gold:
            picks.append((u.ctx, i, ctx_last if i == 0 else at + i - 1))
        at += n
    return ids, pos, blocks, picks


def _additive_mask(blocks, root_len: int, total: int, row0: int, dtype, device) -> torch.Tensor:
    """Additive mask [1, 1, total - row0, total] in `dtype`: rows [row0, total) of the packed
    layout (root rows causal; each block sees its visible intervals and itself causally). Built in
    place: filled with finfo.min, allowed regions zeroed (`triu_(1)` on a square view leaves the
    causal pattern), no boolean intermediate."""
    neg = torch.finfo(dtype).min
    mask = torch.full((total - row0, total), neg, dtype=dtype, device=device)
    if row0 < root_len:
        mask[:root_len - row0, :root_len].triu_(1 + row0)
    for at, n, visible in blocks:
        r = at - row0
        for c0, c1 in visible:
            mask[r:r + n, c0:c1] = 0
        mask[r:r + n, at:at + n].triu_(1)
    return mask[None, None]


# ------------------------------------------------------------------------------------------------
# the three methods
# ------------------------------------------------------------------------------------------------
def _prepare(model, requests, token_budget, fused, need_dense_mask, lockstep):
    requests = list(requests)
    _check_budget(token_budget)
    runner = ScoringModel(model, fused, need_dense_mask)
    _validate(requests, runner.vocab_size)
    return requests, runner, _Rows(requests, lockstep)


def _count(stats: Optional[ScoringStats], tokens: int, padding: int = 0) -> None:
    if stats is not None:
        stats.forwards += 1
        stats.tokens += tokens
        stats.padding_tokens += padding


def _trajectory_plans(requests, rows, stats: Optional[ScoringStats]):
    """(index, request, root length, units) of every request with scored rounds (packed / cached),
    counting its 2 contexts per round in `stats`."""
    for req_i, req in enumerate(requests):
        if not req.rounds:
            continue
        if stats is not None:
            stats.contexts += 2 * len(req.rounds)
        root_len, units = _plan(rows, req_i, req)
        yield req_i, req, root_len, units


def score_reference(
    model,
    requests: Sequence[ScoringRequest],
    *,
    threshold: Optional[float] = 0.5,
    token_budget: int = DEFAULT_TOKEN_BUDGET,
    temperature: float = 1.0,
    empty_value: float = 0.0,
    fused: Optional[bool] = None,
    backend: str = "auto",
    stats: Optional[ScoringStats] = None,
    lockstep: Optional[ForwardSync] = None,
) -> list[ScoringResult]:
    """The reference implementation's way: every context + the whole answer as its own row.

    Rows (all full_ctx of all requests in order, then all mem_ctx) are batched consecutively while
    rows x padded length <= token_budget (a longer row runs alone), right-padded with id 0, no
    padding mask (right padding is invisible to real rows under causal attention), position ids
    0..T-1. Each forward is input_ids int64 [B, T].

    Args:
        model: an HF-style causal LM (e.g. `Qwen2ForCausalLM`); any attention implementation.
        requests: the trajectories (`ScoringRequest`).
        threshold: keep gold tokens with p > threshold; None = plain geometric mean.
        token_budget: token positions per forward (padding included).
        temperature: logits are divided by it (1.0: the policy's own distribution).
        empty_value: P of a context with no kept token (default 0.0).
        fused: None = auto (hidden states + lm_head when the model allows it), False = the model's
            logits on the answer rows, True = require the fused path. The logits path keeps the
            gold rows' logits of the whole call ([gold tokens x contexts, V]) until the reduction
            and, where the forward has no `logits_to_keep`, computes logits for every position.
        backend: `mempo.ops.answer_logprob` backend ("auto" | "torch" | "triton").
        stats: optional `ScoringStats` to add this call's work to (the lockstep's one-token forwards
            are not counted).
        lockstep: `ForwardSync` when the model's forwards are collective (a sharded model); None:
            this process alone.

    Returns:
        One `ScoringResult` per request (Python floats).
    """
    with inference(model):
        requests, runner, rows = _prepare(model, requests, token_budget, fused, False, lockstep)
        contexts = []  # (ctx id, ids, answer index list)
        for kind in (0, 1):
            for req_i, req in enumerate(requests):
                for k, rnd in enumerate(req.rounds):
                    ctx_ids = req.sequence_ids[:rnd.full_end] if kind == 0 else rnd.mem_ctx_ids
                    contexts.append((rows.ctx(req_i, k, kind), req_i, list(ctx_ids)))
        if stats is not None:
            stats.contexts += len(contexts)
        batches, cur, width = [], [], 0
        for item in contexts:
            length = len(item[2]) + len(requests[item[1]].answer_ids)
            new_width = max(width, length)
            if cur and (len(cur) + 1) * new_width > token_budget:
                batches.append((cur, width))
                cur, new_width = [], length
            cur.append(item)
            width = new_width
        if cur:
            batches.append((cur, width))
        dev = runner.device
        for batch, T in batches:
            B = len(batch)
            ids = torch.zeros(B, T, dtype=torch.int64)
            picks, real = [], 0
            for b, (ctx, req_i, ctx_ids) in enumerate(batch):
                req = requests[req_i]
                row = ctx_ids + list(req.answer_ids)
                ids[b, :len(row)] = torch.tensor(row, dtype=torch.int64)
                real += len(row)
                c = len(ctx_ids)
                picks.extend((ctx, i, b * T + c - 1 + i) for i in rows.gold[req_i])
            positions = torch.arange(T, dtype=torch.int64).expand(B, T)
            rows.take(runner, dict(input_ids=ids.to(dev), position_ids=positions.to(dev),
                                   attention_mask=None), picks)
            _count(stats, B * T, B * T - real)
        return rows.results(runner, threshold, temperature, empty_value, backend)


def score_packed(
    model,
    requests: Sequence[ScoringRequest],
    *,
    threshold: Optional[float] = 0.5,
    token_budget: int = DEFAULT_TOKEN_BUDGET,
    temperature: float = 1.0,
    empty_value: float = 0.0,
    fused: Optional[bool] = None,
    backend: str = "auto",
    stats: Optional[ScoringStats] = None,
    lockstep: Optional[ForwardSync] = None,
) -> list[ScoringResult]:
    """One forward per trajectory over a packed layout with a dense 4-D additive mask::

        [root = sequence_ids[:L]][a'_1]...[a'_K][s_1][a'_1m]...[s_K][a'_Km]

    L = the longest prefix any context needs. Answer copy k sees root columns < full_end_k and itself
    causally (positions full_end_k, ...). p_k = the longest common prefix of mem_ctx[k] and
    sequence_ids; suffix s_k = mem_ctx[k][p_k:] sees root columns < p_k and itself causally
    (positions p_k, ...); its answer copy sees root columns < p_k, all of s_k and itself (positions
    p_k + |s_k|, ...). The root is plain causal. A flash-attention model runs "sdpa" for the call.

    Each forward: input_ids int64 [1, S], position_ids int64 [1, S], attention_mask model-dtype
    [1, 1, S, S] (0 / finfo.min). More than one forward per trajectory only when
    root + copies exceed `token_budget` (the root is then recomputed per chunk). Needs
    attn_implementation "sdpa" or "eager" and full-attention layers (ValueError otherwise).
    Arguments and result: as `score_reference`.
    """
    with inference(model, dense_mask=True):
        requests, runner, rows = _prepare(model, requests, token_budget, fused, True, lockstep)
        dev = runner.device
        for req_i, req, root_len, units in _trajectory_plans(requests, rows, stats):
            root = list(req.sequence_ids[:root_len])
            for chunk in _chunks(units, root_len, token_budget):
                q_ids, q_pos, blocks, picks = _layout(chunk, root_len, rows.gold[req_i])
                S = root_len + len(q_ids)
                ids = torch.tensor(root + q_ids, dtype=torch.int64, device=dev)[None]
                pos = torch.tensor(list(range(root_len)) + q_pos, dtype=torch.int64, device=dev)[None]
                mask = _additive_mask(blocks, root_len, S, 0, runner.dtype, dev)
                rows.take(runner, dict(input_ids=ids, position_ids=pos, attention_mask=mask), picks)
                _count(stats, S)
        return rows.results(runner, threshold, temperature, empty_value, backend)


def score_cached(
    model,
    requests: Sequence[ScoringRequest],
    *,
    threshold: Optional[float] = 0.5,
    token_budget: int = DEFAULT_TOKEN_BUDGET,
    temperature: float = 1.0,
    empty_value: float = 0.0,
    fused: Optional[bool] = None,
    backend: str = "auto",
    stats: Optional[ScoringStats] = None,
    lockstep: Optional[ForwardSync] = None,
) -> list[ScoringResult]:
    """KV-cache reuse of `score_packed`'s layout: per trajectory, the root `sequence_ids[:L]` once
    with `use_cache=True` (input_ids [1, L], no mask: causal fast path), then the answer copies and
    mem suffixes as one flat query block (input_ids [1, Q]) against that cache with the rows [L, L+Q) of the packed
    mask (model-dtype [1, 1, Q, L + Q]) and the packed position ids. Chunks of the query block
    (`token_budget`) reuse the same cache, cropped back to L after each. The cache is the model's
    own (a transformers `DynamicCache`, passed back as `cache=` / `past_key_values=`). Needs
    attn_implementation "sdpa" or "eager" and full-attention layers (ValueError otherwise).
    Arguments and result: as `score_reference`.
    """
    with inference(model, dense_mask=True):
        requests, runner, rows = _prepare(model, requests, token_budget, fused, True, lockstep)
        dev = runner.device
        for req_i, req, root_len, units in _trajectory_plans(requests, rows, stats):
            chunks = _chunks(units, root_len, token_budget)
            # Root rows (each context's last row predicts a_0) come from the root forward.
            gold = rows.gold[req_i]
            root_picks, later = [], []
            for chunk in chunks:
                q_ids, q_pos, blocks, picks = _layout(chunk, root_len, gold)
                later.append((q_ids, q_pos, blocks, [p for p in picks if p[2] >= root_len]))
                root_picks.extend(p for p in picks if p[2] < root_len)
            ids = torch.tensor(req.sequence_ids[:root_len], dtype=torch.int64, device=dev)[None]
            pos = torch.arange(root_len, dtype=torch.int64, device=dev)[None]
            cache = rows.take(runner, dict(input_ids=ids, position_ids=pos, attention_mask=None,
                                           use_cache=True), root_picks)
            _count(stats, root_len)
            if cache is None and any(q[0] for q in later):
                raise ValueError("the model returned no cache with use_cache=True; "
                                 "use method='packed' or 'reference'")
            first = True
            for q_ids, q_pos, blocks, picks in later:
                if not q_ids:
                    continue
                if not first:
                    crop_cache(cache, root_len)
                first = False
                S = root_len + len(q_ids)
                q = torch.tensor(q_ids, dtype=torch.int64, device=dev)[None]
                qp = torch.tensor(q_pos, dtype=torch.int64, device=dev)[None]
                mask = _additive_mask(blocks, root_len, S, root_len, runner.dtype, dev)
                local = [(c, i, r - root_len) for c, i, r in picks]
                rows.take(runner, dict(input_ids=q, position_ids=qp, attention_mask=mask,
                                       cache=cache, use_cache=True), local)
                _count(stats, len(q_ids))
                if cache.get_seq_length() != S:  # the model did not attend through our cache
                    raise ValueError(f"the model ignored the cache passed as "
                                     f"{runner.cache_kw}=; use method='packed' or 'reference'")
            del cache
        return rows.results(runner, threshold, temperature, empty_value, backend)


def resolve_method(model, method: str = "auto") -> str:
    """The method `score` runs for `method` on `model`: a name of `METHODS` as given; "auto" picks by
    the model's device, from bench/RESULTS.md "Teacher scoring":

    1. "reference" when the model cannot take a dense 4-D mask (sliding-window or other non-full
       attention layers; `check_dense_mask_support`): the other two raise for it.
    2. "cached" on CPU: the fastest there in every quiet run (4.0-8.2x less time than "reference",
       against 2.05-3.3x for "packed": its root runs on the causal fast path).
    3. "packed" on any other device: not yet measured on a GPU (bench/RESULTS.md "GPU"); "packed"
       needs no cache support from the model and was the default before "auto".

    ValueError for a name that is neither "auto" nor in `METHODS`."""
    if method != "auto":
        if method not in METHODS:
            raise ValueError(f"scoring method must be 'auto' or one of {METHODS}, got {method!r}")
        return method
    with inference(model, dense_mask=True):  # as packed / cached run it: flash attention runs "sdpa" there
        try:
            check_dense_mask_support(model)
        except ValueError:
            return "reference"
    device = next(iter(model.parameters())).device
    return "cached" if device.type == "cpu" else "packed"


def score(
    model,
    requests: Sequence[ScoringRequest],
    method: str = "auto",
    *,
    threshold: Optional[float] = 0.5,
    token_budget: int = DEFAULT_TOKEN_BUDGET,
    temperature: float = 1.0,
    empty_value: float = 0.0,
    fused: Optional[bool] = None,
    backend: str = "auto",
    stats: Optional[ScoringStats] = None,
    lockstep: Optional[ForwardSync] = None,
) -> list[ScoringResult]:
    """Score every round of every request: `method` "auto" (default: `resolve_method`), "packed",
    "cached" or "reference".

    All three give the same numbers up to floating-point rounding; "cached" is the fastest on CPU
    (the root runs on the causal fast path), "packed" needs no cache support, "reference" works with
    any attention implementation. Arguments and result: as `score_reference`.
    """
    fns = {"packed": score_packed, "cached": score_cached, "reference": score_reference}
    return fns[resolve_method(model, method)](model, requests, threshold=threshold, token_budget=token_budget,
                       temperature=temperature, empty_value=empty_value, fused=fused,
                       backend=backend, stats=stats, lockstep=lockstep)


# ------------------------------------------------------------------------------------------------
# the memory rewards of a batch, by the configured definition
# ------------------------------------------------------------------------------------------------
def compute_memory_rewards(
    model,
    tokenizer,
    trajectories: Sequence[Trajectory],
    scoring_cfg: ScoringConfig,
    *,
    stats: Optional[ScoringStats] = None,
    lockstep: Optional[ForwardSync] = None,
) -> tuple[list[list[Optional[float]]], list[list[RoundMemoryReward]]]:
    """Teacher-score `trajectories` with `model` and turn the results into memory rewards, by the
    definition of `scoring_cfg` (the ``scoring`` section: method, threshold, token_budget, comparator,
    scored_objectives, reward, log_clip, objective_reduce, answer_template;
    `mempo.algo.memory_reward`). The one entry point of the training step, the signal benchmark and
    integrations. The golds reach the scored answer only; nothing is generated. lockstep: as
    `score_reference` (a sharded model under torch.distributed).

    Returns:
        (rewards, details): per trajectory, one entry per `Trajectory.scored_rounds` in order:
        ``rewards[b][k]`` the memory reward (float), or None for a round that is not scored
        (scored_objectives "retrieved" with no objective retrieved before it, "complete" with one not
        retrieved), and ``details[b][k]``
        its `RoundMemoryReward` (P and mean log-prob of both contexts, whole answer and per objective).
    """
    per_objective = scoring_cfg.scored_objectives in PER_OBJECTIVE
    requests = scoring_requests(trajectories, tokenizer, comparator=scoring_cfg.comparator,
                                per_objective=per_objective, template=answer_template_text(scoring_cfg.answer_template))
    results = score(model, requests, scoring_cfg.method, threshold=scoring_cfg.threshold,
                    token_budget=scoring_cfg.token_budget, stats=stats, lockstep=lockstep)
    details = []
    for trajectory, result in zip(trajectories, results):
        retrieved = trajectory.retrieved_objectives(tokenizer) if per_objective else None
        details.append(round_memory_rewards(trajectory, result, retrieved,
                                            scored_objectives=scoring_cfg.scored_objectives,
                                            reward=scoring_cfg.reward, log_clip=scoring_cfg.log_clip,
                                            objective_reduce=scoring_cfg.objective_reduce))
    return [[item.reward for item in rounds] for rounds in details], details
