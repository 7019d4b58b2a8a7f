"""Tests of the memory-reward teacher scoring (mempo.scoring).

The three methods (reference, packed, cached) must agree with each other and with a ground truth
computed here independently: one plain `model(input_ids).logits` forward per context + answer,
log_softmax in float64, threshold and geometric mean by hand. Models are tiny random HF models
built from configs (no downloads): Qwen2 (SDPA) and Llama (eager attention), fp32, seeded. The
Qwen2 lm_head is scaled up so that the next-token distributions are peaked and threshold=0.5 keeps
some gold tokens and drops others; answers mix greedy continuations (high probability) with random
tokens (low probability).

Tolerance: |dP| <= 1e-5 in fp32. Every thresholded ground-truth log-prob is asserted to lie at
least 1e-4 away from log(threshold), so that no keep decision can flip between methods.
"""
import json
import math
import random
import subprocess
import sys

import pytest
import torch

from mempo.algo.contexts import DEFAULT_ANSWER_TEMPLATE, build_answer
from mempo.records.scoring import ScoredRound, ScoringRequest, ScoringResult
from mempo.algo.memory_reward import memory_rewards
from support.dist import torchrun
from support.paths import SUPPORT
from mempo.scoring import (METHODS, ScoringStats, compute_memory_rewards, resolve_method, score, score_cached,
                           score_packed)

transformers = pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")

TOL = 1e-5
VOCAB = 384


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Tiny models gain nothing from threads, and on a loaded 2-core machine two spinning intra-op
    threads make these tests 5-10x slower; restored afterwards."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


# ------------------------------------------------------------------------------------------------
# tiny models
# ------------------------------------------------------------------------------------------------
def _qwen2(attn="sdpa"):
    torch.manual_seed(0)
    cfg = transformers.Qwen2Config(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
        tie_word_embeddings=False, attn_implementation=attn)
    model = transformers.Qwen2ForCausalLM(cfg).float().eval()
    with torch.no_grad():  # peaked next-token distributions: some tokens get p > 0.5
        model.lm_head.weight.mul_(60.0)
    return model


def _llama():
    torch.manual_seed(1)
    cfg = transformers.LlamaConfig(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
        tie_word_embeddings=True, attn_implementation="eager")
    model = transformers.LlamaForCausalLM(cfg).float().eval()
    with torch.no_grad():
        model.model.norm.weight.mul_(40.0)
    return model


@pytest.fixture(scope="module")
def qwen2():
    return _qwen2()


@pytest.fixture(scope="module")
def llama():
    return _llama()


# ------------------------------------------------------------------------------------------------
# ground truth: one plain forward per context, float64 log_softmax, threshold by hand
# ------------------------------------------------------------------------------------------------
def _answer_logps(model, ctx, answer):
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([list(ctx) + list(answer)])).logits[0]
    logp = torch.log_softmax(logits.double(), dim=-1)
    return [float(logp[len(ctx) - 1 + i, a]) for i, a in enumerate(answer)]


def _p_from_logps(logps, mask, threshold):
    vals = [lp for lp, m in zip(logps, mask) if m]
    if threshold is not None:
        log_t = math.log(threshold)
        assert all(abs(lp - log_t) > 1e-4 for lp in vals), "a log-prob sits on the threshold"
        vals = [lp for lp in vals if lp > log_t]
    return (math.exp(sum(vals) / len(vals)) if vals else 0.0), len(vals)


def ground_truth(model, requests, threshold):
    out = []
    for req in requests:
        res = ScoringResult()
        for rnd in req.rounds:
            pf, kf = _p_from_logps(_answer_logps(model, req.sequence_ids[:rnd.full_end],
                                                 req.answer_ids), req.answer_mask, threshold)
            pm, km = _p_from_logps(_answer_logps(model, rnd.mem_ctx_ids, req.answer_ids),
                                   req.answer_mask, threshold)
            res.p_full.append(pf)
            res.p_mem.append(pm)
            res.num_kept_full.append(kf)
            res.num_kept_mem.append(km)
        out.append(res)
    return out


def assert_same(got, want, tol=TOL):
    assert len(got) == len(want)
    for r, (g, w) in enumerate(zip(got, want)):
        assert len(g.p_full) == len(w.p_full) == len(g.p_mem)
        for name, of in (("p_full", lambda x: x.p_full), ("p_mem", lambda x: x.p_mem), ("mem_reward", memory_rewards)):
            for k, (a, b) in enumerate(zip(of(g), of(w))):
                assert isinstance(a, float)
                assert abs(a - b) <= tol, f"request {r} round {k} {name}: {a} vs {b}"
        assert g.num_kept_full == w.num_kept_full, r
        assert g.num_kept_mem == w.num_kept_mem, r


