"""Teacher scoring for the MemPO memory reward (ALGORITHM.md section 4): P(answer | context).

For every scored round r of a trajectory (r >= 2, with a well-formed `<mem>`), two contexts:

* `full_ctx[r]` = `sequence_ids[:full_end]`: everything before round r's own output (system +
  question + R1 + tool_1 + ... + R_{r-1} + tool_{r-1}). An end offset into the trajectory, no copy.
* `mem_ctx[r]`  = `mem_ctx_ids`: system + question + round r's `<mem>...</mem>` (its own ids).

Each context is continued by the same scored answer `a` = `answer_ids` (the gold answer inside an
answer template, `build_answer`), teacher-forced; `answer_mask` is 1 on gold-answer tokens only.
With logp_i = log pi(a_i | ctx, a_<i) (fp32, temperature 1 by default):

    keep_i     = answer_mask_i and logp_i > log(threshold)     (threshold=None: keep_i = answer_mask_i)
    P(ctx)     = exp(mean_{keep} logp_i)                         (no kept token: P = empty_value = 0.0)
    mem_reward = P(mem_ctx[r]) - P(full_ctx[r])

The empty value is 0 by default, NOT exp(0) = 1: a context under which no gold token passes the
threshold has probability 0 (`mempo.ops.answer_logprob` conventions). All log-prob -> P reductions
go through `mempo.ops.answer_logprob`: fused from the final hidden states and the lm_head weight on
the answer rows only (`answer_logprob_from_hidden`) whenever the model is an HF-style causal LM whose
logits are exactly `get_output_embeddings()(get_decoder()(...).last_hidden_state)` (checked once per
model on a 4-token probe); otherwise the model's own logits on those rows (`answer_logprob`).

The row predicting answer token a_0 is the context's last row; a_i (i >= 1) is predicted at the row
of a_{i-1}. So an answer copy placed after a context needs only `a[:-1]` (|a| - 1 tokens).

Three ways to compute the same numbers (they agree to fp32 rounding; see tests/test_scoring.py):

* `score_reference`: the reference implementation's way. All 2N contexts (every full_ctx, then
  every mem_ctx, N scored rounds in the call), each followed by the whole answer, right-padded into
  batches. Right padding under a causal mask never reaches a real row (pad tokens come after every
  real token of their row), so no padding mask is passed and attention stays on the fast causal
  path; position ids are 0..len-1 per row. Cost ~ sum of all context lengths.

* `score_packed`: one forward per trajectory over the packed sequence

      [root = sequence_ids[:L]][a'_1]...[a'_K][s_1][a'_1m]...[s_K][a'_Km]        (a' = a[:-1])

  where L = the longest prefix any context needs. Answer copy k (of full_ctx[k]) sees root
  columns < full_end_k and itself causally; its position ids are full_end_k, full_end_k + 1, ...
  The mem contexts share their prompt with the trajectory itself: p_k = the longest common prefix
  of mem_ctx[k] and sequence_ids (system + question, usually a little more), detected here. Suffix
  s_k = mem_ctx[k][p_k:] sees root columns < p_k and itself causally (positions p_k, ...); its
  answer copy sees root columns < p_k, all of s_k and itself causally (positions p_k + |s_k|, ...).
  The root is plain causal. The mask is a dense 4-D additive float mask `[1, 1, S, S]` in the
  model's dtype: 0 where attention is allowed, `torch.finfo(dtype).min` elsewhere, passed with
  explicit `position_ids` `[1, S]` (HF transformers returns a 4-D mask as is; needs
  `attn_implementation` "sdpa" or "eager"). Cost ~ L + K(|a|-1) + sum_k(|s_k| + |a|-1) tokens.

* `score_cached`: the same layout, with the root computed once with `use_cache=True` (plain causal,
  no mask: the fast path) and the answer copies and mem suffixes then scored against that KV cache
  as one flat query block `[a'_1]...[s_K][a'_Km]` of Q tokens, with the rows `[L, S)` of the packed
  mask (`[1, 1, Q, L + Q]`: cache columns >= full_end_k hidden for copy k, >= p_k for mem k) and
  the same position ids. The query block is appended to the cache by the forward and cropped off
  (`cache.crop(-Q)`) before the next chunk. A flat block over the batch-1 cache needs no copy of
  the cache, unlike expanding it to a batch of K (`batch_repeat_interleave`), and needs one forward
  for all rounds, unlike cropping the cache to each full_end_k in turn.

Micro-batching (`token_budget`, tokens per forward, default 16384). Reference: consecutive
contexts are batched while rows x padded length <= token_budget. Packed / cached: the answer copies
and mem (suffix, answer) units of a trajectory are split into chunks with L + (chunk tokens) <=
token_budget; the packed form recomputes the root per chunk, the cached form reuses its cache. A
single unit (or a reference context) longer than the budget still runs, alone; a trajectory whose
root alone exceeds the budget still runs as one forward per unit (packed) or one root forward plus
one forward per unit (cached): memory then grows with L (the packed mask is S x S).

Limits: packed and cached need a dense mask: `attn_implementation` "sdpa" or "eager". A model set
to a flash-attention implementation (the trainer's packed varlen path) is switched to "sdpa" for
the call and back afterwards; any other implementation, and layers other than full attention
(sliding windows), raise ValueError. The reference works with any attention implementation.

Everything runs under `torch.no_grad()` with the model in eval mode (its mode is restored after);
results are Python floats. Importing this module imports torch only (no transformers): models are
duck-typed (HF-style `forward(input_ids, attention_mask, position_ids, use_cache, cache |
past_key_values)`).
"""
from __future__ import annotations

