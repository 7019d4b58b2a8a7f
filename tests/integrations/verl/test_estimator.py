"""The "mempo" estimator and the legacy compute_advantage against the real verl (pip install .[verl]);
skipped when verl is absent."""
import warnings

import numpy as np
import pytest
import torch

verl = pytest.importorskip("verl", reason="verl is not installed (pip install .[verl]); plugin tests skipped")
pytestmark = pytest.mark.verl

from verl import DataProto  # noqa: E402
from verl.trainer.ppo import core_algos  # noqa: E402

from mempo.integrations.verl import estimator as plugin  # noqa: E402
from mempo.ops.advantage import csr_offsets_from_rows, mempo_advantage  # noqa: E402


def make_batch(seed=0, groups=4, group_size=5, length=23):
    g = torch.Generator().manual_seed(seed)
    batch = groups * group_size + 1  # plus one singleton group
    uid = np.array([f"u{i // group_size}" for i in range(batch)], dtype=object)
    mask = (torch.rand(batch, length, generator=g) > 0.2).float()
    rewards = torch.zeros(batch, length)
    last = torch.randint(0, length, (batch,), generator=g)
    rewards[torch.arange(batch), last] = torch.randint(0, 2, (batch,), generator=g).float()
    rows, spans = [], []
    for b in range(batch):
        for r in range(int(torch.randint(0, 3, (1,), generator=g))):
            rows.append(b)
            spans.append((6 * r, 6 * r + 4))
    offsets = csr_offsets_from_rows(rows, batch)
    mem_rewards = torch.rand(len(rows), generator=g)
    return uid, mask, rewards, mem_rewards, offsets, torch.tensor(spans, dtype=torch.int64).reshape(-1, 2)


def test_registered_under_mempo():
    assert core_algos.get_adv_estimator_fn("mempo") is plugin.compute_mempo_advantage


def test_without_memory_equals_verl_grpo_and_warns_once():
    uid, mask, rewards, *_ = make_batch()
    want, _ = core_algos.compute_grpo_outcome_advantage(rewards.clone(), mask, uid)
    plugin._warned_missing_memory = False
    fn = core_algos.get_adv_estimator_fn("mempo")
    with pytest.warns(RuntimeWarning, match="no memory rewards"):
        got, returns = fn(token_level_rewards=rewards, response_mask=mask, index=uid, config=None)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fn(token_level_rewards=rewards, response_mask=mask, index=uid, config=None)  # no second warning
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(returns, want, rtol=1e-6, atol=1e-6)
    for norm in (True, False):
        want, _ = core_algos.compute_grpo_outcome_advantage(rewards.clone(), mask, uid, norm_adv_by_std_in_grpo=norm)
        got, _ = fn(token_level_rewards=rewards, response_mask=mask, index=uid, norm_adv_by_std_in_grpo=norm)
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)


def test_compute_advantage_passes_memory_fields_from_dataproto():
    uid, mask, rewards, mem_rewards, offsets, spans = make_batch(seed=3)
    tensors = {"token_level_rewards": rewards, "response_mask": mask,
               **plugin.pack_memory_fields(mem_rewards, offsets, spans)}
    data = DataProto.from_dict(tensors=tensors, non_tensors={"uid": uid})
    config = {"norm_adv_by_std_in_grpo": True, "mempo": {"memory_weight": 0.5}}
    data = plugin.compute_advantage(data, "mempo", config=config)
    want, _ = mempo_advantage(rewards.sum(-1), uid, mask, mem_rewards, offsets, spans, memory_weight=0.5)
    torch.testing.assert_close(data.batch["advantages"], want)
    assert (data.batch["advantages"] != core_algos.compute_grpo_outcome_advantage(rewards, mask, uid)[0]).any()
    # The padded fields survive verl's batch split and round-trip to the same CSR inputs.
    both = DataProto.concat(data.chunk(3))  # 21 rows -> 3 equal chunks
    r, o, s = plugin.unpack_memory_fields(both.batch["mempo_mem_rewards"], both.batch["mempo_mem_spans"],
                                          both.batch["mempo_mem_valid"])
    assert torch.equal(r, mem_rewards) and torch.equal(o, offsets) and torch.equal(s, spans)