# ------------------------------------------------------------------------------------------------
# synthetic requests
# ------------------------------------------------------------------------------------------------
def _greedy(model, ctx, n):
    ids = list(ctx)
    with torch.no_grad():
        for _ in range(n):
            ids.append(int(model(input_ids=torch.tensor([ids])).logits[0, -1].argmax()))
    return ids[len(ctx):]


def make_requests(model, seed=0):
    """Requests covering: K = 7 and K = 1 rounds, zero rounds, a truncated trajectory (a round
    scored at the very end), multi-objective answer masks, a mem_ctx shorter than the answer, a
    mem_ctx sharing nothing with the sequence, a mem_ctx that is a prefix of the sequence, a
    1-token answer, and different sequence lengths in one call."""
    rng = random.Random(seed)

    def toks(n):
        return [rng.randrange(VOCAB) for _ in range(n)]

    def answer(ctx, n_greedy, n_random, mask):
        ans = _greedy(model, ctx, n_greedy) + toks(n_random)
        return ans, mask

    reqs = []
    # 1. K = 7 rounds over a ~170-token trajectory; answer = greedy tokens + random tail.
    prompt = toks(12)
    seq = prompt + toks(160)
    ends = [20, 35, 60, 80, 110, 140, 165]
    rounds = [ScoredRound(e, prompt + toks(rng.randint(2, 9))) for e in ends]
    ans, mask = answer(seq[:60], 4, 5, [0, 1, 1, 1, 0, 1, 1, 0, 0])
    reqs.append(ScoringRequest(seq, rounds, ans, mask))
    # 2. K = 1, a short trajectory; multi-objective mask (two gold spans, a separator between).
    prompt = toks(8)
    seq = prompt + toks(25)
    ans, mask = answer(seq[:20], 6, 2, [0, 1, 1, 0, 1, 1, 1, 0])
    reqs.append(ScoringRequest(seq, [ScoredRound(20, prompt + toks(4))], ans, mask))
    # 3. Zero rounds (no memory scored): nothing to compute.
    reqs.append(ScoringRequest(toks(30), [], toks(5), [1, 1, 1, 1, 1]))
    # 4. Truncated trajectory: last round scored at len(sequence); mem_ctx (3 tokens) shorter than
    #    the 12-token answer and sharing nothing with the sequence; a mem_ctx that is a prefix of
    #    the sequence (empty suffix) and one equal to a whole full_ctx.
    prompt = toks(10)
    seq = prompt + toks(70)
    mem_short = [(seq[0] + 1) % VOCAB] + toks(2)
    rounds = [ScoredRound(30, mem_short), ScoredRound(55, seq[:14]), ScoredRound(80, seq[:30])]
    ans, mask = answer(seq, 7, 5, [1, 1, 0, 1, 1, 1, 1, 1, 0, 1, 1, 0])
    reqs.append(ScoringRequest(seq, rounds, ans, mask))
    # 5. A 1-token answer (only the context's last row predicts it).
    prompt = toks(6)
    seq = prompt + toks(40)
    ans = _greedy(model, seq[:25], 1)
    reqs.append(ScoringRequest(seq, [ScoredRound(25, prompt + toks(3)),
                                     ScoredRound(40, prompt + toks(6))], ans, [1]))
    return reqs


@pytest.fixture(scope="module")
def qwen2_requests(qwen2):
    return make_requests(qwen2, seed=0)


@pytest.fixture(scope="module")
def llama_requests(llama):
    return make_requests(llama, seed=1)


# ------------------------------------------------------------------------------------------------
# agreement: every method vs the ground truth (and so vs each other)
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("threshold", [0.5, None])
@pytest.mark.parametrize("method", METHODS)
def test_qwen2_methods_match_ground_truth(qwen2, qwen2_requests, method, threshold):
    want = ground_truth(qwen2, qwen2_requests, threshold)
    got = score(qwen2, qwen2_requests, method, threshold=threshold)
    assert_same(got, want)


@pytest.mark.parametrize("method", METHODS)
def test_llama_eager_methods_match_ground_truth(llama, llama_requests, method):
    want = ground_truth(llama, llama_requests, 0.5)
    assert_same(score(llama, llama_requests, method), want)


