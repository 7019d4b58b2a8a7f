"""The model adapter: how mempo runs an HF-style causal LM, for the actor, SFT and teacher scoring.

Models are duck-typed (no transformers import): HF-style ``forward(input_ids, attention_mask,
position_ids, use_cache, cache | past_key_values, logits_to_keep)`` returning ``.logits``, and a
decoder returning ``.last_hidden_state``. Logits are ``head(decoder(...).last_hidden_state)`` where
the model splits that way (`decoder_and_head`, checked by `head_matches_logits`); log-probs are
fp32, ``log_softmax(logits / temperature)`` at the targets.
"""
from __future__ import annotations

import inspect
import weakref
from contextlib import contextmanager
from typing import Any, Iterator, NamedTuple, Optional

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from mempo.config import flash_attention_requested
from mempo.ops import answer_logprob, answer_logprob_from_hidden

__all__ = [
    "DTYPES", "PackedRows", "PolicyLogProbs", "ScoringModel", "SelectiveLogits", "accepts_keyword",
    "attn_implementation", "cache_keyword", "check_dense_mask_support", "crop_cache", "decode_rows",
    "decoder_and_head", "exact_decoder_and_head", "head_matches_logits", "inference", "pack_rows",
    "resolve_packing", "token_log_probs", "uses_flash_attention",
]

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


# ------------------------------------------------------------------------------------------------
# structure: attention implementation, keywords, decoder / head
# ------------------------------------------------------------------------------------------------
def attn_implementation(model: Any) -> Optional[str]:
    """``model.config._attn_implementation`` (None without a config)."""
    return getattr(getattr(model, "config", None), "_attn_implementation", None)


def uses_flash_attention(model: Any) -> bool:
    """Whether the model runs a flash-attention implementation."""
    return flash_attention_requested(attn_implementation(model))


def accepts_keyword(fn: Any, name: str) -> bool:
    """Whether `fn`'s signature names the parameter `name` (False when it has no signature)."""
    try:
        return name in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False


def cache_keyword(module: Any) -> str:
    """``"cache"`` or ``"past_key_values"``: the first module in the tree whose forward names one of
    them (a wrapper taking ``**kwargs`` defers to what it wraps); ``"past_key_values"`` if none does."""
    modules = module.modules() if hasattr(module, "modules") else [module]
    for sub in modules:
        for name in ("cache", "past_key_values"):
            if accepts_keyword(sub.forward, name):
                return name
    return "past_key_values"


def crop_cache(cache: Any, length: int) -> None:
    """Crop a transformers Cache back to `length` tokens (negative crop: remove the extra tokens;
    transformers 5.x rejects a positive argument)."""
    extra = cache.get_seq_length() - length
    if extra > 0:
        cache.crop(-extra)


def model_device(model: nn.Module) -> torch.device:
    """The device of the model's first parameter (CPU without parameters)."""
    params = next(iter(model.parameters()), None)
    return params.device if params is not None else torch.device("cpu")


def _input_embedding_weight(model: Any) -> Optional[torch.Tensor]:
    emb = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    weight = getattr(emb, "weight", None)
    return weight if isinstance(weight, torch.Tensor) else None


def decoder_and_head(model: Any) -> Optional[tuple[nn.Module, nn.Module]]:
    """``(model.get_decoder(), model.get_output_embeddings())`` when the model splits into a decoder
    (not the model itself) and an output head with a 2-D weight; None otherwise."""
    decoder = model.get_decoder() if hasattr(model, "get_decoder") else None
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if (decoder is None or decoder is model or head is None
            or not isinstance(getattr(head, "weight", None), torch.Tensor) or head.weight.dim() != 2):
        return None
    return decoder, head