import inspect
import weakref
from dataclasses import dataclass, field
from typing import Optional, Sequence, Union

import torch

from mempo.ops.answer_logprob import answer_logprob, answer_logprob_from_hidden

__all__ = [
    "DEFAULT_ANSWER_TEMPLATE",
    "METHODS",
    "ScoredRound",
    "ScoringRequest",
    "ScoringResult",
    "ScoringStats",
    "build_answer",
    "score",
    "score_cached",
    "score_packed",
    "score_reference",
]

DEFAULT_ANSWER_TEMPLATE = "\n<think>\nI have the answer.\n</think>\n<answer>\n{answer}\n</answer>"
METHODS = ("packed", "cached", "reference")
DEFAULT_TOKEN_BUDGET = 16384


# ------------------------------------------------------------------------------------------------
# records
# ------------------------------------------------------------------------------------------------
@dataclass
class ScoredRound:
    """One scored round r of a trajectory.

    full_end: full_ctx[r] = sequence_ids[:full_end] (1 <= full_end <= len(sequence_ids)).
    mem_ctx_ids: mem_ctx[r] = system + question + round r's "<mem>...</mem>", token ids (non-empty).
    """

    full_end: int
    mem_ctx_ids: list[int]


@dataclass
class ScoringRequest:
    """One trajectory to score.

    sequence_ids: prompt + response as generated (the full context, tool results included).
    rounds: the rounds to score, in order (may be empty: nothing is computed for this request).
    answer_ids: the scored continuation (template around the gold answer), non-empty.
    answer_mask: 1 on gold-answer tokens, 0 on template tokens; len(answer_mask) == len(answer_ids).
    """

    sequence_ids: list[int]
    rounds: list[ScoredRound]
    answer_ids: list[int]
    answer_mask: list[int]