def test_threshold_is_exercised(qwen2, qwen2_requests):
    """The fixture really tests the threshold: some contexts keep all gold tokens, some part, some
    none (P = 0, the documented empty value), and threshold=None keeps every gold token."""
    res = score_packed(qwen2, qwen2_requests, threshold=0.5)
    counts = []
    for req, r in zip(qwen2_requests, res):
        gold = sum(req.answer_mask)
        for kept, p in zip(r.num_kept_full + r.num_kept_mem, r.p_full + r.p_mem):
            counts.append((kept, gold))
            assert (p == 0.0) == (kept == 0)
            assert 0.0 <= p <= 1.0
    assert any(k == 0 for k, _ in counts)
    assert any(0 < k < g for k, g in counts)
    assert any(k == g for k, g in counts)
    plain = score_packed(qwen2, qwen2_requests, threshold=None)
    for req, r in zip(qwen2_requests, plain):
        assert all(k == sum(req.answer_mask) for k in r.num_kept_full + r.num_kept_mem)
        assert all(p > 0.0 for p in r.p_full + r.p_mem)


def test_empty_value_and_no_gold(qwen2):
    """No gold token (all-zero mask) or threshold 1.0 (nothing passes): P = empty_value, never 1."""
    seq = list(range(1, 30))
    req = ScoringRequest(seq, [ScoredRound(10, seq[:5]), ScoredRound(29, [7, 8])], [3, 4, 5], [0, 0, 0])
    for method in METHODS:
        r = score(qwen2, [req], method)[0]
        assert r.p_full == r.p_mem == [0.0, 0.0] and memory_rewards(r) == [0.0, 0.0]
        assert r.num_kept_full == [0, 0]
        r = score(qwen2, [req], method, empty_value=-1.0)[0]
        assert r.p_full == [-1.0, -1.0]
    req.answer_mask = [1, 1, 1]
    for method in METHODS:
        r = score(qwen2, [req], method, threshold=1.0)[0]
        assert r.p_full == r.p_mem == [0.0, 0.0]


def test_no_rounds_at_all(qwen2):
    reqs = [ScoringRequest([1, 2, 3], [], [4, 5], [1, 1])] * 2
    for method in METHODS:
        stats = ScoringStats()
        assert score(qwen2, reqs, method, stats=stats) == [ScoringResult(), ScoringResult()]
        assert stats.forwards == 0
    assert score(qwen2, [], "packed") == []


# ------------------------------------------------------------------------------------------------
# micro-batching, fallback path, bookkeeping
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("method", METHODS)
def test_token_budget_gives_same_numbers(qwen2, qwen2_requests, method):
    big, small = ScoringStats(), ScoringStats()
    one = score(qwen2, qwen2_requests, method, token_budget=1 << 20, stats=big)
    many = score(qwen2, qwen2_requests, method, token_budget=40, stats=small)
    assert_same(many, one)
    assert small.forwards > big.forwards
    assert small.contexts == big.contexts == 2 * sum(len(r.rounds) for r in qwen2_requests)
    tiny = score(qwen2, qwen2_requests, method, token_budget=1)  # every unit / row alone
    assert_same(tiny, one)


def test_token_counts(qwen2, qwen2_requests):
    """Packed/cached run each trajectory's root once plus |a|-1 tokens per answer copy and each mem
    suffix; the reference runs every context + answer (plus padding)."""
    stats = {m: ScoringStats() for m in METHODS}
    for m in METHODS:
        score(qwen2, qwen2_requests, m, stats=stats[m])
    real_ref = sum(r.full_end + len(q.answer_ids) + len(r.mem_ctx_ids) + len(q.answer_ids)
                   for q in qwen2_requests for r in q.rounds)
    assert stats["reference"].tokens - stats["reference"].padding_tokens == real_ref
    assert stats["packed"].tokens == stats["cached"].tokens
    assert stats["packed"].forwards == sum(1 for q in qwen2_requests if q.rounds)
    assert stats["packed"].tokens < real_ref


def test_logits_fallback_matches_fused(qwen2, qwen2_requests):
    for method in METHODS:
        fused = score(qwen2, qwen2_requests, method, fused=True)
        plain = score(qwen2, qwen2_requests, method, fused=False)
        assert_same(plain, fused)


class _LogitsOnly(torch.nn.Module):
    """A causal LM without get_decoder / get_output_embeddings and a softcapped output: scoring
    must use its logits (the fused path would be wrong)."""

    def __init__(self, inner):
        super().__init__()
        self.inner = inner

    def forward(self, input_ids, attention_mask=None, position_ids=None, use_cache=False, **kw):
        out = self.inner(input_ids=input_ids, attention_mask=attention_mask,
                         position_ids=position_ids, use_cache=use_cache, **kw)
        out.logits = 30.0 * torch.tanh(out.logits / 30.0)
        return out


def test_duck_typed_model_without_structure(qwen2, qwen2_requests):
    wrapped = _LogitsOnly(qwen2).eval()
    want = ground_truth(wrapped, qwen2_requests[:2], 0.5)
    for method in METHODS:
        assert_same(score(wrapped, qwen2_requests[:2], method), want)
    with pytest.raises(ValueError, match="fused=True"):
        score(wrapped, qwen2_requests[:2], "packed", fused=True)


