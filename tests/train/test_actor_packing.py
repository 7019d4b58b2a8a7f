"""mempo.train.actor packing: the padding-free forward (one [1, N] sequence of the rows' real tokens)
gives the log-probs, gradients and updates of the padded forward; the knob and the token budget."""
import pytest
import torch

pytest.importorskip("transformers")

from mempo.model.adapter import pack_rows, resolve_packing  # noqa: E402
from mempo.train.actor import Actor, plan_micro_batches  # noqa: E402
from mempo.config import ActorConfig, ConfigError  # noqa: E402
from support.dist import torchrun  # noqa: E402
from support.paths import SUPPORT  # noqa: E402

VOCAB, LENGTH = 128, 20
# (first, last) real-token column of each row: full, length 1 (right padded), left padded, right
# padded, left padded, length 1 (left padded), one with padding on both sides
SPANS = [(0, 19), (0, 0), (7, 19), (0, 10), (15, 19), (19, 19), (3, 16)]


def make_model(attn_implementation: str = "sdpa", seed: int = 0, dtype: torch.dtype = torch.float32):
    import transformers

    torch.manual_seed(seed)
    config = transformers.Qwen2Config(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=False)
    return transformers.AutoModelForCausalLM.from_config(config, attn_implementation=attn_implementation, dtype=dtype)


def make_batch():
    """Rows of `SPANS`; the response is every real token after a row's first two (none for row 3)."""
    g = torch.Generator().manual_seed(4321)
    input_ids = torch.randint(0, VOCAB, (len(SPANS), LENGTH), generator=g)
    columns = torch.arange(LENGTH)
    first = torch.tensor([a for a, _ in SPANS])[:, None]
    last = torch.tensor([b for _, b in SPANS])[:, None]
    attention_mask = ((columns >= first) & (columns <= last)).long()
    response_mask = (columns >= first + 2) & attention_mask.bool()
    response_mask[3] = False  # a row without loss tokens
    advantages = torch.randn(len(SPANS), LENGTH, generator=g)
    return {"input_ids": input_ids, "attention_mask": attention_mask, "response_mask": response_mask}, advantages


def log_probs(actor, batch, **kwargs):
    return actor.compute_log_probs(batch["input_ids"], batch["attention_mask"], batch.get("position_ids"),
                                   batch["response_mask"], **kwargs)


def test_pack_rows_layout():
    input_ids = torch.tensor([[5, 6, 7], [0, 0, 8], [9, 0, 0]])
    attention = torch.tensor([[True, True, True], [False, False, True], [True, False, False]])
    positions = torch.tensor([[0, 1, 2], [0, 0, 0], [4, 0, 0]])
    rows = pack_rows(input_ids, attention, positions)
    assert rows.input_ids.tolist() == [[5, 6, 7, 8, 9]]
    assert rows.position_ids.tolist() == [[0, 1, 2, 0, 4]]
    assert rows.cu_seqlens.dtype == torch.int32 and rows.cu_seqlens.tolist() == [0, 3, 4, 5]
    assert rows.max_length == 3
    assert rows.index.tolist() == [[0, 1, 2], [-1, -1, 3], [4, -1, -1]]
    assert rows.varlen_kwargs() == {"cu_seq_lens_q": rows.cu_seqlens, "cu_seq_lens_k": rows.cu_seqlens,
                                    "max_length_q": 3, "max_length_k": 3}
    assert rows.positions_delimit_rows()
    continuing = pack_rows(input_ids, attention, torch.tensor([[0, 1, 2], [0, 0, 3], [7, 0, 0]]))
    assert not continuing.positions_delimit_rows()  # row 1 continues row 0's count: one sequence to transformers


