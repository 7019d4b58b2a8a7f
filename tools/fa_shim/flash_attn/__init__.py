"""VALIDATION-ONLY stand-in for flash-attn 2 where the real package cannot be built (no wheels;
the GPU check machine has no nvcc build of it). Put on the path by tools/gpu_check.sh only when
transformers finds no real flash-attn 2; never install it.

flash_attn_varlen_func keeps flash-attn 2.8's signature and runs the FlashAttention-2 kernel that
PyTorch bundles (aten._flash_attention_forward, differentiable), so transformers' real
flash_attention_2 integration (varlen kwargs, cu_seqlens, no mask) runs unchanged and mempo's
packed path is checked end to end. flash_attn_func (no padding, no cu_seqlens: generation without
padding) runs SDPA. Checks mirror flash_api.cpp (fp16/bf16 only, int32 cu_seqlens, head_dim % 8
== 0 and <= 256). Results say that the plumbing is right, not how fast real flash-attn is.
"""
import torch

__version__ = "2.8.3"
SHIM = True


def _checks(q, k, v, cu_q=None, cu_k=None):
    if q.dtype not in (torch.float16, torch.bfloat16):
        raise RuntimeError("FlashAttention only support fp16 and bf16 data type")
    if q.shape[-1] % 8 or q.shape[-1] > 256:
        raise RuntimeError("FlashAttention head dim must be a multiple of 8 and at most 256")
    for cu in (cu_q, cu_k):
        if cu is not None and (cu.dtype != torch.int32 or not cu.is_contiguous()):
            raise RuntimeError("cu_seqlens must have dtype int32 and be contiguous")
    if q.shape[-2] % k.shape[-2]:
        raise RuntimeError("Number of heads in key/value must divide number of heads in query")


def _expand_kv(q, k, v):
    rep = q.shape[-2] // k.shape[-2]
    if rep > 1:
        k, v = k.repeat_interleave(rep, dim=-2), v.repeat_interleave(rep, dim=-2)
    return k, v


def flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p=0.0,
                           softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
                           alibi_slopes=None, deterministic=False, return_attn_probs=False, block_table=None):
    _checks(q, k, v, cu_seqlens_q, cu_seqlens_k)
    if softcap or alibi_slopes is not None or block_table is not None or return_attn_probs:
        raise NotImplementedError("shim: softcap / alibi / block_table / attn probs not supported")
    k, v = _expand_kv(q, k, v)
    extra = {}
    if tuple(window_size) != (-1, -1):
        extra = dict(window_size_left=int(window_size[0]), window_size_right=int(window_size[1]))
    out = torch.ops.aten._flash_attention_forward(
        q, k, v, cu_seqlens_q, cu_seqlens_k, int(max_seqlen_q), int(max_seqlen_k), float(dropout_p),
        bool(causal), False, scale=softmax_scale, **extra)[0]
    return out


def flash_attn_func(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1),
                    softcap=0.0, alibi_slopes=None, deterministic=False, return_attn_probs=False):
    """[B, S, H, D] layout; causal is bottom-right aligned as in flash-attn (matters when Sq != Sk)."""
    _checks(q, k, v)
    k, v = _expand_kv(q, k, v)
    qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
    sq, sk = q.shape[1], k.shape[1]
    mask = None
    if causal and sq != sk:
        mask = torch.ones(sq, sk, dtype=torch.bool, device=q.device).tril(diagonal=sk - sq)
    out = torch.nn.functional.scaled_dot_product_attention(
        qt, kt, vt, attn_mask=mask, dropout_p=dropout_p, is_causal=causal and sq == sk, scale=softmax_scale)
    return out.transpose(1, 2)


def flash_attn_with_kvcache(*args, **kwargs):
    raise NotImplementedError("shim: flash_attn_with_kvcache (paged cache) is not provided")