def test_softcapped_output_detected_by_probe(qwen2, qwen2_requests):
    """A model whose forward changes the lm_head output fails the once-per-model probe and is
    scored from its logits, still matching the ground truth."""
    model = _qwen2()
    original = model.forward

    def capped(*args, **kwargs):
        out = original(*args, **kwargs)
        out.logits = 20.0 * torch.tanh(out.logits / 20.0)
        return out

    model.forward = capped
    want = ground_truth(model, qwen2_requests[:2], 0.5)
    assert_same(score(model, qwen2_requests[:2], "cached"), want)


def test_eval_mode_no_grad_and_restore(qwen2_requests):
    model = _qwen2()
    model.train()
    torch.manual_seed(0)
    res = score_cached(model, qwen2_requests[:2])
    assert model.training
    assert all(isinstance(p, float) for r in res for p in r.p_full + r.p_mem)
    assert all(p.grad is None for p in model.parameters())


def test_rejects_bad_input(qwen2):
    good = ScoringRequest([1, 2, 3, 4], [ScoredRound(2, [1, 9])], [5, 6], [1, 1])
    bad = [
        ScoringRequest([1, 2, 3, 4], [ScoredRound(0, [1])], [5], [1]),       # full_end 0
        ScoringRequest([1, 2, 3, 4], [ScoredRound(5, [1])], [5], [1]),       # past the end
        ScoringRequest([1, 2, 3, 4], [ScoredRound(2, [])], [5], [1]),        # empty mem_ctx
        ScoringRequest([1, 2, 3, 4], [ScoredRound(2, [1])], [], []),         # empty answer
        ScoringRequest([1, 2, 3, 4], [ScoredRound(2, [1])], [5, 6], [1]),    # mask length
        ScoringRequest([1, 2, 3, VOCAB], [ScoredRound(2, [1])], [5], [1]),   # id out of range
    ]
    for req in bad:
        with pytest.raises(ValueError):
            score(qwen2, [good, req], "packed")
    with pytest.raises(ValueError, match="method"):
        score(qwen2, [good], "dense")
    with pytest.raises(ValueError, match="token_budget"):
        score(qwen2, [good], "packed", token_budget=0)


def test_packed_needs_dense_mask_attention(qwen2):
    req = ScoringRequest([1, 2, 3, 4], [ScoredRound(2, [1, 9])], [5, 6], [1, 1])
    model = _qwen2()
    model.config._attn_implementation = "flex_attention"
    for method in ("packed", "cached"):
        with pytest.raises(ValueError, match="attn_implementation"):
            score(model, [req], method)


def test_auto_method_by_device_and_attention(qwen2, qwen2_requests):
    """"auto" is "cached" on CPU, "reference" for a model with non-full-attention layers (packed and
    cached raise for it), "packed" on another device; it gives the methods' numbers; a bad name raises."""
    assert resolve_method(qwen2) == "cached"
    assert resolve_method(qwen2, "packed") == "packed"
    assert_same(score(qwen2, qwen2_requests), score(qwen2, qwen2_requests, "reference"))
    model = _qwen2()
    model.config._attn_implementation = "flex_attention"
    assert resolve_method(model) == "reference"
    assert model.config._attn_implementation == "flex_attention"
    model = _qwen2()
    model.config.layer_types = ["sliding_attention"] * len(model.config.layer_types or [0] * 2)
    assert resolve_method(model) == "reference"
    meta = _qwen2().to("meta")
    assert resolve_method(meta) == "packed"
    with pytest.raises(ValueError, match="'auto' or one of"):
        resolve_method(qwen2, "dense")


@pytest.mark.parametrize("method", ["packed", "cached"])
def test_flash_attention_model_is_scored_through_sdpa(monkeypatch, qwen2_requests, method):
    """A policy that trains with flash attention (packed varlen) is scored with the dense
    prefix-sharing mask through SDPA for the call, then switched back; flash is never called."""
    from transformers import AttentionInterface

    def flash_probe(*args, **kwargs):
        raise AssertionError("the flash-attention function was called during dense-mask scoring")

    monkeypatch.setitem(AttentionInterface._global_mapping, "flash_scoring_probe", flash_probe)
    model = _qwen2()
    want = ground_truth(model, qwen2_requests[:2], 0.5)
    model.config._attn_implementation = "flash_scoring_probe"
    assert_same(score(model, qwen2_requests[:2], method), want)
    assert model.config._attn_implementation == "flash_scoring_probe"
    with pytest.raises(AssertionError, match="flash-attention function was called"):
        score(model, qwen2_requests[:1], "reference")
    assert model.config._attn_implementation == "flash_scoring_probe"


