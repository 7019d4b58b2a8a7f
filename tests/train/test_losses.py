"""mempo.train.losses against straightforward loop references (float64)."""
import math

import pytest
import torch

from mempo.train.losses import LOSS_AGG_MODES, agg_loss, entropy_from_logits, kl_penalty, masked_mean, policy_loss


# ------------------------------------------------------------------------------------------------
# loop references
# ------------------------------------------------------------------------------------------------
def ref_agg(loss, mask, mode, num_tokens=None, num_sequences=None, norm_length=None):
    B, L = loss.shape
    rows = []
    for b in range(B):
        vals = [float(loss[b, t]) for t in range(L) if mask[b, t]]
        if vals:
            rows.append(vals)
    if mode == "token-mean":
        total = sum(sum(r) for r in rows)
        count = sum(len(r) for r in rows) if num_tokens is None else num_tokens
        return total / count if count else 0.0
    count = len(rows) if num_sequences is None else num_sequences
    if not count:
        return 0.0
    if mode == "seq-mean-token-sum":
        return sum(sum(r) for r in rows) / count
    if mode == "seq-mean-token-mean":
        return sum(sum(r) / len(r) for r in rows) / count
    length = L if norm_length is None else norm_length
    return sum(sum(r) for r in rows) / count / length


def ref_token_loss(lp, old, adv, low, high, c):
    ratio = math.exp(max(-20.0, min(20.0, lp - old)))
    loss = max(-adv * ratio, -adv * min(max(ratio, 1 - low), 1 + high))
    if c is not None and adv < 0:
        loss = min(loss, -adv * c)
    return loss


def random_case(seed, B=5, L=7, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    lp = -torch.rand(B, L, generator=g, dtype=dtype) * 3
    old = lp + torch.randn(B, L, generator=g, dtype=dtype) * 0.4
    adv = torch.randn(B, L, generator=g, dtype=dtype)
    mask = torch.rand(B, L, generator=g) > 0.35
    mask[0] = False  # one empty row
    return lp, old, adv, mask


# ------------------------------------------------------------------------------------------------
# agg_loss
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_agg_loss_matches_loop_reference(mode, seed):
    loss, _, _, mask = random_case(seed)
    got = agg_loss(loss, mask, mode)
    assert got.dtype == torch.float64 and got.dim() == 0
    assert got.item() == pytest.approx(ref_agg(loss, mask, mode), rel=1e-12, abs=1e-12)


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
def test_agg_loss_global_normalisers_make_parts_sum_to_whole(mode):
    loss, _, _, mask = random_case(3, B=8, L=6)
    whole = agg_loss(loss, mask, mode, norm_length=50)
    num_tokens, num_sequences = mask.sum(), mask.any(-1).sum()
    parts = sum(agg_loss(loss[rows], mask[rows], mode, num_tokens=num_tokens, num_sequences=num_sequences,
                         norm_length=50) for rows in (slice(0, 3), slice(3, 4), slice(4, 8)))
    assert parts.item() == pytest.approx(whole.item(), rel=1e-12)
    assert whole.item() == pytest.approx(ref_agg(loss, mask, mode, norm_length=50), rel=1e-12)


def test_agg_loss_sum_norm_divides_by_constant_length():
    loss = torch.ones(2, 4, dtype=torch.float64)
    mask = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 1]], dtype=torch.bool)
    # (2 + 4) / 2 sequences / length
    assert agg_loss(loss, mask, "seq-mean-token-sum-norm").item() == pytest.approx(3 / 4)
    assert agg_loss(loss, mask, "seq-mean-token-sum-norm", norm_length=100).item() == pytest.approx(3 / 100)


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
def test_all_masked_gives_zero_with_zero_gradient(mode):
    bad = torch.full((3, 4), float("nan"), dtype=torch.float64, requires_grad=True)  # masked: ignored even NaN
    out = agg_loss(bad, torch.zeros(3, 4, dtype=torch.bool), mode)
    assert out.item() == 0.0
    out.backward()
    assert torch.equal(bad.grad, torch.zeros_like(bad))