@dataclass
class ScoringResult:
    """Per scored round of one request, in the order of `request.rounds` (Python numbers).

    p_full / p_mem: P(answer | full_ctx[r]) / P(answer | mem_ctx[r]); empty_value when no token kept.
    mem_reward: p_mem - p_full.
    num_kept_full / num_kept_mem: gold tokens that passed the threshold (diagnostics).
    """

    p_full: list[float] = field(default_factory=list)
    p_mem: list[float] = field(default_factory=list)
    mem_reward: list[float] = field(default_factory=list)
    num_kept_full: list[int] = field(default_factory=list)
    num_kept_mem: list[int] = field(default_factory=list)


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
# answer template + answer mask
# ------------------------------------------------------------------------------------------------
def _encode_with_offsets(tokenizer, text: str):
    """(ids, offsets) without special tokens, from a `tokenizers.Tokenizer` or an HF fast tokenizer."""
    if not callable(tokenizer) and hasattr(tokenizer, "encode"):  # tokenizers.Tokenizer
        enc = tokenizer.encode(text, add_special_tokens=False)
        return list(enc.ids), [tuple(o) for o in enc.offsets]
    try:
        enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    except NotImplementedError as exc:  # slow (Python) HF tokenizers have no offsets
        raise ValueError("build_answer needs character offsets: use a fast tokenizer "
                         "(tokenizers / PreTrainedTokenizerFast)") from exc
    return list(enc["input_ids"]), [tuple(o) for o in enc["offset_mapping"]]


def build_answer(
    tokenizer,
    gold: Union[str, Sequence[str]],
    template: str = DEFAULT_ANSWER_TEMPLATE,
    *,
    separator: str = "; ",
) -> tuple[list[int], list[int]]:
    """Tokenise the scored continuation and mark its gold-answer tokens.

    Args:
        tokenizer: a `tokenizers.Tokenizer` or an HF fast tokenizer (character offsets needed; works
            with byte-level BPE). Special tokens are not added.
        gold: the gold answer; a list/tuple of sub-answers (multi-objective) is joined with
            `separator`, and only the sub-answers' characters count as gold (separators do not). A
            str is one answer, all of its characters gold.
        template: the continuation, with "{answer}" exactly once where the gold text goes.
        separator: joins sub-answers.

    Returns:
        (answer_ids, answer_mask): lists of equal length; answer_mask[i] = 1 iff token i's character
        span [start, end) overlaps a gold character (a token that straddles a template/gold boundary,
        such as " London" after "; ", counts as gold). An empty gold gives an all-zero mask
        (P = empty_value for every context).
    """
    if template.count("{answer}") != 1:
        raise ValueError("template must contain '{answer}' exactly once")
    parts = [gold] if isinstance(gold, str) else list(gold)
    if not all(isinstance(p, str) for p in parts):
        raise ValueError("gold must be a str or a sequence of str")
    head, tail = template.split("{answer}")
    spans, pieces, at = [], [], len(head)
    for j, part in enumerate(parts):
        if j:
            pieces.append(separator)
            at += len(separator)
        pieces.append(part)
        if part:
            spans.append((at, at + len(part)))
        at += len(part)
    text = head + "".join(pieces) + tail
    ids, offsets = _encode_with_offsets(tokenizer, text)
    mask = [int(any(s < g1 and e > g0 for g0, g1 in spans)) for s, e in offsets]
    return ids, mask


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
# the model, duck-typed
# ------------------------------------------------------------------------------------------------
_FUSED_OK: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def _named_param(fn, name: str) -> bool:
    try:
        return name in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False