def test_import_does_not_load_transformers():
    code = "import sys, mempo.scoring; assert 'transformers' not in sys.modules, 'loaded'"
    subprocess.run([sys.executable, "-c", code], check=True)


# ------------------------------------------------------------------------------------------------
# answer template and answer mask from offsets
# ------------------------------------------------------------------------------------------------
_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
          r"|\s*[\r\n]+|\s+(?!\S)|\s+")
_TEXT = ("<think> I have the answer. </think> <answer> Paris; London; Marie Curie; 1889; "
         "São Paulo; 東京; the Nile river </answer> who was the first president of the company "
         "when was the museum founded; 42; 3.14; naïve café").split()


@pytest.fixture(scope="module", params=["qwen2-split", "no-split"])
def bpe(request):
    """Byte-level BPE trained here: with the Qwen2 pre-tokenizer split, or with no split at all
    (merges then cross word and template boundaries)."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

    rng = random.Random(3)
    corpus = [" ".join(rng.choice(_TEXT) for _ in range(rng.randint(3, 20))) + rng.choice(["\n", ""])
              for _ in range(400)]
    tok = Tokenizer(models.BPE())
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.pre_tokenizer = byte_level if request.param == "no-split" else pre_tokenizers.Sequence(
        [pre_tokenizers.Split(Regex(_SPLIT), behavior="isolated"), byte_level])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(corpus, trainer=trainer)
    return tok


GOLDS = ["Paris", ["Paris", "London"], ["Marie Curie", "1889", "São Paulo", "東京"], "the Nile river",
         ["42", "3.14"], "naïve café"]


@pytest.mark.parametrize("gold", GOLDS, ids=lambda g: "multi" if isinstance(g, list) else "single")
def test_answer_mask_from_offsets(bpe, gold):
    ids, mask = build_answer(bpe, gold)
    parts = [gold] if isinstance(gold, str) else gold
    text = DEFAULT_ANSWER_TEMPLATE.replace("{answer}", "; ".join(parts))
    enc = bpe.encode(text, add_special_tokens=False)
    assert ids == enc.ids and len(mask) == len(ids)
    assert bpe.decode(ids) == text  # byte-level: lossless
    # Gold characters <-> masked tokens: every gold character lies under a masked token, and every
    # masked token overlaps a gold character; template and separator characters outside.
    gold_chars, at = set(), text.index("<answer>\n") + len("<answer>\n")
    for j, part in enumerate(parts):
        gold_chars.update(range(at, at + len(part)))
        at += len(part) + 2
    covered = set()
    for (s, e), m in zip(enc.offsets, mask):
        chars = set(range(s, e))
        assert bool(m) == bool(chars & gold_chars)
        if m:
            covered |= chars
    assert gold_chars <= covered
    # The masked tokens decode to text that holds every sub-answer, in order, and nothing of the
    # template beyond the boundary pieces.
    masked_text = bpe.decode([t for t, m in zip(ids, mask) if m])
    pos = 0
    for part in parts:
        pos = masked_text.index(part, pos) + len(part)
    assert "<answer>" not in masked_text and "</answer>" not in masked_text
    assert "I have the answer" not in masked_text


def test_answer_mask_separators_out_with_split(bpe):
    """With the Qwen2 split the separator ';' is its own token: masked out between sub-answers."""
    ids, mask = build_answer(bpe, ["Paris", "London", "42"])
    pieces = [bpe.decode([t]) for t in ids]
    for piece, m in zip(pieces, mask):
        if piece.strip() == ";":
            assert m == 0
    assert sum(mask) >= 3


def test_build_answer_hf_fast_tokenizer_and_template(bpe):
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=bpe)
    for gold in GOLDS:
        assert build_answer(fast, gold) == build_answer(bpe, gold)
    ids, mask = build_answer(bpe, "Paris", template="A: {answer}.")
    assert bpe.decode(ids) == "A: Paris."
    assert bpe.decode([t for t, m in zip(ids, mask) if m]).strip() == "Paris"
    assert sum(build_answer(bpe, "")[1]) == 0
    with pytest.raises(ValueError):
        build_answer(bpe, "x", template="no placeholder")


def test_build_answer_end_to_end(bpe, qwen2):
    """Answer ids from the trained tokenizer, scored by every method: same numbers."""
    rng = random.Random(5)
    prompt = bpe.encode("who was the first president of the company", add_special_tokens=False).ids
    seq = prompt + [rng.randrange(VOCAB) for _ in range(50)]
    ans, mask = build_answer(bpe, ["Marie Curie", "1889"])
    req = ScoringRequest(seq, [ScoredRound(30, prompt + [5, 6, 7]), ScoredRound(len(seq), prompt + [8])],
                         ans, mask)
    want = ground_truth(qwen2, [req], None)
    for method in METHODS:
        assert_same(score(qwen2, [req], method, threshold=None), want)


# ------------------------------------------------------------------------------------------------
# per-objective scoring (answer_objectives: one CSR segment per objective's gold tokens)
# ------------------------------------------------------------------------------------------------
def _mean_from_logps(logps, labels, j, threshold):
    vals = [lp for lp, o in zip(logps, labels) if o == j]
    if threshold is not None:
        vals = [lp for lp in vals if lp > math.log(threshold)]
    return (sum(vals) / len(vals) if vals else 0.0), len(vals)


def objective_requests(requests):
    """The fixture's requests with objective labels: each maximal run of gold tokens is one objective
    (request 4 gets 3 runs), plus one objective with no token at all (an empty alias) at the end."""
    out = []
    for req in requests:
        labels, j, before = [], -1, 0
        for m in req.answer_mask:
            if m and not before:
                j += 1
            labels.append(j if m else -1)
            before = m
        out.append(ScoringRequest(req.sequence_ids, req.rounds, req.answer_ids, req.answer_mask,
                                  answer_objectives=labels, num_objectives=j + 2))
    return out


@pytest.mark.parametrize("threshold", [0.5, None])
@pytest.mark.parametrize("method", METHODS)
def test_per_objective_segments_match_ground_truth(qwen2, qwen2_requests, method, threshold):
    """Every objective of every context reduced apart matches a hand reduction of the float64 log-probs;
    the whole-context values (merged from the segments) match the plain call's, and the methods agree."""
    requests = objective_requests(qwen2_requests)
    assert max(r.num_objectives for r in requests) >= 4
    got = score(qwen2, requests, method, threshold=threshold)
    assert_same(got, ground_truth(qwen2, qwen2_requests, threshold))  # p, num_kept of the whole answer
    plain = score(qwen2, qwen2_requests, method, threshold=threshold)
    for req, g, w in zip(requests, got, plain):
        for k, rnd in enumerate(req.rounds):
            for name, ctx in (("full", req.sequence_ids[:rnd.full_end]), ("mem", rnd.mem_ctx_ids)):
                assert abs(getattr(g, f"mean_logp_{name}")[k] - getattr(w, f"mean_logp_{name}")[k]) <= TOL
                logps = _answer_logps(qwen2, ctx, req.answer_ids)
                p = getattr(g, f"objective_p_{name}")[k]
                mean = getattr(g, f"objective_mean_logp_{name}")[k]
                kept = getattr(g, f"objective_num_kept_{name}")[k]
                assert len(p) == len(mean) == len(kept) == req.num_objectives
                for j in range(req.num_objectives):
                    want_mean, want_kept = _mean_from_logps(logps, req.answer_objectives, j, threshold)
                    assert kept[j] == want_kept, (k, name, j)
                    assert abs(mean[j] - want_mean) <= 1e-4, (k, name, j)
                    assert abs(p[j] - (math.exp(want_mean) if want_kept else 0.0)) <= TOL
                assert kept[-1] == 0 and p[-1] == 0.0 and mean[-1] == 0.0  # the objective without tokens
        assert g.objective_p_full and not w.objective_p_full or not req.rounds