@pytest.mark.parametrize("attn_implementation", ["sdpa", "eager"])
@pytest.mark.parametrize("micro_batch_tokens", [None, 24])
def test_packed_log_probs_equal_padded(attn_implementation, micro_batch_tokens):
    batch, _ = make_batch()
    results = {}
    for packing in ("packed", "padded"):
        actor = Actor(make_model(attn_implementation), ActorConfig(packing=packing, logprob_chunk_tokens=7))
        assert actor.packed == (packing == "packed")
        results[packing] = log_probs(actor, batch, temperature=0.7, with_entropy=True,
                                     micro_batch_tokens=micro_batch_tokens)
    packed, padded = results["packed"], results["padded"]
    assert packed.log_probs.dtype == torch.float32 and packed.log_probs.shape == batch["input_ids"].shape
    assert (packed.log_probs[batch["response_mask"]] != 0).all()
    assert (packed.log_probs[~batch["response_mask"]] == 0).all()
    torch.testing.assert_close(packed.log_probs, padded.log_probs, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(packed.entropy, padded.entropy, atol=1e-5, rtol=1e-5)


def test_packed_keeps_given_position_ids():
    batch, _ = make_batch()
    real = batch["attention_mask"].bool()
    offsets = torch.tensor([3, 0, 7, 2, 11, 5, 1])[:, None]  # no row continues the previous row's count
    batch["position_ids"] = torch.where(real, real.long().cumsum(-1) - 1 + offsets, 0)
    # (rotary attention sees only relative positions, so a per-row offset changes no log-prob; it is
    # here to show that such position ids, unlike the ones below, pack; pack_rows' copying of the
    # given ids is checked in test_pack_rows_layout)
    packed = log_probs(Actor(make_model(), ActorConfig(packing="packed")), batch).log_probs
    padded = log_probs(Actor(make_model(), ActorConfig(packing="padded")), batch).log_probs
    torch.testing.assert_close(packed, padded, atol=1e-5, rtol=1e-5)

    batch["position_ids"] = torch.where(real, real.long().cumsum(-1) - 1 + 100 * torch.arange(len(SPANS))[:, None], 0)
    batch["position_ids"][1, 0] = batch["position_ids"][0, 19] + 1  # row 1 continues row 0 (0..19 then 20)
    with pytest.raises(ValueError, match="packing='padded'"):
        log_probs(Actor(make_model(), ActorConfig(packing="packed")), batch)


@pytest.mark.parametrize("micro_batch_tokens", [None, 30])
def test_packed_update_equals_padded(micro_batch_tokens):
    """Same metrics, gradients (read after the step: the update leaves the last mini-batch's
    gradients in place) and parameters; with a budget the two modes also plan different micro-batches."""
    batch, advantages = make_batch()
    results = {}
    for packing in ("packed", "padded"):
        torch.manual_seed(0)
        config = ActorConfig(lr=1e-3, eps=1e-3, kl_coef=0.1, entropy_coef=0.01, grad_clip=None, packing=packing,
                             micro_batch_tokens=micro_batch_tokens, loss_agg_mode="seq-mean-token-mean")
        actor = Actor(make_model(), config)
        old = log_probs(actor, batch).log_probs - 0.05
        metrics = actor.update(batch, advantages, old, old - 0.3, temperature=0.9)
        grads = [p.grad.detach().clone() for p in actor.module.parameters()]
        results[packing] = metrics, grads, [p.detach().clone() for p in actor.module.parameters()]
    (m_packed, g_packed, p_packed), (m_padded, g_padded, p_padded) = results["packed"], results["padded"]
    assert m_packed["kl_loss"] > 0 and m_packed["grad_norm"] > 0
    for key in ("loss", "pg_loss", "kl_loss", "entropy", "pg_clipfrac", "ppo_kl", "ratio_mean", "ratio_max",
                "ratio_min", "grad_norm", "num_tokens"):
        assert m_packed[key] == pytest.approx(m_padded[key], rel=1e-5, abs=1e-7), key
    for a, b in zip(g_packed, g_padded):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-4)
    for a, b in zip(p_packed, p_padded):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)