def test_masked_values_do_not_leak():
    loss, _, _, mask = random_case(4)
    poisoned = torch.where(mask, loss, torch.full_like(loss, float("inf")))
    for mode in LOSS_AGG_MODES:
        assert agg_loss(poisoned, mask, mode).item() == pytest.approx(agg_loss(loss, mask, mode).item())


def test_agg_loss_rejects_unknown_mode():
    with pytest.raises(ValueError, match="loss_agg_mode"):
        agg_loss(torch.zeros(1, 1), torch.ones(1, 1), "mean")


# ------------------------------------------------------------------------------------------------
# policy_loss
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
@pytest.mark.parametrize("clip_c", [None, 3.0])
def test_policy_loss_matches_loop_reference(mode, clip_c):
    lp, old, adv, mask = random_case(5, B=6, L=9)
    adv[1, :] = -4.0  # negative advantages with large ratios exercise dual-clip
    old[1, :] = lp[1, :] - 2.0
    loss, metrics = policy_loss(lp, old, adv, mask, 0.2, 0.28, clip_c, mode)
    token = torch.tensor([[ref_token_loss(lp[b, t].item(), old[b, t].item(), adv[b, t].item(), 0.2, 0.28, clip_c)
                           for t in range(lp.shape[1])] for b in range(lp.shape[0])], dtype=torch.float64)
    assert loss.item() == pytest.approx(ref_agg(token, mask, mode), rel=1e-10)
    ratios = [math.exp(lp[b, t] - old[b, t]) for b in range(6) for t in range(9) if mask[b, t]]
    assert metrics["ratio_max"].item() == pytest.approx(max(ratios))
    assert metrics["ratio_min"].item() == pytest.approx(min(ratios))
    assert metrics["ratio_mean"].item() == pytest.approx(sum(ratios) / len(ratios))
    kls = [old[b, t] - lp[b, t] for b in range(6) for t in range(9) if mask[b, t]]
    assert metrics["ppo_kl"].item() == pytest.approx(float(sum(kls) / len(kls)))
    if clip_c is None:
        assert metrics["pg_clipfrac_lower"].item() == 0.0
    else:
        assert metrics["pg_clipfrac_lower"].item() > 0.0


def test_clip_higher_is_asymmetric():
    """A > 0: the ratio may grow to 1 + high (0.28) before the gradient stops; A < 0: it may shrink
    to 1 - low (0.2)."""
    def grad_at(ratio, adv):
        lp = torch.tensor([[math.log(ratio)]], dtype=torch.float64, requires_grad=True)
        old = torch.zeros(1, 1, dtype=torch.float64)
        loss, metrics = policy_loss(lp, old, torch.full((1, 1), adv, dtype=torch.float64), torch.ones(1, 1),
                                    0.2, 0.28, None)
        loss.backward()
        return lp.grad.item(), metrics["pg_clipfrac"].item()

    assert grad_at(1.25, 1.0) == (pytest.approx(-1.25), 0.0)  # inside [0.8, 1.28]: still pushed up
    assert grad_at(1.30, 1.0) == (0.0, 1.0)                  # beyond 1 + high: clipped
    assert grad_at(0.85, -1.0) == (pytest.approx(0.85), 0.0)  # inside: still pushed down
    assert grad_at(0.75, -1.0) == (0.0, 1.0)                  # below 1 - low: clipped
    # symmetric clipping at 0.2 would already stop A > 0 at ratio 1.25:
    lp = torch.tensor([[math.log(1.25)]], dtype=torch.float64)
    loss_sym, _ = policy_loss(lp, torch.zeros(1, 1, dtype=torch.float64), torch.ones(1, 1, dtype=torch.float64),
                              torch.ones(1, 1), 0.2, 0.2, None)
    assert loss_sym.item() == pytest.approx(-1.2)


def test_dual_clip_bounds_negative_advantage_loss():
    lp = torch.tensor([[math.log(10.0)]], dtype=torch.float64, requires_grad=True)
    old = torch.zeros(1, 1, dtype=torch.float64)
    adv = torch.full((1, 1), -2.0, dtype=torch.float64)
    loss, metrics = policy_loss(lp, old, adv, torch.ones(1, 1), 0.2, 0.28, 3.0)
    assert loss.item() == pytest.approx(2.0 * 3.0)  # min(ratio * |A| = 20, c * |A| = 6)
    assert metrics["pg_clipfrac_lower"].item() == 1.0
    loss.backward()
    assert lp.grad.item() == 0.0
    loss_plain, _ = policy_loss(lp.detach(), old, adv, torch.ones(1, 1), 0.2, 0.28, None)
    assert loss_plain.item() == pytest.approx(20.0)
    with pytest.raises(ValueError, match="clip_ratio_c"):
        policy_loss(lp, old, adv, torch.ones(1, 1), 0.2, 0.28, 1.0)