def test_mean_logp_matches_ground_truth(qwen2, qwen2_requests):
    for method in METHODS:
        got = score(qwen2, qwen2_requests, method, threshold=None)
        for req, g in zip(qwen2_requests, got):
            assert len(g.mean_logp_full) == len(g.mean_logp_mem) == len(req.rounds)
            for k, rnd in enumerate(req.rounds):
                want, _ = _mean_from_logps(_answer_logps(qwen2, rnd.mem_ctx_ids, req.answer_ids),
                                           [0 if m else -1 for m in req.answer_mask], 0, None)
                assert abs(g.mean_logp_mem[k] - want) <= 1e-4
                assert abs(math.exp(g.mean_logp_mem[k]) - g.p_mem[k]) <= TOL


def test_rejects_bad_objective_labels(qwen2):
    base = dict(sequence_ids=[1, 2, 3, 4], rounds=[ScoredRound(2, [1, 9])], answer_ids=[5, 6, 7],
                answer_mask=[1, 0, 1])
    score(qwen2, [ScoringRequest(**base, answer_objectives=[0, -1, 1], num_objectives=2)], "packed")
    for labels, k, match in (([0, -1], 2, "answer_objectives has 2"), ([0, -1, 2], 2, r"answer_objectives\[2\] = 2"),
                             ([0, 1, 1], 2, r"answer_objectives\[1\] = 1"), ([-1, -1, 0], 1, r"answer_objectives\[0\]"),
                             ([0, -1, 0], 0, "num_objectives")):
        with pytest.raises(ValueError, match=match):
            score(qwen2, [ScoringRequest(**base, answer_objectives=labels, num_objectives=k)], "packed")


