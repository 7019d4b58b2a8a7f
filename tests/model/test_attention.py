"""mempo.model.attention: grouped K/V heads passed to torch SDPA as they are, inside `grouped_kv_attention`
and without gradient, bit-identical to transformers' own "sdpa" attention; everything else unchanged."""
import types

import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

from mempo.model import attention
from mempo.model.attention import grouped_kv_attention, sdpa_grouped_kv
from mempo.model.builtin import tiny_model, train_tokenizer
from mempo.rollout.backends import HFBackend
from mempo.rollout.backends.base import GenerationRequest, SamplingParams


@pytest.fixture
def grouped_calls(monkeypatch):
    """The number of torch SDPA calls made with ``enable_gqa=True``: the grouped path was taken."""
    calls = {"grouped": 0}
    sdpa = torch.nn.functional.scaled_dot_product_attention

    def counting(*args, **kwargs):
        calls["grouped"] += bool(kwargs.get("enable_gqa", False))
        return sdpa(*args, **kwargs)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", counting)
    return calls


def _module(groups: int) -> types.SimpleNamespace:
    return types.SimpleNamespace(num_key_value_groups=groups, is_causal=True)


def _inputs(batch, heads, groups, tq, tk, dtype, mask_kind, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(batch, heads, tq, 16, generator=g).to(dtype)
    k = torch.randn(batch, heads // groups, tk, 16, generator=g).to(dtype)
    v = torch.randn(batch, heads // groups, tk, 16, generator=g).to(dtype)
    if mask_kind is None:
        return q, k, v, None
    keep = torch.ones(batch, 1, tq, tk, dtype=torch.bool).tril(tk - tq)
    keep[0, :, :, : min(3, tk - 1)] = False  # a left-padded row
    if mask_kind == "bool":
        return q, k, v, keep
    return q, k, v, torch.zeros(keep.shape, dtype=dtype).masked_fill(~keep, torch.finfo(dtype).min)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("mask_kind", ["bool", "additive", None])
@pytest.mark.parametrize("shape", [(3, 4, 2, 1, 37), (2, 6, 3, 19, 19), (1, 4, 4, 5, 5)])
def test_bit_identical_to_transformers_sdpa(dtype, mask_kind, shape, grouped_calls):
    batch, heads, groups, tq, tk = shape
    q, k, v, mask = _inputs(batch, heads, groups, tq, tk, dtype, mask_kind)
    module = _module(groups)
    expected, _ = sdpa_attention_forward(module, q, k, v, mask, scaling=0.25)
    with torch.no_grad(), grouped_kv_attention():
        got, weights = sdpa_grouped_kv(module, q, k, v, mask, scaling=0.25)
    assert weights is None and got.dtype == dtype and got.shape == (batch, tq, heads, 16)
    assert torch.equal(got, expected)
    assert not torch.isnan(got).any()
    assert grouped_calls["grouped"] >= 1


def test_gradient_and_outside_the_context_keep_transformers_path(grouped_calls):
    q, k, v, mask = _inputs(2, 4, 2, 7, 7, torch.float32, "bool")
    module = _module(2)
    with torch.no_grad():  # outside the context
        outside, _ = sdpa_grouped_kv(module, q, k, v, mask)
    k_ref = k.clone().requires_grad_()
    expected, _ = sdpa_attention_forward(module, q, k_ref, v, mask)
    expected.sum().backward()
    k_got = k.clone().requires_grad_()
    with grouped_kv_attention():  # gradient recorded: the repeat, so K/V gradients are unchanged
        got, _ = sdpa_grouped_kv(module, q, k_got, v, mask)
    got.sum().backward()
    assert grouped_calls["grouped"] == 0
    assert torch.equal(outside, expected.detach()) and torch.equal(got, expected)
    assert torch.equal(k_got.grad, k_ref.grad)


def test_context_is_reset_and_registry_keeps_the_original():
    with grouped_kv_attention():
        assert attention._ACTIVE.get()
        with grouped_kv_attention():  # nested, installed once
            assert ALL_ATTENTION_FUNCTIONS["sdpa"] is sdpa_grouped_kv
        assert attention._ACTIVE.get()
    assert not attention._ACTIVE.get()
    assert attention._ORIGINAL is sdpa_attention_forward


def _model() -> Qwen2ForCausalLM:
    config = Qwen2Config(vocab_size=97, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                         eos_token_id=1, pad_token_id=0, attn_implementation="sdpa")
    torch.manual_seed(0)
    return Qwen2ForCausalLM(config).eval()


def test_real_model_forward_and_sampling_unchanged(grouped_calls):
    model = _model()
    ids = torch.randint(2, 97, (3, 11), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    mask[0, :4] = 0  # left padding
    mask[2, :1] = 0
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=mask).logits
        with grouped_kv_attention():
            logits_grouped = model(input_ids=ids, attention_mask=mask).logits
    assert torch.equal(logits, logits_grouped)
    options = dict(attention_mask=mask, max_new_tokens=9, do_sample=True, top_k=0, pad_token_id=0)
    with torch.no_grad():
        torch.manual_seed(5)
        plain = model.generate(input_ids=ids, **options)
        torch.manual_seed(5)
        with grouped_kv_attention():
            grouped = model.generate(input_ids=ids, **options)
    assert torch.equal(plain, grouped)
    assert grouped_calls["grouped"] > 0


def test_hf_backend_generates_through_the_grouped_path(grouped_calls, monkeypatch):
    tok = train_tokenizer(["alpha beta gamma delta <mem> </mem> <search> </search>"] * 4, vocab_size=300)
    model = tiny_model(tok, "mini", seed=0)
    assert model.config.num_key_value_heads < model.config.num_attention_heads
    backend = HFBackend(model, tok)
    requests = [GenerationRequest(prompt_ids=tok.encode(text), max_new_tokens=7)
                for text in ("alpha", "beta gamma delta alpha beta", "gamma delta")]
    sampling = SamplingParams(temperature=1.0, seed=3)
    grouped = backend.generate(requests, sampling)
    assert grouped_calls["grouped"] > 0
    monkeypatch.setattr(attention, "_applies", lambda *args: False)  # transformers' own path throughout
    plain = backend.generate(requests, sampling)
    assert [(o.token_ids, o.logprobs, o.finish_reason) for o in grouped] == \
        [(o.token_ids, o.logprobs, o.finish_reason) for o in plain]