_HEAD_MATCHES: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def _probe(model: nn.Module, decoder: nn.Module, head: nn.Module) -> bool:
    weight = _input_embedding_weight(model)
    n = (int(weight.shape[0]) if weight is not None else None) or int(head.weight.shape[0])
    ids = (torch.arange(4, device=model_device(model)) * 7 + 1) % n
    try:
        logits = model(input_ids=ids[None], use_cache=False).logits[0].float()
        hidden = decoder(input_ids=ids[None], use_cache=False).last_hidden_state[0]
    except Exception:  # noqa: BLE001 - any failure means: do not use the split
        return False
    bias = getattr(head, "bias", None)
    mine = torch.nn.functional.linear(hidden, head.weight, bias).float()
    if mine.shape != logits.shape:
        return False
    scale = max(1.0, float(logits.abs().max()))
    return bool(torch.allclose(mine, logits, rtol=1e-4, atol=1e-5 * scale))


def head_matches_logits(model: nn.Module, decoder: nn.Module, head: nn.Module) -> bool:
    """Whether ``model(ids).logits == F.linear(decoder(ids).last_hidden_state, W, b)`` on a 4-token
    probe (run once per model, in eval mode without gradients; cached while the model lives)."""
    cached = _HEAD_MATCHES.get(model)
    if cached is None:
        with inference(model):
            cached = _probe(model, decoder, head)
        _HEAD_MATCHES[model] = cached
    return cached


def exact_decoder_and_head(model: nn.Module, fused: Optional[bool] = None
                           ) -> tuple[Optional[nn.Module], Optional[nn.Module]]:
    """``(decoder, head)`` when logits may be computed from the decoder's hidden states, else
    ``(None, None)`` (read the model's own logits). fused: None = when `decoder_and_head` splits the
    model and `head_matches_logits`; False = never; True = required (ValueError otherwise)."""
    if fused is False:
        return None, None
    parts = decoder_and_head(model)
    if parts is None or not head_matches_logits(model, *parts):
        if fused:
            raise ValueError("fused=True, but this model's logits are not "
                             "get_output_embeddings()(get_decoder()(...).last_hidden_state)")
        return None, None
    return parts


# ------------------------------------------------------------------------------------------------
# attention implementation for dense masks; inference mode
# ------------------------------------------------------------------------------------------------
def check_dense_mask_support(model: Any) -> None:
    """ValueError unless the model can take a dense 4-D additive mask: attn_implementation "sdpa",
    "eager" (or none set) and full-attention layers only."""
    config = getattr(model, "config", None)
    if config is None:
        return
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


@contextmanager
def inference(model: nn.Module, dense_mask: bool = False) -> Iterator[None]:
    """Eval mode and no gradients for a block, the model's mode restored after. With `dense_mask`, a
    model running a flash-attention implementation runs "sdpa" inside the block (the policy trains
    through flash-attn varlen; teacher scoring keeps its dense prefix-sharing mask)."""
    was_training = bool(getattr(model, "training", False))
    model.eval()
    config = getattr(model, "config", None)
    saved = attn_implementation(model)
    switched = dense_mask and isinstance(saved, str) and flash_attention_requested(saved)
    try:
        with torch.no_grad():
            if switched:
                config._attn_implementation = "sdpa"
            try:
                yield
            finally:
                if switched:
                    config._attn_implementation = saved
    finally:
        model.train(was_training)


# ------------------------------------------------------------------------------------------------
# packing (the actor)
# ------------------------------------------------------------------------------------------------
def resolve_packing(packing: str, attn_implementation: Optional[str]) -> bool:
    """Whether micro-batches run packed: `packing` is ``ActorConfig.packing`` ("auto": packed only
    under a flash-attention implementation), `attn_implementation` the model's. "packed" needs flash
    attention, "sdpa" or "eager" (ValueError otherwise: other implementations may not honour packed
    position ids)."""
    if packing not in ("auto", "packed", "padded"):
        raise ValueError(f"packing must be 'auto', 'packed' or 'padded', got {packing!r}")
    flash = flash_attention_requested(attn_implementation)
    if packing == "packed" and not (flash or attn_implementation in ("sdpa", "eager")):
        raise ValueError(f"packing='packed' needs attn_implementation 'sdpa', 'eager' or a flash-attention one; "
                         f"the model uses {attn_implementation!r} (use packing='padded')")
    return packing == "packed" or (packing == "auto" and flash)