def test_packed_budget_counts_real_tokens():
    first, last = [0, 5, 0], [9, 9, 2]  # 10, 5 and 3 real tokens
    assert plan_micro_batches(first, last, 15) == [[0], [1], [2]]  # padded: 2 rows x 10 columns > 15
    assert plan_micro_batches(first, last, 15, packed=True) == [[0, 1], [2]]  # packed: 10 + 5, then 18 > 15
    assert plan_micro_batches(first, last, 4, packed=True) == [[0], [1], [2]]  # over budget alone: runs alone
    assert plan_micro_batches(first, last, None, packed=True) == [[0, 1, 2]]


def test_packing_knob():
    with pytest.raises(ConfigError, match="packing: must be one of 'auto', 'packed', 'padded', got 'varlen'") as error:
        ActorConfig(packing="varlen")
    assert error.value.field == "packing"
    assert resolve_packing("auto", "flash_attention_2") and resolve_packing("auto", "flash_attention_3")
    assert not resolve_packing("auto", "sdpa") and not resolve_packing("auto", "eager")
    assert resolve_packing("packed", "sdpa") and not resolve_packing("padded", "flash_attention_2")
    with pytest.raises(ValueError, match="flex_attention"):
        resolve_packing("packed", "flex_attention")
    assert not Actor(make_model(), ActorConfig()).packed  # auto on SDPA: padded


def test_flash_route_hands_cu_seqlens_to_the_attention_function(monkeypatch):
    """The flash-attention route on CPU: an attention function registered under a "flash" name (set
    on the config directly, so transformers does not import flash-attn) receives no mask and the
    actor's cu_seqlens / max_length, as flash_attn_varlen_func would; attending within those rows
    with SDPA gives the padded log-probs and update."""
    import torch.nn.functional as F
    from transformers import AttentionInterface

    calls = []

    def varlen_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
        cu_seqlens = kwargs["cu_seq_lens_q"]
        calls.append((attention_mask, cu_seqlens, kwargs["cu_seq_lens_k"], kwargs["max_length_q"]))
        out = torch.empty_like(query)  # [1, heads, N, head_dim]
        for start, end in zip(cu_seqlens[:-1].tolist(), cu_seqlens[1:].tolist()):
            out[:, :, start:end] = F.scaled_dot_product_attention(
                query[:, :, start:end], key[:, :, start:end], value[:, :, start:end], is_causal=True, scale=scaling,
                enable_gqa=True)
        return out.transpose(1, 2), None

    monkeypatch.setitem(AttentionInterface._global_mapping, "flash_varlen_reference", varlen_attention)
    batch, advantages = make_batch()
    config = ActorConfig(lr=1e-3, kl_coef=0.0, micro_batch_tokens=30)
    varlen_model = make_model()
    varlen_model.config._attn_implementation = "flash_varlen_reference"
    varlen, padded = Actor(varlen_model, config), Actor(make_model(), config)
    assert varlen.packed and not padded.packed  # "auto"
    got, expected = log_probs(varlen, batch, with_entropy=True), log_probs(padded, batch, with_entropy=True)
    mask, cu_q, cu_k, max_length = calls[0]
    lengths = [b - a + 1 for a, b in SPANS]
    assert mask is None and cu_q is cu_k and cu_q.dtype == torch.int32
    assert max_length == max(lengths[:2]) and cu_q.tolist() == [0, lengths[0], lengths[0] + lengths[1]]
    torch.testing.assert_close(got.log_probs, expected.log_probs, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got.entropy, expected.entropy, atol=1e-5, rtol=1e-5)
    old = expected.log_probs - 0.05
    m_varlen, m_padded = varlen.update(batch, advantages, old), padded.update(batch, advantages, old)
    for key in ("loss", "pg_loss", "entropy", "ratio_mean", "grad_norm", "num_tokens"):
        assert m_varlen[key] == pytest.approx(m_padded[key], rel=1e-5, abs=1e-7), key