def test_policy_loss_all_masked_is_zero_not_nan():
    lp = torch.full((2, 3), float("nan"), requires_grad=True)
    loss, metrics = policy_loss(lp, torch.zeros(2, 3), torch.ones(2, 3), torch.zeros(2, 3), 0.2, 0.28, 3.0)
    assert loss.item() == 0.0
    loss.backward()
    assert torch.equal(lp.grad, torch.zeros(2, 3))
    assert metrics["pg_clipfrac"].item() == 0.0 and metrics["ppo_kl"].item() == 0.0
    assert metrics["ratio_mean"].item() == metrics["ratio_max"].item() == metrics["ratio_min"].item() == 1.0


def test_policy_loss_gradient_is_plain_policy_gradient_on_policy():
    lp, _, adv, mask = random_case(6)
    lp = lp.clone().requires_grad_(True)
    loss, _ = policy_loss(lp, lp.detach(), adv, mask, 0.2, 0.28, 3.0, "token-mean")
    loss.backward()
    expected = torch.where(mask, -adv / mask.sum(), torch.zeros_like(adv))
    assert torch.allclose(lp.grad, expected)


# ------------------------------------------------------------------------------------------------
# kl_penalty
# ------------------------------------------------------------------------------------------------
def test_kl_estimators_match_formulas():
    lp = torch.tensor([[-1.0, -2.0, -0.5, -30.0]], dtype=torch.float64)
    ref = torch.tensor([[-1.5, -1.0, -0.5, -1.0]], dtype=torch.float64)
    for b in range(4):
        r = (lp[0, b] - ref[0, b]).item()
        assert kl_penalty(lp, ref, "k1")[0, b].item() == pytest.approx(r)
        assert kl_penalty(lp, ref, "k2")[0, b].item() == pytest.approx(0.5 * r * r)
        x = max(-20.0, min(20.0, -r))
        k3 = max(-10.0, min(10.0, math.exp(x) - x - 1))
        assert kl_penalty(lp, ref, "k3")[0, b].item() == pytest.approx(k3)
        assert kl_penalty(lp, ref, "low_var_kl")[0, b].item() == pytest.approx(k3)
    assert kl_penalty(lp, ref, "low_var_kl")[0, 3].item() == 10.0  # clamped
    assert kl_penalty(lp, ref, "k3")[0, 2].item() == 0.0
    with pytest.raises(ValueError, match="estimator"):
        kl_penalty(lp, ref, "k4")


def test_kl_gradient_flows_through_log_prob_only():
    lp = torch.tensor([[-1.0, -2.0]], requires_grad=True)
    ref = torch.tensor([[-1.5, -1.0]], requires_grad=True)
    kl_penalty(lp, ref, "low_var_kl").sum().backward()
    assert ref.grad is None
    # d/dlp [exp(ref - lp) - (ref - lp) - 1] = 1 - exp(ref - lp)
    assert torch.allclose(lp.grad, 1 - torch.exp(ref.detach() - lp.detach()))


# ------------------------------------------------------------------------------------------------
# entropy
# ------------------------------------------------------------------------------------------------
def test_entropy_from_logits_chunked_matches_reference():
    logits = torch.randn(3, 5, 11, dtype=torch.float64)
    logits[0, 0, :4] = -math.inf
    p = torch.softmax(logits, -1)
    expected = -(torch.where(p > 0, p * torch.log(p), torch.zeros_like(p))).sum(-1)
    for chunk in (1, 4, 100):
        got = entropy_from_logits(logits, chunk_size=chunk)
        assert got.shape == (3, 5) and torch.allclose(got, expected)
    half = entropy_from_logits(logits.to(torch.bfloat16), chunk_size=4)
    assert half.dtype == torch.float32 and torch.isfinite(half).all()