class PackedRows(NamedTuple):
    """The real tokens of a padded batch's rows concatenated into one sequence (`pack_rows`).

    input_ids / position_ids: int64 ``[1, N]``, N the batch's real tokens, row by row in column
    order. cu_seqlens: int32 ``[rows + 1]``, row r at ``[cu_seqlens[r], cu_seqlens[r + 1])``.
    max_length: the longest row's token count. index: int64 ``[rows, L]``, each real token's place
    in the packed sequence, -1 on padding.
    """

    input_ids: torch.Tensor
    position_ids: torch.Tensor
    cu_seqlens: torch.Tensor
    max_length: int
    index: torch.Tensor

    def varlen_kwargs(self) -> dict[str, Any]:
        """The FlashAttentionKwargs that make transformers call ``flash_attn_varlen_func`` on these
        rows without deriving the boundaries from the position ids."""
        return {"cu_seq_lens_q": self.cu_seqlens, "cu_seq_lens_k": self.cu_seqlens,
                "max_length_q": self.max_length, "max_length_k": self.max_length}

    def positions_delimit_rows(self) -> bool:
        """Whether transformers' packed-sequence detection (a new sequence wherever the position id
        does not step by +1; `masking_utils.find_packed_sequence_indices`) finds exactly these rows,
        as the mask it builds for "sdpa" / "eager" needs: each row's position ids count up by 1 and
        no row continues the previous row's count. True for the default position ids."""
        positions = self.position_ids[0]
        breaks = torch.diff(positions) != 1  # breaks[i]: token i + 1 starts a sequence
        row_start = torch.zeros(positions.shape[0], dtype=torch.bool, device=positions.device)
        row_start[self.cu_seqlens[:-1].long()] = True
        return bool(torch.equal(breaks, row_start[1:]))


def pack_rows(input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor) -> PackedRows:
    """Drop the padding of a ``[rows, L]`` batch and concatenate its rows (`PackedRows`).

    input_ids / position_ids: int64 ``[rows, L]``; attention_mask: bool ``[rows, L]`` (True = real
    token; left, right or any padding), at least one real token per row. Each row keeps its own
    position ids (the actor's default restarts them at 0 for every row).
    """
    lengths = attention_mask.sum(dim=-1)
    cu_seqlens = torch.zeros(lengths.shape[0] + 1, dtype=torch.int32, device=input_ids.device)
    cu_seqlens[1:] = lengths.cumsum(0)
    total = int(cu_seqlens[-1])
    index = torch.full(attention_mask.shape, -1, dtype=torch.long, device=input_ids.device)
    index[attention_mask] = torch.arange(total, device=input_ids.device)
    return PackedRows(input_ids[attention_mask].unsqueeze(0), position_ids[attention_mask].unsqueeze(0), cu_seqlens,
                      int(lengths.max()), index)


def _required_split(model: nn.Module) -> tuple[nn.Module, nn.Module]:
    parts = decoder_and_head(model)
    if parts is None:
        raise ValueError(f"{type(model).__name__} does not split into get_decoder() and an output head with a 2-D "
                         f"weight (get_output_embeddings()); the actor needs both")
    return parts