# ------------------------------------------------------------------------------------------------
# compute_memory_rewards: the configured definition over real trajectories
# ------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def agent_batch():
    from support.rollout_fixtures import chat_tokenizer, text_trajectory, tiny_qwen2

    tok = chat_tokenizer()
    model = tiny_qwen2(len(tok), seed=3)
    with torch.no_grad():
        model.lm_head.weight.mul_(8.0)  # spread P over several orders of magnitude
    golds = [["Paris", "paris"], ["Rome"]]
    first = [("q", "<search>a</search>", "<information>nothing here</information>"),
             ("none yet", "<search>b</search>", "<information>Tamor lives in Paris.</information>"),
             ("Paris", "<search>c</search>", "<information>the river is the Rome.</information>"),
             ("Paris and Rome", "<answer>Paris; Rome</answer>", None)]
    second = [("q", "<search>b</search>", "<information>Tamor lives in Paris.</information>"),
              ("I forgot", "<answer>Rome</answer>", None)]
    trajectories = [text_trajectory(tok, "Where and which river?", first, golds),
                    text_trajectory(tok, "Where and which river?", second, golds, sample_index=1),
                    text_trajectory(tok, "Where?", first[:1] + [("x", "<answer>Oslo</answer>", None)], "Oslo", uid="p")]
    return model, tok, trajectories


def _cfg(**fields):
    from mempo.config.schema import ScoringConfig

    return ScoringConfig(**fields)


def _p_after(model, ctx, answer_ids, answer_mask):
    mean, n = _mean_from_logps(_answer_logps(model, ctx, answer_ids), [0 if m else -1 for m in answer_mask], 0, None)
    return math.exp(mean) if n else 0.0, mean


DEFINITIONS = [dict(), dict(comparator="history_mem"), dict(scored_objectives="retrieved"),
               dict(reward="log", threshold=None, log_clip=2.0),
               dict(comparator="history_mem", scored_objectives="retrieved", reward="log", threshold=None),
               dict(scored_objectives="complete", reward="log", threshold=None, log_clip=10.0, objective_reduce="min")]


@pytest.mark.parametrize("definition", DEFINITIONS, ids=lambda d: ",".join(f"{k}={v}" for k, v in d.items()) or "paper")
def test_compute_memory_rewards_by_definition(agent_batch, definition):
    from mempo.algo.contexts import build_answer, comparator_end, scoring_requests
    from mempo.algo.memory_reward import memory_rewards_of

    model, tok, trajectories = agent_batch
    cfg = _cfg(**definition)
    by_method = {m: compute_memory_rewards(model, tok, trajectories, _cfg(**definition, method=m)) for m in METHODS}
    rewards, details = by_method[resolve_method(model, cfg.method)]  # the default "auto": cached on CPU
    assert [len(r) for r in rewards] == [len(t.scored_rounds()) for t in trajectories] == [3, 1, 1]
    for method, (other, _) in by_method.items():  # every method, the same rewards (None in the same places)
        for a, b in zip(rewards, other):
            assert [x is None for x in a] == [x is None for x in b], method
            assert all(abs(x - y) <= TOL for x, y in zip(a, b) if x is not None), method
    if not definition:  # the default is the paper's P(mem_ctx) - P(full_ctx), as before
        want = memory_rewards_of(trajectories, score(model, scoring_requests(trajectories, tok)))
        assert rewards == want
    # independent check of each round: one plain forward per context
    for t, per_round, items in zip(trajectories, rewards, details):
        objectives = [["Paris"], ["Rome"]] if isinstance(t.golds, list) else [["Oslo"]]
        answer_ids, answer_mask = build_answer(tok, [o[0] for o in objectives] if len(objectives) > 1 else "Oslo")
        retrieved = t.retrieved_objectives(tok)
        for k, (round_, reward, item) in enumerate(zip(t.scored_rounds(), per_round, items)):
            cmp_ctx = t.sequence_ids[:comparator_end(t, round_, cfg.comparator)]
            mem_ctx = t.prompt_ids + t.response_ids[round_.mem_span[0]:round_.mem_span[1]]
            if cfg.threshold is None:
                assert abs(item.p_cmp - _p_after(model, cmp_ctx, answer_ids, answer_mask)[0]) <= TOL
                assert abs(item.logp_mem - _p_after(model, mem_ctx, answer_ids, answer_mask)[1]) <= 1e-4
            if cfg.scored_objectives != "all":
                every = list(range(len(objectives)))
                scored = retrieved[k] if cfg.scored_objectives == "retrieved" else (
                    every if sorted(retrieved[k]) == every else [])
                assert item.objectives == scored
                if not scored:
                    assert reward is None
                    continue
                gaps = []
                for j in scored:
                    gold = [int(m) for m in tok_objective_mask(tok, objectives, j)]
                    pm, lm = _p_after(model, mem_ctx, answer_ids, gold)
                    pc, lc = _p_after(model, cmp_ctx, answer_ids, gold)
                    gaps.append(pm - pc if cfg.reward == "prob" else max(-cfg.log_clip, min(cfg.log_clip, lm - lc)))
                want = min(gaps) if cfg.objective_reduce == "min" else sum(gaps) / len(gaps)
            elif cfg.reward == "log":
                want = max(-cfg.log_clip, min(cfg.log_clip, item.logp_mem - item.logp_cmp))
            else:
                want = item.p_mem - item.p_cmp
            assert reward is not None and abs(reward - want) <= 1e-4, (k, reward, want)
    if cfg.scored_objectives == "retrieved":
        assert rewards[0][0] is None and rewards[2] == [None]  # nothing retrieved before those rounds
        assert rewards[0][1] is not None and details[0][2].objectives == [0, 1]
    if cfg.scored_objectives == "complete":  # only the round after both golds were retrieved
        assert [r is None for r in rewards[0]] == [True, True, False] and details[0][2].objectives == [0, 1]