class _Model:
    """Runs an HF-style causal LM and returns the states of selected rows: final hidden states
    (fused path) or logits (fallback)."""

    def __init__(self, model, fused: Optional[bool], need_dense_mask: bool):
        self.model = model
        params = next(iter(model.parameters()), None)
        self.device = params.device if params is not None else torch.device("cpu")
        emb = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
        weight = getattr(emb, "weight", None)
        self.vocab_size = int(weight.shape[0]) if isinstance(weight, torch.Tensor) else None
        self.dtype = weight.dtype if isinstance(weight, torch.Tensor) and weight.is_floating_point() \
            else (params.dtype if params is not None else torch.float32)
        config = getattr(model, "config", None)
        if need_dense_mask and config is not None:
            impl = getattr(config, "_attn_implementation", None)
            if impl not in (None, "sdpa", "eager"):
                raise ValueError(
                    f"packed / cached scoring passes a dense 4-D additive mask, which needs "
                    f"attn_implementation 'sdpa' or 'eager'; this model uses {impl!r}. Load it with "
                    f"attn_implementation='sdpa' or use method='reference'.")
            types = set(getattr(config, "layer_types", None) or ())
            if types - {"full_attention"}:
                raise ValueError(f"packed / cached scoring supports full-attention layers only; "
                                 f"this model has layer types {sorted(types)}: use method='reference'")
        self.base, self.head = self._fused_parts(fused)
        self.cache_kw = self._cache_keyword(self.base if self.base is not None else model)
        self.logits_to_keep = self.base is None and _named_param(model.forward, "logits_to_keep")

    @staticmethod
    def _cache_keyword(runner) -> str:
        """`cache` (transformers >= 5.2x) or `past_key_values` (older): the first module in the tree
        whose forward names one of them (a wrapper taking **kwargs defers to what it wraps)."""
        modules = runner.modules() if hasattr(runner, "modules") else [runner]
        for module in modules:
            for name in ("cache", "past_key_values"):
                if _named_param(module.forward, name):
                    return name
        return "past_key_values"

    # -- which path ------------------------------------------------------------------------------
    def _fused_parts(self, fused):
        model = self.model
        if fused is False:
            return None, None
        base = model.get_decoder() if hasattr(model, "get_decoder") else None
        head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
        ok = (base is not None and base is not model and head is not None
              and isinstance(getattr(head, "weight", None), torch.Tensor)
              and head.weight.dim() == 2)
        if ok:
            cached = _FUSED_OK.get(model)
            if cached is None:
                cached = self._probe(base, head)
                _FUSED_OK[model] = cached
            ok = cached
        if not ok:
            if fused:
                raise ValueError("fused=True, but this model's logits are not "
                                 "get_output_embeddings()(get_decoder()(...).last_hidden_state)")
            return None, None
        return base, head

    def _probe(self, base, head) -> bool:
        """True iff model(ids).logits == F.linear(base(ids).last_hidden_state, W, b) on 4 tokens."""
        n = self.vocab_size or int(head.weight.shape[0])
        ids = (torch.arange(4, device=self.device) * 7 + 1) % n
        try:
            logits = self.model(input_ids=ids[None], use_cache=False).logits[0].float()
            hidden = base(input_ids=ids[None], use_cache=False).last_hidden_state[0]
        except Exception:  # noqa: BLE001 - any failure means: do not use the fused path
            return False
        bias = getattr(head, "bias", None)
        mine = torch.nn.functional.linear(hidden, head.weight, bias).float()
        if mine.shape != logits.shape:
            return False
        scale = max(1.0, float(logits.abs().max()))
        return bool(torch.allclose(mine, logits, rtol=1e-4, atol=1e-5 * scale))

    @property
    def fused(self) -> bool:
        return self.base is not None

    # -- forward -----------------------------------------------------------------------------------
    def run(self, input_ids, position_ids, attention_mask, rows, cache=None, use_cache=False):
        """One forward. input_ids / position_ids: int64 [B, S]; attention_mask: None or additive
        [B or 1, 1, S, kv]; rows: int64 [R] flat indices into B x S. Returns (states [R, H] hidden
        or [R, V] logits, cache or None)."""
        kwargs = dict(input_ids=input_ids, position_ids=position_ids,
                      attention_mask=attention_mask, use_cache=use_cache)
        if cache is not None:
            kwargs[self.cache_kw] = cache
        B, S = input_ids.shape
        if self.fused:
            out = self.base(**kwargs)
            states = out.last_hidden_state.reshape(B * S, -1).index_select(0, rows)
        else:
            keep_pos = None
            if self.logits_to_keep and not rows.numel():
                kwargs["logits_to_keep"] = 1  # nothing to read: the smallest slice
            elif self.logits_to_keep:
                if B == 1:
                    keep_pos = torch.unique(rows)  # sorted
                    kwargs["logits_to_keep"] = keep_pos
                else:
                    first = int((rows % S).min())
                    kwargs["logits_to_keep"] = S - first
            out = self.model(**kwargs)
            logits = out.logits
            if keep_pos is not None:
                states = logits[0].index_select(0, torch.searchsorted(keep_pos, rows))
            else:
                kept = logits.shape[1]
                r_b, r_s = rows // S, rows % S - (S - kept)
                states = logits[r_b, r_s]
        new_cache = None
        if use_cache:
            new_cache = getattr(out, "cache", None)
            if new_cache is None:
                new_cache = getattr(out, "past_key_values", None)
        return states, new_cache

    def reduce(self, states, targets, cu, threshold, temperature, empty_value, backend):
        mask = torch.ones(targets.shape, dtype=torch.bool, device=targets.device)
        if self.fused:
            bias = getattr(self.head, "bias", None)
            return answer_logprob_from_hidden(
                states, self.head.weight, targets, mask, cu, bias=bias, threshold=threshold,
                temperature=temperature, empty_value=empty_value, backend=backend)
        return answer_logprob(states, targets, mask, cu, threshold=threshold,
                              temperature=temperature, empty_value=empty_value, backend=backend)


