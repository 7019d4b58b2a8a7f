"""mempo.train.actor: chunked log-probs, the micro-batched PPO update, and a 2-process FSDP2 run (gloo)."""
import copy
import json

import pytest
import torch

pytest.importorskip("transformers")

from support.dist import torchrun  # noqa: E402
from support.dist_worker import make_batch, make_model, run  # noqa: E402
from support.paths import SUPPORT  # noqa: E402

from mempo.train import actor as actor_module  # noqa: E402
from mempo.train.actor import Actor, init_distributed, plan_micro_batches  # noqa: E402
from mempo.train.checkpoint import load_checkpoint  # noqa: E402
from mempo.config import ActorConfig  # noqa: E402
from mempo.train.losses import entropy_from_logits  # noqa: E402

WORKER = SUPPORT / "dist_worker.py"


def direct_log_probs(model, batch, temperature=1.0):
    """log_softmax(model(...).logits / T) gathered at the next token, token-aligned, 0 off the mask."""
    mask = batch["attention_mask"]
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        logits = model(input_ids=batch["input_ids"], attention_mask=mask, position_ids=positions).logits.float()
    logits = logits / temperature
    picked = torch.log_softmax(logits[:, :-1], -1).gather(-1, batch["input_ids"][:, 1:, None])[..., 0]
    entropy = entropy_from_logits(logits[:, :-1])
    response = batch["response_mask"]
    pad = torch.zeros(picked.shape[0], 1)
    return torch.cat([pad, picked], 1) * response, torch.cat([pad, entropy], 1) * response


@pytest.mark.parametrize("cuda, want", [(True, "cpu:gloo,cuda:nccl"), (False, "gloo")])
def test_the_process_group_takes_cpu_tensors_on_a_gpu_too(monkeypatch, cuda, want):
    """On CUDA the group is nccl for CUDA tensors and gloo for CPU ones: nccl alone refused the step
    metrics' CPU all-reduce on the first GPU run ("No backend type associated with device type cpu").
    The collectives themselves run there (tools/gpu_check.py, section train); here, the choice."""
    opened = []
    monkeypatch.setattr(actor_module.dist, "is_initialized", lambda: False)
    monkeypatch.setattr(actor_module.dist, "init_process_group", lambda backend: opened.append(backend))
    monkeypatch.setattr(actor_module.dist, "get_rank", lambda: 0)
    monkeypatch.setattr(actor_module.dist, "get_world_size", lambda: 1)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
    monkeypatch.setattr(torch.cuda, "set_device", lambda index: None)
    monkeypatch.setattr(actor_module, "_default_device", lambda local_rank: torch.device("cpu"))
    for name, value in {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0"}.items():
        monkeypatch.setenv(name, value)
    init_distributed()
    assert opened == [want]


@pytest.mark.parametrize("micro_batch_tokens", [None, 1, 30])
def test_log_probs_equal_direct_forward(micro_batch_tokens):
    batch, _ = make_batch()
    actor = Actor(make_model(0), ActorConfig(logprob_chunk_tokens=5))
    got = actor.compute_log_probs(batch["input_ids"], batch["attention_mask"], response_mask=batch["response_mask"],
                                  temperature=0.7, with_entropy=True, micro_batch_tokens=micro_batch_tokens)
    expected, entropy = direct_log_probs(actor.module, batch, temperature=0.7)
    assert got.log_probs.dtype == torch.float32 and got.log_probs.shape == batch["input_ids"].shape
    torch.testing.assert_close(got.log_probs, expected, atol=2e-5, rtol=1e-5)
    torch.testing.assert_close(got.entropy, entropy, atol=2e-5, rtol=1e-5)
    assert (got.log_probs[~batch["response_mask"]] == 0).all()


def test_log_probs_default_mask_scores_every_real_token():
    batch, _ = make_batch()
    actor = Actor(make_model(0))
    got = actor.compute_log_probs(batch["input_ids"], batch["attention_mask"]).log_probs
    scored = batch["attention_mask"].bool().clone()
    first = scored.long().argmax(-1)
    scored[torch.arange(scored.shape[0]), first] = False
    expected, _ = direct_log_probs(actor.module, dict(batch, response_mask=scored))
    torch.testing.assert_close(got, expected, atol=2e-5, rtol=1e-5)


def test_plan_micro_batches():
    assert plan_micro_batches([0, 0, 0], [9, 4, 9], None) == [[0, 1, 2]]
    assert plan_micro_batches([0, 0, 0], [9, 4, 9], 20) == [[0, 1], [2]]
    assert plan_micro_batches([0, 0], [9, 9], 5) == [[0], [1]]  # a row over budget runs alone
    assert plan_micro_batches([], [], 8) == []


def test_update_raises_the_log_prob_of_advantaged_tokens():
    batch, _ = make_batch()
    advantages = torch.where(torch.arange(batch["input_ids"].shape[1]) % 2 == 0, 1.0, -1.0).expand(6, -1).clone()
    actor = Actor(make_model(0), ActorConfig(lr=3e-3, kl_coef=0.0, micro_batch_tokens=30))
    before = [p.detach().clone() for p in actor.module.parameters()]
    old = actor.compute_log_probs(batch["input_ids"], batch["attention_mask"], response_mask=batch["response_mask"])
    losses = [actor.update(batch, advantages, old.log_probs)["pg_loss"] for _ in range(4)]
    assert losses[-1] < losses[0]
    after = actor.compute_log_probs(batch["input_ids"], batch["attention_mask"], response_mask=batch["response_mask"])
    delta = (after.log_probs - old.log_probs)[batch["response_mask"]]
    sign = advantages[batch["response_mask"]]
    assert delta[sign > 0].mean() > 0 > delta[sign < 0].mean()
    assert any(not torch.equal(a, b) for a, b in zip(before, actor.module.parameters()))


def test_micro_batching_gives_the_same_update_as_one_batch():
    batch, advantages = make_batch()
    results = []
    for budget in (None, 20):
        actor = Actor(make_model(0), ActorConfig(lr=1e-3, eps=1e-3, micro_batch_tokens=budget, kl_coef=0.0))
        old = actor.compute_log_probs(batch["input_ids"], batch["attention_mask"],
                                      response_mask=batch["response_mask"]).log_probs - 0.05
        metrics = actor.update(batch, advantages, old)
        results.append((metrics, [p.detach().clone() for p in actor.module.parameters()]))
    (m_one, p_one), (m_micro, p_micro) = results
    for key in ("loss", "pg_clipfrac", "ppo_kl", "ratio_mean", "grad_norm", "entropy", "num_tokens"):
        assert m_micro[key] == pytest.approx(m_one[key], rel=1e-5, abs=1e-7), key
    for a, b in zip(p_one, p_micro):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)