@pytest.mark.gpu
def test_flash_attention_packed_matches_sdpa_padded_on_cuda(monkeypatch):
    """bf16 on CUDA: flash_attention_2 packed (through flash_attn_varlen_func with the actor's
    cu_seqlens) against SDPA padded, for log-probs and one update."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    from transformers.utils import is_flash_attn_2_available

    # Not importorskip("flash_attn"): flash-attn-4 (an sglang dependency) installs a namespace
    # flash_attn/ holding only flash_attn/cute, which imports but has no flash_attn_varlen_func.
    if not is_flash_attn_2_available():
        pytest.skip("needs flash-attn 2 (transformers.utils.is_flash_attn_2_available() is False; "
                    "pip install --no-build-isolation '.[flash]')")
    import transformers.integrations.flash_attention as hf_flash

    calls = []
    forward = hf_flash._flash_attention_forward

    def recording_forward(*args, **kwargs):
        calls.append((kwargs.get("attention_mask", args[3] if len(args) > 3 else None), kwargs.get("cu_seq_lens_q")))
        return forward(*args, **kwargs)

    monkeypatch.setattr(hf_flash, "_flash_attention_forward", recording_forward)
    device = torch.device("cuda")
    batch, advantages = make_batch()
    config = ActorConfig(lr=1e-3, kl_coef=0.0, micro_batch_tokens=30)
    sdpa_model = make_model("sdpa", dtype=torch.bfloat16)
    flash_model = make_model("flash_attention_2", dtype=torch.bfloat16)
    flash_model.load_state_dict(sdpa_model.state_dict())
    flash = Actor(flash_model, config, device=device)
    sdpa = Actor(sdpa_model, config, device=device)
    assert flash.packed and not sdpa.packed  # the "auto" default
    got, expected = log_probs(flash, batch, with_entropy=True), log_probs(sdpa, batch, with_entropy=True)
    assert calls and all(mask is None and cu is not None and cu.dtype == torch.int32 for mask, cu in calls)
    torch.testing.assert_close(got.log_probs, expected.log_probs, atol=5e-2, rtol=2e-2)
    torch.testing.assert_close(got.entropy, expected.entropy, atol=5e-2, rtol=2e-2)
    old = expected.log_probs - 0.05
    m_flash, m_sdpa = flash.update(batch, advantages, old), sdpa.update(batch, advantages, old)
    for key in ("loss", "pg_loss", "ratio_mean", "grad_norm", "entropy"):
        assert m_flash[key] == pytest.approx(m_sdpa[key], rel=5e-2, abs=1e-2), key


def test_two_process_fsdp2_packed_matches_single_process_padded(tmp_path):
    """`support.dist_worker`'s run on 2 FSDP2 ranks (gloo) with packed micro-batches gives the metrics of
    one padded process on all rows (its budget of 24 tokens now counts real tokens, so the ranks
    plan other micro-batches than the padded run)."""
    import json

    from support.dist_worker import run

    torchrun(SUPPORT / "dist_packing_worker.py", tmp_path / "two", what="the 2-process FSDP2 run")
    two = json.loads((tmp_path / "two" / "result.json").read_text())
    one = run(tmp_path / "one")
    assert two["world"] == 2 and one["world"] == 1
    for m_one, m_two in zip(one["metrics"] + [one["third"]], two["metrics"] + [two["third"]]):
        for key in ("loss", "pg_loss", "kl_loss", "entropy", "ppo_kl", "ratio_mean", "grad_norm", "num_tokens"):
            assert m_two[key] == pytest.approx(m_one[key], rel=1e-4, abs=1e-6), key
    assert two["third_restored"]["loss"] == two["third"]["loss"]


def test_one_process_refuses_fp32_weights_under_flash_attn_kernels():
    """flash-attn's kernels have no fp32 path: one process (no FSDP2 mixed precision) with fp32 weights
    and attn_implementation flash_attention_2 is refused at construction, naming actor.param_dtype."""
    model = make_model()
    model.config._attn_implementation = "flash_attention_2"
    with pytest.raises(ConfigError, match="actor.param_dtype"):
        Actor(model, ActorConfig(lr=1e-3, kl_coef=0.0, micro_batch_tokens=30))