class _Rows:
    """Collects, over all forwards of a call, the states of the masked-in answer rows of every
    context. Context id: 2 * (global round index) + (0 full, 1 mem)."""

    def __init__(self, requests: Sequence[ScoringRequest]):
        self.requests = requests
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

    def take(self, model: _Model, forward_args: dict, picks: list[tuple[int, int, int]]):
        """Run model.run(**forward_args) for the flat rows of `picks` = [(ctx, answer index i,
        flat row)], store the states. Returns the cache (when forward_args asks for one)."""
        rows = torch.tensor([p[2] for p in picks], dtype=torch.int64, device=model.device)
        states, cache = model.run(rows=rows, **forward_args)
        self.chunks.append(states)
        for n, (ctx, i, _) in enumerate(picks):
            self.where[ctx][i] = self.count + n
        self.count += len(picks)
        return cache

    def results(self, model: _Model, threshold, temperature, empty_value, backend):
        order, targets, cu = [], [], [0]
        for req_i, req in enumerate(self.requests):
            for rnd in range(len(req.rounds)):
                for kind in (0, 1):
                    where = self.where[self.ctx(req_i, rnd, kind)]
                    for i in self.gold[req_i]:
                        order.append(where[i])
                        targets.append(req.answer_ids[i])
                    cu.append(len(order))
        dev = model.device
        if self.chunks:
            states = torch.cat(self.chunks, 0)
        else:
            width = model.head.weight.shape[1] if model.fused else (model.vocab_size or 1)
            states = torch.zeros(0, width, dtype=model.dtype, device=dev)
        states = states.index_select(0, torch.tensor(order, dtype=torch.int64, device=dev))
        out = model.reduce(states, torch.tensor(targets, dtype=torch.int64, device=dev),
                           torch.tensor(cu, dtype=torch.int64, device=dev),
                           threshold, temperature, empty_value, backend)
        p = out.p.cpu().tolist()
        kept = out.num_kept.cpu().tolist()
        results = []
        for req_i, req in enumerate(self.requests):
            res = ScoringResult()
            for rnd in range(len(req.rounds)):
                c = self.ctx(req_i, rnd, 0)
                res.p_full.append(p[c])
                res.p_mem.append(p[c + 1])
                res.mem_reward.append(p[c + 1] - p[c])
                res.num_kept_full.append(int(kept[c]))
                res.num_kept_mem.append(int(kept[c + 1]))
            results.append(res)
        return results


# ------------------------------------------------------------------------------------------------
# the packed layout
# ------------------------------------------------------------------------------------------------
@dataclass
class _Segment:
    ids: list[int]
    pos0: int                          # position id of its first token
    parents: list[tuple[int, int]]     # visible (unit-relative or root) column intervals, see _Unit


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
def _prepare(model, requests, token_budget, fused, need_dense_mask):
    requests = list(requests)
    _check_budget(token_budget)
    runner = _Model(model, fused, need_dense_mask)
    _validate(requests, runner.vocab_size)
    return requests, runner, _Rows(requests)