def test_gradient_checkpointing_and_frozen_reference():
    batch, advantages = make_batch()
    metrics = []
    for checkpointing in (False, True):
        actor = Actor(make_model(0), ActorConfig(lr=1e-3, kl_coef=0.0, gradient_checkpointing=checkpointing))
        metrics.append(actor.update(batch, advantages))
    assert metrics[1]["loss"] == pytest.approx(metrics[0]["loss"], rel=1e-6)
    assert metrics[1]["grad_norm"] == pytest.approx(metrics[0]["grad_norm"], rel=1e-5)
    reference = Actor(make_model(0), trainable=False)
    assert reference.optimizer is None and not any(p.requires_grad for p in reference.module.parameters())
    ref = reference.compute_log_probs(batch["input_ids"], batch["attention_mask"], response_mask=batch["response_mask"])
    expected, _ = direct_log_probs(reference.module, batch)
    torch.testing.assert_close(ref.log_probs, expected, atol=2e-5, rtol=1e-5)


def test_update_metrics_and_kl_term():
    batch, advantages = make_batch()
    actor = Actor(make_model(0), ActorConfig(lr=1e-3, kl_coef=0.1, ppo_mini_batches=2, ppo_epochs=2))
    ref = actor.compute_log_probs(batch["input_ids"], batch["attention_mask"],
                                  response_mask=batch["response_mask"]).log_probs
    metrics = actor.update(batch, advantages, ref, ref - 0.5)
    assert metrics["optimizer_steps"] == 4.0 and metrics["skipped_steps"] == 0.0
    assert metrics["kl_loss"] > 0 and metrics["grad_norm"] > 0 and metrics["lr"] == 1e-3
    assert metrics["loss"] == pytest.approx(metrics["pg_loss"] + 0.1 * metrics["kl_loss"], rel=1e-6)
    with pytest.raises(ValueError, match="ref_log_probs"):
        actor.update(batch, advantages, ref)


def test_non_finite_gradient_skips_the_step():
    batch, advantages = make_batch()
    actor = Actor(make_model(0), ActorConfig(kl_coef=0.0))
    before = [p.detach().clone() for p in actor.module.parameters()]
    advantages = advantages.clone()
    advantages[0, 8] = float("inf")
    metrics = actor.update(batch, advantages)
    assert metrics["skipped_steps"] == 1.0 and metrics["optimizer_steps"] == 0.0
    assert all(torch.equal(a, b) for a, b in zip(before, actor.module.parameters()))


def test_bad_masks_are_rejected():
    batch, advantages = make_batch()
    actor = Actor(make_model(0), ActorConfig(kl_coef=0.0))
    bad = dict(batch, response_mask=batch["response_mask"].clone())
    bad["response_mask"][1, 12] = True  # padding
    with pytest.raises(ValueError, match="padding"):
        actor.update(bad, advantages)
    bad["response_mask"] = torch.zeros_like(batch["response_mask"])
    bad["response_mask"][0, 0] = True  # first token: nothing to score it from
    with pytest.raises(ValueError, match="first real token"):
        actor.compute_log_probs(batch["input_ids"], batch["attention_mask"], response_mask=bad["response_mask"])
    frozen = Actor(make_model(0), trainable=False)
    with pytest.raises(RuntimeError, match="trainable=False"):
        frozen.update(batch, advantages)