def test_pack_rejects_too_few_slots():
    with pytest.raises(ValueError, match="num_slots=1"):
        plugin.pack_memory_fields(torch.zeros(2), torch.tensor([0, 2]), torch.zeros(2, 2, dtype=torch.long), 1)


def test_memory_std_floor_and_stage_pooling_reach_the_op():
    uid, mask, rewards, mem_rewards, offsets, spans = make_batch(seed=5)
    stages = torch.arange(mem_rewards.numel()) % 2
    tensors = {"token_level_rewards": rewards, "response_mask": mask,
               **plugin.pack_memory_fields(mem_rewards, offsets, spans, mem_stages=stages)}
    data = DataProto.from_dict(tensors=tensors, non_tensors={"uid": uid})
    for pooling, floor in [("group", 0.3), ("group_round", 0.0), ("group_seen", 0.05)]:
        config = {"mempo": {"memory_weight": 0.5, "memory_std_floor": floor, "memory_pooling": pooling}}
        got = plugin.compute_advantage(data, "mempo", config=config).batch["advantages"]
        want, _ = mempo_advantage(rewards.sum(-1), uid, mask, mem_rewards, offsets, spans, memory_weight=0.5,
                                  memory_std_floor=floor, mem_stages=None if pooling == "group" else stages)
        torch.testing.assert_close(got, want)


def test_stage_pooling_without_stages_and_bad_options_are_refused_by_name():
    uid, mask, rewards, mem_rewards, offsets, spans = make_batch(seed=6)
    memory = plugin.pack_memory_fields(mem_rewards, offsets, spans)
    fn = core_algos.get_adv_estimator_fn("mempo")
    with pytest.raises(ValueError, match="memory_pooling='group_seen' needs the stage of each scored round"):
        fn(token_level_rewards=rewards, response_mask=mask, index=uid,
           config={"mempo": {"memory_pooling": "group_seen"}}, **{k[len("mempo_"):]: v for k, v in memory.items()})
    with pytest.raises(ValueError, match="memory_pooling must be one of"):
        fn(token_level_rewards=rewards, response_mask=mask, index=uid, config={"mempo": {"memory_pooling": "round"}})
    with pytest.raises(ValueError, match="memory_std_floor must be a finite number"):
        fn(token_level_rewards=rewards, response_mask=mask, index=uid, config={"mempo": {"memory_std_floor": -1.0}})
    with pytest.raises(ValueError, match="mem_stages has 1 entries"):
        plugin.pack_memory_fields(mem_rewards, offsets, spans, mem_stages=torch.zeros(1, dtype=torch.long))


def test_compute_advantage_reads_the_agent_loops_per_row_lists():
    """The legacy trainer's batch from a mempo agent loop: object arrays of lists per row."""
    uid, mask, rewards, mem_rewards, offsets, spans = make_batch(seed=4)
    rows_rewards = np.empty(len(uid), dtype=object)
    rows_spans = np.empty(len(uid), dtype=object)
    for b in range(len(uid)):
        lo, hi = int(offsets[b]), int(offsets[b + 1])
        rows_rewards[b] = [float(v) for v in mem_rewards[lo:hi]]
        rows_spans[b] = [[int(s), int(e)] for s, e in spans[lo:hi]]
    data = DataProto.from_dict(tensors={"token_level_rewards": rewards, "response_mask": mask},
                               non_tensors={"uid": uid, "mempo_mem_rewards": rows_rewards,
                                            "mempo_mem_spans": rows_spans})
    got = plugin.compute_advantage(data, "mempo", config={"mempo": {"memory_weight": 0.7}}).batch["advantages"]
    want, _ = mempo_advantage(rewards.sum(-1), uid, mask, mem_rewards, offsets, spans, memory_weight=0.7)
    torch.testing.assert_close(got, want)
    rows_spans[1] = [[0, 1], [2, 3], [4, 5]]  # more spans than rewards in one row: refused by row
    with pytest.raises(ValueError, match="row 1: mempo_mem_rewards has"):
        plugin.compute_advantage(data, "mempo", config=None)