def test_masked_mean_empty():
    assert masked_mean(torch.ones(2, 2), torch.zeros(2, 2), empty_value=0.0).item() == 0.0


# ------------------------------------------------------------------------------------------------
# rollout correction: truncated importance weights
# ------------------------------------------------------------------------------------------------
def test_rollout_is_weights_token_and_sequence_levels():
    from mempo.train.losses import rollout_is_weights

    old = torch.tensor([[-1.0, -2.0, -0.5, -3.0], [-0.2, -0.4, -0.6, 0.0]], dtype=torch.float64)
    rollout = old - torch.tensor([[0.1, -0.3, 1.5, 0.0], [0.2, 0.1, -0.1, 0.0]], dtype=torch.float64)
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 1, 0]], dtype=torch.bool)  # loss tokens
    known = torch.tensor([[0, 1, 1, 1], [1, 1, 1, 0]], dtype=torch.bool)  # [0, 0] a forced id: not sampled
    weights, stats = rollout_is_weights(old, rollout, known, mask, "token", 2.0)
    ratio = torch.exp(old - rollout)
    want = torch.where(known, ratio.clamp(max=2.0), torch.ones_like(ratio)).float()
    torch.testing.assert_close(weights, want)
    assert weights[0, 0] == 1.0 and weights[0, 2] == 2.0  # the forced id: 1; exp(1.5) truncated at the cap
    n = int(known.sum())
    assert stats["count"] == n and stats["clipped"] == 1
    torch.testing.assert_close(stats["weight_sum"], want[known].sum())
    torch.testing.assert_close(stats["kl_sum"], (rollout - old)[known].sum().float())
    torch.testing.assert_close(stats["weight_max"], torch.tensor(2.0))
    weights, stats = rollout_is_weights(old, rollout, known, mask, "sequence", 10.0)
    for b in range(2):  # one weight per row: the product of its sampled tokens' ratios, on every loss token
        row = float(torch.exp((old - rollout)[b][known[b]].sum()))
        torch.testing.assert_close(weights[b][mask[b]], torch.full((int(mask[b].sum()),), row, dtype=torch.float32))
    none, stats_none = rollout_is_weights(old, rollout, known, mask, None, 2.0)
    assert none is None and stats_none["clipped"] == 1  # the metrics of the token level, nothing applied
    with pytest.raises(ValueError, match="must be one of"):
        rollout_is_weights(old, rollout, known, mask, "auto", 2.0)
    with pytest.raises(ValueError, match="cap must be > 0"):
        rollout_is_weights(old, rollout, known, mask, "token", 0.0)


def test_policy_loss_multiplies_each_tokens_loss_by_its_weight():
    g = torch.Generator().manual_seed(3)
    log_prob = torch.randn(3, 5, generator=g, dtype=torch.float64).requires_grad_()
    old = log_prob.detach() + 0.1 * torch.randn(3, 5, generator=g, dtype=torch.float64)
    adv = torch.randn(3, 5, generator=g, dtype=torch.float64)
    mask = torch.rand(3, 5, generator=g) > 0.2
    weights = 0.5 + torch.rand(3, 5, generator=g, dtype=torch.float64)
    weighted, _ = policy_loss(log_prob, old, adv, mask, is_weights=weights, loss_agg_mode="seq-mean-token-sum")
    plain = []  # each loss token's own clipped loss, times its weight (seq-mean-token-sum: summed, / rows)
    for b in range(3):
        for t in range(5):
            one = torch.zeros(3, 5, dtype=torch.bool)
            one[b, t] = bool(mask[b, t])
            loss, _ = policy_loss(log_prob, old, adv, one, loss_agg_mode="token-mean")
            plain.append(float(loss.detach()) * float(weights[b, t]) if one.any() else 0.0)
    rows = int(mask.any(dim=-1).sum())
    assert float(weighted) == pytest.approx(sum(plain) / rows, rel=1e-12)
    unit, _ = policy_loss(log_prob, old, adv, mask, is_weights=torch.ones_like(weights))
    base, _ = policy_loss(log_prob, old, adv, mask)
    assert float(unit) == float(base)