def test_state_dict_round_trip():
    batch, advantages = make_batch()
    actor = Actor(make_model(0), ActorConfig(kl_coef=0.0, lr=1e-3))
    actor.update(batch, advantages)
    other = Actor(make_model(5), ActorConfig(kl_coef=0.0, lr=1e-3))
    other.load_state_dict(copy.deepcopy(actor.state_dict()))
    m1, m2 = actor.update(batch, advantages), other.update(batch, advantages)
    assert m1["loss"] == m2["loss"]
    for a, b in zip(actor.module.parameters(), other.module.parameters()):
        assert torch.equal(a, b)


def test_two_process_fsdp2_matches_single_process(tmp_path):
    """2 ranks (FSDP2, gloo), each on half of the rows, give the losses and parameters of one process
    on all rows; the sharded checkpoint loads into a plain model and resumes exactly."""
    torchrun(WORKER, tmp_path / "two", what="the 2-process FSDP2 run")
    two = json.loads((tmp_path / "two" / "result.json").read_text())
    one = run(tmp_path / "one")
    assert two["world"] == 2 and one["world"] == 1 and two["loaded_step"] == 2
    for m_one, m_two in zip(one["metrics"] + [one["third"]], two["metrics"] + [two["third"]]):
        for key in ("loss", "pg_loss", "kl_loss", "entropy", "ppo_kl", "ratio_mean", "grad_norm", "num_tokens"):
            assert m_two[key] == pytest.approx(m_one[key], rel=1e-4, abs=1e-6), key
    for key in ("loss", "kl_loss", "grad_norm"):  # resuming from the sharded checkpoint is exact
        assert two["third_restored"][key] == two["third"][key]
    plain_one, plain_two = make_model(7), make_model(8)
    load_checkpoint(tmp_path / "one" / "ckpt", plain_one, restore_rng=False)
    load_checkpoint(tmp_path / "two" / "ckpt", plain_two, restore_rng=False)
    for (name, a), b in zip(plain_one.named_parameters(), plain_two.parameters()):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4, msg=name)
    assert sorted(p.name for p in (tmp_path / "two" / "ckpt" / "step_00000002" / "rng").iterdir()) == \
        ["rank_00000.pt", "rank_00001.pt"]


def test_rollout_correction_weights_each_tokens_loss_and_reports_its_metrics():
    """With the sampling policy's log-probs, each sampled token's policy loss is scaled by
    min(pi_old / pi_rollout, cap) (forced ids: 1): on policy (ratio 1, no clipping) that is the update
    with advantages times the weights; level None changes nothing and reports the same metrics."""
    from mempo.train.actor import RolloutCorrection

    batch, advantages = make_batch()
    cfg = ActorConfig(lr=1e-3, kl_coef=0.0, micro_batch_tokens=30)
    probe = Actor(make_model(0), cfg)
    old = probe.compute_log_probs(batch["input_ids"], batch["attention_mask"],
                                  response_mask=batch["response_mask"]).log_probs
    g = torch.Generator().manual_seed(1)
    delta = (torch.rand(old.shape, generator=g) * 2 - 1) * batch["response_mask"]
    rollout = old - delta  # pi_old / pi_rollout = exp(delta)
    known = batch["response_mask"].clone()
    known[:, 9] = False  # a forced id in every row: no rollout log-prob
    weights = torch.where(known, torch.exp(delta).clamp(max=1.5), torch.ones_like(delta))
    actors = [Actor(make_model(0), cfg) for _ in range(4)]
    corrected = actors[0].update(batch, advantages, rollout=RolloutCorrection(rollout, known, "token", 1.5))
    actors[1].update(batch, advantages * weights)
    for a, b in zip(actors[0].module.parameters(), actors[1].module.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    sampled = known & batch["response_mask"]
    assert corrected["rollout_is_applied"] == 1.0 and corrected["rollout_is_tokens"] == float(sampled.sum())
    assert corrected["rollout_is_mean"] == pytest.approx(float(weights[sampled].mean()), rel=1e-5)
    assert corrected["rollout_is_max"] == pytest.approx(1.5)
    clipped = (torch.exp(delta) > 1.5)[sampled].float().mean()
    assert corrected["rollout_is_clipped_frac"] == pytest.approx(float(clipped))
    assert corrected["rollout_kl"] == pytest.approx(float(-delta[sampled].mean()), rel=1e-4, abs=1e-6)
    metrics_only = actors[2].update(batch, advantages, rollout=RolloutCorrection(rollout, known, None, 1.5))
    plain = actors[3].update(batch, advantages)
    for a, b in zip(actors[2].module.parameters(), actors[3].module.parameters()):
        assert torch.equal(a, b)
    assert metrics_only["rollout_is_applied"] == 0.0 and "rollout_is_mean" not in plain
    assert metrics_only["rollout_is_mean"] == pytest.approx(corrected["rollout_is_mean"], rel=1e-5)
