"""mempo.model.adapter: the decoder/head split and its probe, the cache keyword, inference mode and
the attention switch, and the selected logits SFT uses."""
import pytest
import torch

from mempo.model.adapter import (SelectiveLogits, cache_keyword, check_dense_mask_support, decoder_and_head,
                                 exact_decoder_and_head, head_matches_logits, inference, uses_flash_attention)
from support.rollout_fixtures import tiny_qwen2

pytest.importorskip("transformers")


class _Wrapper(torch.nn.Module):
    """No get_decoder / output head: only the model's logits can be read."""

    def __init__(self, inner):
        super().__init__()
        self.inner = inner

    def forward(self, **kwargs):
        return self.inner(**kwargs)


def _softcapped(model):
    original = model.forward

    def capped(*args, **kwargs):
        out = original(*args, **kwargs)
        out.logits = 20.0 * torch.tanh(out.logits / 20.0)
        return out

    model.forward = capped
    return model


def test_decoder_and_head_split():
    model = tiny_qwen2(64)
    decoder, head = decoder_and_head(model)
    assert decoder is model.model and head is model.lm_head
    assert head_matches_logits(model, decoder, head)
    assert exact_decoder_and_head(model) == (decoder, head)
    assert exact_decoder_and_head(model, fused=False) == (None, None)
    assert decoder_and_head(_Wrapper(model)) is None and exact_decoder_and_head(_Wrapper(model)) == (None, None)
    capped = _softcapped(tiny_qwen2(64))
    assert decoder_and_head(capped) is not None and exact_decoder_and_head(capped) == (None, None)  # the probe
    with pytest.raises(ValueError, match="fused=True"):
        exact_decoder_and_head(capped, fused=True)


def test_the_probe_leaves_the_model_as_it_was():
    model = tiny_qwen2(64).train()
    head_matches_logits(model, *decoder_and_head(model))
    assert model.training and all(p.grad is None for p in model.parameters())


def test_cache_keyword_is_one_the_decoder_takes():
    import inspect

    model = tiny_qwen2(64)
    name = cache_keyword(model.model)
    assert name in ("cache", "past_key_values") and name in inspect.signature(model.model.forward).parameters


def test_inference_switches_flash_to_sdpa_and_restores_on_error():
    model = tiny_qwen2(64).train()
    model.config._attn_implementation = "flash_attention_2"
    assert uses_flash_attention(model)
    with pytest.raises(RuntimeError, match="inside"):
        with inference(model, dense_mask=True):
            assert not model.training and not torch.is_grad_enabled()
            assert model.config._attn_implementation == "sdpa"
            check_dense_mask_support(model)  # sdpa inside the block
            raise RuntimeError("inside")
    assert model.training and torch.is_grad_enabled() and model.config._attn_implementation == "flash_attention_2"
    with inference(model):  # no dense mask: the implementation stays
        assert model.config._attn_implementation == "flash_attention_2"
    with pytest.raises(ValueError, match="attn_implementation"):
        check_dense_mask_support(model)


def test_selective_logits_equal_the_models_logits():
    torch.manual_seed(0)
    model = tiny_qwen2(64)
    ids = torch.randint(0, 64, (2, 9))
    attention = torch.ones_like(ids)
    attention[1, 7:] = 0
    select = torch.rand(2, 8) < 0.5
    lm = SelectiveLogits(model)
    assert lm.selective
    got = lm.logits(lm.states(ids, attention)[:, :-1], select)
    # the expression train/sft.py computes today, bit for bit
    hidden = model.model(input_ids=ids, attention_mask=attention, use_cache=False).last_hidden_state
    assert torch.equal(got, model.get_output_embeddings()(hidden[:, :-1][select]).float())
    full = model(input_ids=ids, attention_mask=attention, use_cache=False).logits[:, :-1][select].float()
    torch.testing.assert_close(got, full, atol=1e-5, rtol=1e-5)
    wrapped = SelectiveLogits(_Wrapper(model))
    assert not wrapped.selective
    assert torch.equal(wrapped.logits(wrapped.states(ids, attention)[:, :-1], select), full)
