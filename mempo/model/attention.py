"""Grouped-query attention on the CPU without copying K/V heads, for forward passes that record no
gradient (generation).

transformers' "sdpa" attention repeats each K/V head ``num_key_value_groups`` times (`repeat_kv`,
a copy of the whole cache per layer and token) whenever an attention mask is given, which batched,
left-padded generation always does; torch's SDPA takes the grouped heads as they are
(``enable_gqa=True``). On the CPU the two give bit-identical outputs (the same kernel reads head
``h // groups`` instead of a copy of it: ``tests/model/test_attention.py``), and generation of the
demo's model takes 19 % less time in evaluation (bench/RESULTS.md). The gradients of K and V are not
bit-identical (the kernel sums the group's heads in another order), so a pass that records a
gradient keeps the repeat: training is unchanged.
"""
from __future__ import annotations

import threading
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, Callable, Iterator, Optional

import torch

__all__ = ["grouped_kv_attention", "sdpa_grouped_kv"]

_ACTIVE: ContextVar[bool] = ContextVar("mempo_grouped_kv_attention", default=False)
_LOCK = threading.Lock()
_ORIGINAL: Optional[Callable[..., Any]] = None  # transformers' "sdpa" function, kept when ours replaces it


def _applies(module: Any, query: torch.Tensor, key: torch.Tensor, kwargs: dict) -> bool:
    """Grouped heads are passed as they are only inside `grouped_kv_attention`, without gradient
    recording, on CPU tensors, for a module with grouped K/V heads and no attention weights asked for."""
    groups = int(getattr(module, "num_key_value_groups", 1) or 1)
    return (_ACTIVE.get() and not torch.is_grad_enabled() and query.device.type == "cpu" and groups > 1
            and key.shape[1] * groups == query.shape[1] and not kwargs.get("output_attentions", False))


def sdpa_grouped_kv(module: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                    attention_mask: Optional[torch.Tensor], dropout: float = 0.0, scaling: Optional[float] = None,
                    is_causal: Optional[bool] = None, **kwargs: Any) -> tuple[torch.Tensor, None]:
    """transformers' "sdpa" attention function (same arguments and result): query ``[B, H, Tq, D]``,
    key / value ``[B, H / groups, Tk, D]``, mask bool or additive ``[B, 1, Tq, Tk]`` or None; returns
    ``([B, Tq, H, D], None)`` in the query's dtype. Where `_applies`, torch SDPA with ``enable_gqa``;
    anywhere else transformers' own function, unchanged."""
    if _ORIGINAL is None or not _applies(module, query, key, kwargs):
        original = _ORIGINAL if _ORIGINAL is not None else _transformers_sdpa()
        return original(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                        is_causal=is_causal, **kwargs)
    # 1. causal flag as transformers sets it: only for a prefill without a mask (the kernel's own mask)
    is_causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    is_causal = bool(query.shape[2] > 1 and attention_mask is None and is_causal)
    # 2. out[b, h] = softmax(q[b, h] k[b, h // groups]^T * scale + mask) v[b, h // groups]
    out = torch.nn.functional.scaled_dot_product_attention(query, key, value, attn_mask=attention_mask,
                                                           dropout_p=dropout, scale=scaling, is_causal=is_causal,
                                                           enable_gqa=True)
    # 3. [B, H, Tq, D] -> [B, Tq, H, D], as transformers returns it
    return out.transpose(1, 2).contiguous(), None


def _transformers_sdpa() -> Callable[..., Any]:
    # reason: transformers is optional; `import mempo.model.attention` stays without it
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    return sdpa_attention_forward


def _install() -> None:
    """Put `sdpa_grouped_kv` in transformers' attention registry under "sdpa" (once; outside
    `grouped_kv_attention` it calls the function it replaced, so nothing else changes)."""
    global _ORIGINAL
    # reason: as in `_transformers_sdpa`
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
    with _LOCK:
        current = ALL_ATTENTION_FUNCTIONS["sdpa"]
        if current is sdpa_grouped_kv:
            return
        _ORIGINAL = current
        ALL_ATTENTION_FUNCTIONS["sdpa"] = sdpa_grouped_kv


@contextmanager
def grouped_kv_attention() -> Iterator[None]:
    """Within: "sdpa" attention of a transformers model passes grouped K/V heads to torch SDPA
    without repeating them (`sdpa_grouped_kv`), for passes without gradient on the CPU; the outputs
    are those of transformers' own function, bit for bit. Per thread and task (a context variable)."""
    _install()
    token = _ACTIVE.set(True)
    try:
        yield
    finally:
        _ACTIVE.reset(token)