def tok_objective_mask(tok, objectives, j):
    from mempo.algo.contexts import build_objective_answer

    _, labels = build_objective_answer(tok, [o[0] for o in objectives])
    return [int(o == j) for o in labels]


def test_the_comparators_differ(agent_batch):
    """history_mem continues from the round's </mem>, the paper's from before the round: other numbers."""
    model, tok, trajectories = agent_batch
    _, paper = compute_memory_rewards(model, tok, trajectories, _cfg(threshold=None))
    _, ours = compute_memory_rewards(model, tok, trajectories, _cfg(threshold=None, comparator="history_mem"))
    flat = [(a.logp_cmp, b.logp_cmp, a.logp_mem, b.logp_mem) for x, y in zip(paper, ours) for a, b in zip(x, y)]
    assert all(abs(pm - qm) <= 1e-5 for _, _, pm, qm in flat)  # mem_ctx is the same
    assert sum(abs(pc - qc) > 1e-3 for pc, qc, _, _ in flat) >= len(flat) - 1


# ------------------------------------------------------------------------------------------------
# a sharded model: the processes in lockstep
# ------------------------------------------------------------------------------------------------
def test_lockstep_runs_one_token_forwards_while_another_process_still_scores(qwen2, qwen2_requests):
    """One process whose peers need 3 forwards more: it runs 3 one-token forwards after its own,
    and its results are those of a plain call."""
    calls, forwards = [], []
    peers_left = [3]

    def lockstep(has_forward):
        calls.append(has_forward)
        if has_forward:
            return True
        peers_left[0] -= 1
        return peers_left[0] >= 0

    want = score(qwen2, qwen2_requests, "packed", threshold=None)  # (the model's one-time head probe runs here)
    hook = qwen2.model.layers[0].register_forward_hook(lambda module, args, out: forwards.append(args[0].shape[1]))
    try:
        stats = ScoringStats()
        got = score(qwen2, qwen2_requests, "packed", threshold=None, stats=stats, lockstep=lockstep)
    finally:
        hook.remove()
    assert_same(got, want)
    assert calls == [True] * stats.forwards + [False] * 4
    assert len(forwards) == stats.forwards + 3 and forwards[-3:] == [1, 1, 1]


def test_scoring_on_fsdp2_shards_matches_the_whole_model_on_2_ranks(tmp_path):
    """Every method, fused and logits paths, ranks with different numbers of forwards (one with no
    request at all): the sharded actor's P equals the whole model's, no decoder layer stays gathered
    between forwards, and both ranks make the same number of lockstep calls."""
    out = tmp_path / "two"
    out.mkdir()
    torchrun(SUPPORT / "dist_scoring_worker.py", out, what="the 2-rank sharded scoring run")
    ranks = [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]
    assert ranks[0].keys() == ranks[1].keys() and len(ranks[0]) == 2 * len(METHODS) * 2
    for case in ranks[0]:
        mine, theirs = ranks[0][case], ranks[1][case]
        assert mine["max_diff"] <= TOL and theirs["max_diff"] <= TOL, case
        assert mine["forwards"] > theirs["forwards"], case  # rank 1 drained: the lockstep was exercised
        assert mine["lockstep_calls"] == theirs["lockstep_calls"] == mine["forwards"] + 1, case
        assert mine["p_min"] > 1e-6, case  # P values that can tell wrong weights from right ones