def decode_rows(model: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                position_ids: torch.Tensor, packed: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """The decoder's final hidden states of a ``[rows, L]`` batch, padded or packed (`pack_rows`).

    Packed: flash attention gets ``cu_seq_lens_q/k`` and ``max_length_q/k``
    (``flash_attn_varlen_func``); "sdpa" / "eager" get the block-diagonal mask transformers derives
    from position ids that step by +1 inside a row only (ValueError otherwise).

    input_ids / position_ids int64, attention_mask bool, all ``[rows, L]``. Returns (hidden
    ``[tokens, H]``, index int64 ``[rows, L]``: each token's row in `hidden`; -1 on padding when packed).
    """
    decoder, _ = _required_split(model)
    if not packed:
        padding = None if bool(attention_mask.all()) else attention_mask.long()
        hidden = decoder(input_ids=input_ids, attention_mask=padding, position_ids=position_ids,
                         use_cache=False).last_hidden_state
        index = torch.arange(input_ids.numel(), device=input_ids.device).view_as(input_ids)
        return hidden.flatten(0, 1), index
    rows = pack_rows(input_ids, attention_mask, position_ids)
    if uses_flash_attention(model):
        varlen = rows.varlen_kwargs()
    elif rows.positions_delimit_rows():
        varlen = {}  # transformers derives the block-diagonal mask from the position ids
    else:
        raise ValueError("packed SDPA/eager attention finds the rows from the position ids, so each row's "
                         "position ids must count up by 1 without continuing the previous row's; "
                         "use packing='padded' for these position ids")
    hidden = decoder(input_ids=rows.input_ids, attention_mask=None, position_ids=rows.position_ids,
                     use_cache=False, **varlen).last_hidden_state
    return hidden[0], rows.index


# ------------------------------------------------------------------------------------------------
# per-token log-probs (the actor)
# ------------------------------------------------------------------------------------------------
def _score_rows(hidden: torch.Tensor, targets: torch.Tensor, head: nn.Module, inv_temperature: float,
                with_entropy: bool):
    logits = head(hidden).float()
    if inv_temperature != 1.0:
        logits = logits * inv_temperature
    log_p = torch.log_softmax(logits, dim=-1)
    picked = log_p.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    if not with_entropy:
        return (picked,)
    p = log_p.exp()
    entropy = -torch.where(p > 0, p * log_p, torch.zeros_like(p)).sum(dim=-1)
    return picked, entropy


def token_log_probs(hidden: torch.Tensor, targets: torch.Tensor, head: nn.Module, temperature: float = 1.0,
                    chunk_rows: int = 1024, with_entropy: bool = False):
    """Log-prob of `targets` under ``softmax(head(hidden) / temperature)``, `chunk_rows` rows at a time.

    hidden: `[N, H]` (any float dtype); targets: int64 `[N]`; head: the lm_head module. Returns
    (log_probs fp32 `[N]`, entropy fp32 `[N]` or None). Under autograd each chunk is checkpointed:
    only `hidden` is kept and the `[chunk_rows, V]` fp32 logits are recomputed in backward.
    """
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    inv_temperature = 1.0 / float(temperature)
    grad = torch.is_grad_enabled() and (hidden.requires_grad or any(p.requires_grad for p in head.parameters()))
    log_probs, entropies = [], []
    for start in range(0, hidden.shape[0], chunk_rows):
        args = (hidden[start:start + chunk_rows], targets[start:start + chunk_rows], head, inv_temperature,
                with_entropy)
        out = checkpoint(_score_rows, *args, use_reentrant=False) if grad else _score_rows(*args)
        log_probs.append(out[0])
        if with_entropy:
            entropies.append(out[1])
    empty = hidden.new_zeros((0,), dtype=torch.float32)
    log_prob = torch.cat(log_probs) if log_probs else empty
    entropy = (torch.cat(entropies) if entropies else empty) if with_entropy else None
    return log_prob, entropy


class PolicyLogProbs(nn.Module):
    """The actor's FSDP root: runs the decoder once (padded or packed, `decode_rows`) and scores only
    the loss tokens (`token_log_probs`)."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, input_ids, attention_mask, position_ids, loss_mask, temperature: float, chunk_rows: int,
                with_entropy: bool, packed: bool):
        """input_ids / position_ids int64, attention_mask / loss_mask bool, all ``[rows, L]``. Returns
        fp32 ``[rows, L]`` log-probs and entropy (None unless `with_entropy`), 0 off `loss_mask`."""
        hidden, index = decode_rows(self.model, input_ids, attention_mask, position_ids, packed)
        _, head = _required_split(self.model)
        rows, cols = loss_mask.nonzero(as_tuple=True)
        # a loss token is never its row's first real token, so the token before it in `hidden` is
        # the previous real token of the same row
        sources = index[rows, cols] - 1
        targets = input_ids[rows, cols]
        padding_only = rows.numel() == 0
        if padding_only:  # one zero-weighted row keeps lm_head in the graph (FSDP needs every rank's grads)
            sources, targets = sources.new_zeros(1), targets.new_zeros(1)
        scored_logp, scored_entropy = token_log_probs(hidden[sources], targets, head, temperature, chunk_rows,
                                                      with_entropy)
        log_probs = hidden.new_zeros(input_ids.shape, dtype=torch.float32)
        entropy = hidden.new_zeros(input_ids.shape, dtype=torch.float32) if with_entropy else None
        if padding_only:
            log_probs = log_probs + 0.0 * scored_logp.sum()
            return log_probs, entropy
        log_probs = log_probs.index_put((rows, cols), scored_logp)
        if with_entropy:
            entropy = entropy.index_put((rows, cols), scored_entropy)
        return log_probs, entropy


# ------------------------------------------------------------------------------------------------
# selected rows (teacher scoring)
# ------------------------------------------------------------------------------------------------
class ScoringModel:
    """Runs a causal LM for teacher scoring and reduces the states of the answer rows to P(answer | ctx).

    States are the final hidden states when `exact_decoder_and_head` allows (fused reduction from
    the lm_head weight, `mempo.ops.answer_logprob_from_hidden`), else the model's logits on those
    rows (``logits_to_keep`` when its forward takes it; `mempo.ops.answer_logprob`). Construct it
    inside `inference`. need_dense_mask: `check_dense_mask_support` first.
    """

    def __init__(self, model: nn.Module, fused: Optional[bool] = None, need_dense_mask: bool = False):
        self.model = model
        self.device = model_device(model)
        weight = _input_embedding_weight(model)
        self.vocab_size = int(weight.shape[0]) if weight is not None else None
        params = next(iter(model.parameters()), None)
        self.dtype = weight.dtype if weight is not None and weight.is_floating_point() \
            else (params.dtype if params is not None else torch.float32)
        if need_dense_mask:
            check_dense_mask_support(model)
        self.base, self.head = exact_decoder_and_head(model, fused)
        self.cache_kw = cache_keyword(self.base if self.base is not None else model)
        self.logits_to_keep = self.base is None and accepts_keyword(model.forward, "logits_to_keep")

    @property
    def fused(self) -> bool:
        return self.base is not None

    @property
    def state_width(self) -> int:
        """Width of a state row: hidden size (fused) or vocabulary size (logits; 1 if unknown)."""
        return self.head.weight.shape[1] if self.fused else (self.vocab_size or 1)

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
        """P(answer | ctx) per context (`mempo.ops.answer_logprob`: exp of the mean kept log-prob, fp32
        [C]): states [N, H or V] of
        the kept answer rows, targets int64 [N], cu int64 [C+1] (context c owns rows cu[c]:cu[c+1])."""
        mask = torch.ones(targets.shape, dtype=torch.bool, device=targets.device)
        if self.fused:
            bias = getattr(self.head, "bias", None)
            return answer_logprob_from_hidden(
                states, self.head.weight, targets, mask, cu, bias=bias, threshold=threshold,
                temperature=temperature, empty_value=empty_value, backend=backend)
        return answer_logprob(states, targets, mask, cu, threshold=threshold,
                              temperature=temperature, empty_value=empty_value, backend=backend)


# ------------------------------------------------------------------------------------------------
# selected logits (SFT)
# ------------------------------------------------------------------------------------------------
class SelectiveLogits:
    """Logits of a causal LM at selected positions only: the head on the selected rows of the
    decoder's hidden states when `exact_decoder_and_head` allows (the vocabulary projection of
    every other position is never computed), else the model's logits at those positions.

    Usage: ``states = lm.states(ids, attention)`` once per batch, then ``lm.logits(states[:, :-1],
    select)`` for each selection.
    """

    def __init__(self, model: nn.Module):
        self.model = model
        self.decoder, self.head = exact_decoder_and_head(model)

    @property
    def selective(self) -> bool:
        return self.decoder is not None

    def states(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """One forward of int64 ``[B, L]`` ids with their 0/1 attention mask: hidden states ``[B, L, H]``
        (selective) or logits ``[B, L, V]``."""
        if self.selective:
            return self.decoder(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).last_hidden_state
        return self.model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).logits

    def logits(self, states: torch.Tensor, select: torch.Tensor) -> torch.Tensor:
        """fp32 logits ``[n, V]`` of the n positions where bool `select` (the shape of ``states[..., 0]``) is True."""
        picked = states[select]
        return (self.head(picked) if self.selective else picked).float()