class _EvalMode:
    """Eval mode + no_grad for one scoring call; with `dense_mask`, a model running a flash-attention
    implementation (no dense masks) is switched to SDPA for the call and switched back after: the
    policy trains through flash-attn varlen while its scoring pass keeps the prefix-sharing mask."""

    def __init__(self, model, dense_mask: bool = False):
        self.model = model
        self.dense_mask = dense_mask

    def __enter__(self):
        self.was_training = bool(getattr(self.model, "training", False))
        self.model.eval()
        self.no_grad = torch.no_grad()
        self.no_grad.__enter__()
        config = getattr(self.model, "config", None)
        self.saved_impl = getattr(config, "_attn_implementation", None)
        if self.dense_mask and isinstance(self.saved_impl, str) and "flash" in self.saved_impl:
            config._attn_implementation = "sdpa"
        else:
            self.saved_impl = None

    def __exit__(self, *exc):
        if self.saved_impl is not None:
            self.model.config._attn_implementation = self.saved_impl
        self.no_grad.__exit__(*exc)
        self.model.train(self.was_training)
        return False


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
        stats: optional `ScoringStats` to add this call's work to.

    Returns:
        One `ScoringResult` per request (Python floats).
    """
    with _EvalMode(model):
        requests, runner, rows = _prepare(model, requests, token_budget, fused, False)
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
) -> list[ScoringResult]:
    """One forward per trajectory over `[root][answer copies][mem suffix + answer]...` with a dense
    4-D additive mask and explicit position ids (layout: module docstring).

    Each forward: input_ids int64 [1, S], position_ids int64 [1, S], attention_mask model-dtype
    [1, 1, S, S] (0 / finfo.min). More than one forward per trajectory only when
    root + copies exceed `token_budget` (the root is then recomputed per chunk). Needs
    attn_implementation "sdpa" or "eager" and full-attention layers (ValueError otherwise).
    Arguments and result: as `score_reference`.
    """
    with _EvalMode(model, dense_mask=True):
        requests, runner, rows = _prepare(model, requests, token_budget, fused, True)
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


def _crop(cache, length: int) -> None:
    """Crop a transformers Cache back to `length` tokens (negative crop: remove the extra tokens;
    transformers 5.x rejects a positive argument)."""
    extra = cache.get_seq_length() - length
    if extra > 0:
        cache.crop(-extra)


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
) -> list[ScoringResult]:
    """KV-cache reuse: per trajectory, the root `sequence_ids[:L]` once with `use_cache=True`
    (input_ids [1, L], no mask: causal fast path), then the answer copies and mem suffixes as one
    flat query block (input_ids [1, Q]) against that cache with the rows [L, L+Q) of the packed
    mask (model-dtype [1, 1, Q, L + Q]) and the packed position ids. Chunks of the query block
    (`token_budget`) reuse the same cache, cropped back to L after each. The cache is the model's
    own (a transformers `DynamicCache`, passed back as `cache=` / `past_key_values=`). Needs
    attn_implementation "sdpa" or "eager" and full-attention layers (ValueError otherwise).
    Arguments and result: as `score_reference`.
    """
    with _EvalMode(model, dense_mask=True):
        requests, runner, rows = _prepare(model, requests, token_budget, fused, True)
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
                    _crop(cache, root_len)
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


def score(
    model,
    requests: Sequence[ScoringRequest],
    method: str = "packed",
    *,
    threshold: Optional[float] = 0.5,
    token_budget: int = DEFAULT_TOKEN_BUDGET,
    temperature: float = 1.0,
    empty_value: float = 0.0,
    fused: Optional[bool] = None,
    backend: str = "auto",
    stats: Optional[ScoringStats] = None,
) -> list[ScoringResult]:
    """Score every round of every request: `method` "packed" (default), "cached" or "reference".

    All three give the same numbers up to floating-point rounding; "cached" is the fastest on CPU
    (the root runs on the causal fast path), "packed" needs no cache support, "reference" works with
    any attention implementation. Arguments and result: as `score_reference`.
    """
    fns = {"packed": score_packed, "cached": score_cached, "reference": score_reference}
    if method not in fns:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    return fns[method](model, requests, threshold=threshold, token_budget=token_budget,
                       temperature=temperature, empty_value=empty_value, fused=fused,
                       backend=backend, stats=stats)
