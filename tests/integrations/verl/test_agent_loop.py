"""The mempo agent loop inside the real verl 0.9.1, on CPU.

verl's own `AgentLoopWorker.generate_sequences` (a worker built without Ray, as verl's CPU tests
build one) instantiates the loop from an agent-loop YAML with hydra, runs it against an HF-backed
stand-in for the inference server (tiny random Qwen2; a scripted policy for well-formed rounds) and
post-processes the outputs into a `DataProto`. Checked: masks, spans, lengths, every key on every
row, memory rewards equal to `mempo.scoring` on the same trajectories, advantages equal to `mempo
train`'s advantage stage through the legacy path and through the V1 trainer, and no generation
request holding a gold.
"""
import dataclasses
import json

import pytest
import torch

pytest.importorskip("verl", reason="verl is not installed (pip install .[verl])")
pytestmark = pytest.mark.verl

from support.corpus import make_corpus  # noqa: E402
from support.gold_trace import violations  # noqa: E402
from support.rollout_fixtures import chat_tokenizer, tiny_qwen2  # noqa: E402
from support.verl_standin import (FakeTQ, HFServer, dummy_worker, needle_script, question_batch,  # noqa: E402
                                  rounds_script, run_worker, verl_config, write_agents_yaml)

from mempo.algo.advantages import advantage_inputs, token_advantages  # noqa: E402
from mempo.algo.outcome import score_outcomes  # noqa: E402
from mempo.config import ConfigError, ScoringConfig  # noqa: E402
from mempo.integrations.verl import estimator  # noqa: E402
from mempo.integrations.verl.agent_loop import trained_forced_spans  # noqa: E402
from mempo.integrations.verl.fields import EXTRA_KEYS  # noqa: E402
from mempo.ops.spans import find_spans  # noqa: E402
from mempo.rollout.backends import TokenBytes  # noqa: E402
from mempo.scoring import compute_memory_rewards  # noqa: E402

QUESTION, GOLDS, N = "Which document mentions zebulon3? Give its title.", ["Needle 3"], 4
PROMPT_LENGTH, RESPONSE_LENGTH = 128, 512


@pytest.fixture(scope="module")
def parts(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("verl_loop")
    corpus = tmp / "corpus.jsonl"
    corpus.write_text("".join(json.dumps(d.to_json()) + "\n" for d in make_corpus(60)))
    tok = chat_tokenizer()
    torch.manual_seed(0)
    model = tiny_qwen2(len(tok))
    return tmp, corpus, tok, model


@pytest.fixture(scope="module")
def scripted(parts):
    tmp, corpus, tok, model = parts
    config = verl_config(write_agents_yaml(tmp / "agents.yaml", corpus), prompt_length=PROMPT_LENGTH,
                         response_length=RESPONSE_LENGTH, n=N)
    server = HFServer(model, script=needle_script(tok))
    worker = dummy_worker(config, tok, server)
    data, seen = run_worker(worker, question_batch(QUESTION, GOLDS, N))
    loops = [seen[i][0] for i in range(N)]
    return config, server, data, seen, loops, worker


def _scored(loop):
    """The loop's trajectory with mempo's own outcome (what the reward path must have given)."""
    return score_outcomes([loop.trajectory])[0]


def test_outputs_reach_a_dataproto_with_every_key_on_every_row(scripted):
    config, _, data, seen, loops, worker = scripted
    assert len(data) == N and data.batch["responses"].shape == (N, RESPONSE_LENGTH)
    for key in EXTRA_KEYS:
        assert key in data.non_tensor_batch and len(data.non_tensor_batch[key]) == N
    for i, loop in enumerate(loops):
        t = loop.trajectory
        assert set(EXTRA_KEYS) <= set(seen[i][1].extra_fields)
        assert len(t.prompt_ids) <= PROMPT_LENGTH and len(t.response_ids) <= RESPONSE_LENGTH
        length = len(t.response_ids)
        assert data.batch["responses"][i, :length].tolist() == t.response_ids
        assert data.batch["response_mask"][i, :length].tolist() == t.response_mask
        assert int(data.batch["response_mask"][i, length:].sum()) == 0
        # the outcome came through verl's reward loop (mempo's EM as verl's default for mempo rows)
        assert float(data.batch["rm_scores"][i].sum()) == _scored(loop).score == data.non_tensor_batch["acc"][i]
        assert data.non_tensor_batch["mempo_protocol_text"][i] == t.protocol_text
        assert data.non_tensor_batch["mempo_em"][i] == _scored(loop).outcome["em"]
        assert data.non_tensor_batch["mempo_rounds"][i] == len(t.rounds) >= 2
    assert worker.reward_loop_worker_handles[0].calls == N  # verl's reward loop scored every trajectory
    # the script's four variants: two right answers, two wrong
    assert sorted(_scored(loop).score for loop in loops) == [0.0, 0.0, 1.0, 1.0]


def test_information_is_masked_out_and_spans_are_the_scanners(scripted, parts):
    _, _, data, _, loops, _ = scripted
    tok = parts[2]
    for i, loop in enumerate(loops):
        t = loop.trajectory
        tool = [0] * len(t.response_ids)
        for r in t.rounds:
            tool[r.end:r.tool_end] = [1] * (r.tool_end - r.end)
            if r.tool_end > r.end:  # the tool text sits inside its segment
                assert r.end <= r.information[0] < r.information[1] <= r.tool_end
                assert "<information>" in tok.decode(t.response_ids[r.information[0]:r.information[1]])
        assert [1 - m for m in t.response_mask] == tool  # mask 0 exactly on tool segments
        spans = [s for s in find_spans([t.response_ids], TokenBytes.of(tok).table).spans_of(0) if s.tag == "mem"]
        scanner = {(s.start, s.end) for s in spans}
        recorded = [tuple(s) for s in data.non_tensor_batch["mempo_mem_spans"][i]]
        assert recorded and set(recorded) <= scanner
        assert recorded == [r.mem_span for r in t.scored_rounds()]


def test_memory_rewards_equal_mempo_scoring_on_the_same_trajectories(scripted, parts):
    _, _, data, _, loops, _ = scripted
    tok, model = parts[2], parts[3]
    trajectories = [loop.trajectory for loop in loops]
    want, details = compute_memory_rewards(model, tok, trajectories, ScoringConfig(method="reference", threshold=None))
    got = [loop.memory_rewards for loop in loops]
    assert [len(g) for g in got] == [len(w) for w in want] and sum(len(w) for w in want) >= N
    flat = lambda rows: torch.tensor([v for row in rows for v in row], dtype=torch.float64)  # noqa: E731
    torch.testing.assert_close(flat(got), flat(want), rtol=1e-4, atol=1e-9)
    assert flat(want).abs().max() > 0  # not a comparison of zeros
    for i, rows in enumerate(details):
        torch.testing.assert_close(torch.tensor(data.non_tensor_batch["mempo_p_mem"][i]),
                                   torch.tensor([d.p_mem for d in rows]), rtol=1e-4, atol=0)
        torch.testing.assert_close(torch.tensor(data.non_tensor_batch["mempo_p_full"][i]),
                                   torch.tensor([d.p_cmp for d in rows]), rtol=1e-4, atol=0)


def _stage_advantages(loops, memory_weight, scores=None):
    """`mempo train`'s advantage stage (`token_advantages` over `advantage_inputs`) on the same batch,
    without skip_zero_variance_groups (verl has no such mask), padded to verl's response length;
    `scores`: outcome scores in place of mempo's EM (a user's reward function)."""
    trajectories = [_scored(loop) for loop in loops]
    if scores is not None:
        trajectories = [dataclasses.replace(t, outcome={"score": s}) for t, s in zip(trajectories, scores)]
    inputs = advantage_inputs(trajectories, memory_rewards=[loop.memory_rewards for loop in loops],
                              pad_to=RESPONSE_LENGTH)
    return token_advantages(inputs, memory_weight=memory_weight, skip_zero_variance_groups=False).advantages


def test_legacy_path_advantages_equal_the_training_stage(scripted):
    _, _, data, _, loops, _ = scripted
    batch = data.select(deepcopy=True)
    batch.non_tensor_batch["uid"] = question_batch(QUESTION, GOLDS, N).non_tensor_batch["uid"]  # fit's union
    batch.batch["token_level_rewards"] = batch.batch["rm_scores"]
    got = estimator.compute_advantage(batch, "mempo", config={"mempo": {"memory_weight": 0.5}}).batch["advantages"]
    want = _stage_advantages(loops, 0.5)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert (got != _stage_advantages(loops, 0.0)).any()  # the memory part is there


def _v1_rows(worker, seen, monkeypatch, uid="q0"):
    """The outputs through verl's V1 `AgentLoopWorkerTQ._agent_loop_postprocess` into a TransferQueue
    stand-in (one row per output, keys {uid}_{session}_{i}); old_log_probs as the actor would add them."""
    import asyncio
    import inspect

    from verl.trainer.ppo.v1 import agent_loop_tq
    from verl.trainer.ppo.v1.agent_loop_tq import AgentLoopWorkerTQ

    fake = FakeTQ()
    monkeypatch.setattr(agent_loop_tq, "tq", fake)
    postprocess = inspect.unwrap(AgentLoopWorkerTQ._agent_loop_postprocess)  # the class is a @ray.remote actor
    for session, (_, output) in sorted(seen.items()):
        sample = {"uid": uid, "session_id": session, "global_steps": 1, "raw_prompt": [], "extra_info": {},
                  "data_source": "needle", "reward_model": {"ground_truth": GOLDS}}  # the dataset's fields
        asyncio.run(postprocess(worker, output, False, **sample))
    for row in fake.rows.values():
        if "rollout_log_probs" in row:
            row["old_log_probs"] = row["rollout_log_probs"].clone()
    return fake


def _v1_trainer(config, fake, monkeypatch, memory_weight):
    """`MemPOTrainerSync` without its cluster (``__new__``), over the TransferQueue stand-in."""
    from omegaconf import open_dict
    from verl.trainer.ppo.v1 import trainer_base

    from mempo.integrations.verl import trainer_v1

    monkeypatch.setattr(trainer_base, "tq", fake)
    monkeypatch.setattr(trainer_v1, "tq", fake)
    trainer = trainer_v1.MemPOTrainerSync.__new__(trainer_v1.MemPOTrainerSync)
    trainer.config = config.copy()
    with open_dict(trainer.config):
        trainer.config.algorithm.adv_estimator = "grpo"
        trainer.config.algorithm.mempo = {"memory_weight": memory_weight}
    return trainer


def _v1_advantages(config, fake, monkeypatch, memory_weight):
    from transfer_queue import KVBatchMeta

    trainer = _v1_trainer(config, fake, monkeypatch, memory_weight)
    keys = sorted(fake.rows)
    metrics = {}
    trainer._compute_advantage(KVBatchMeta(keys=keys, tags=[{} for _ in keys], partition_id="train"), metrics)
    return keys, metrics


def test_v1_trainer_advantages_equal_the_training_stage(scripted, parts, monkeypatch):
    config, server, _, seen, loops, _ = scripted
    fake = _v1_rows(dummy_worker(config, parts[2], server), seen, monkeypatch)
    keys, metrics = _v1_advantages(config, fake, monkeypatch, 0.5)
    assert keys == [f"q0_{i}_0" for i in range(N)]
    got = torch.zeros(N, RESPONSE_LENGTH)
    for i, key in enumerate(keys):
        assert fake.rows[key]["extra_fields"]["mempo_mem_spans"] == seen[i][1].extra_fields["mempo_mem_spans"]
        value = fake.rows[key]["advantages"]
        got[i, :value.numel()] = value
    torch.testing.assert_close(got, _stage_advantages(loops, 0.5), rtol=1e-5, atol=1e-5)
    assert metrics["mempo/memory_tokens"] > 0 and metrics["mempo/scored_rounds"] >= N


USER_REWARD = """
def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs):
    assert ground_truth == "Needle 3", ground_truth  # the gold string, as the dataset gives it
    assert extra_info["mempo_mem_rewards"] is not None  # the loop's fields reach a user's function too
    return {"score": (len(solution_str) % 5) / 4.0, "user_reward": 1.0}
"""


def test_a_users_reward_function_replaces_the_outcome_and_the_memory_reward_stays(parts, monkeypatch):
    """reward.custom_reward_function gives the outcome through verl's reward loop; teacher scoring needs
    only the gold string of reward_model.ground_truth; mempo_sync adds the memory part to GRPO of the
    user's scores."""
    from omegaconf import open_dict

    tmp, corpus, tok, model = parts
    (tmp / "user_reward.py").write_text(USER_REWARD)
    config = verl_config(write_agents_yaml(tmp / "agents_user.yaml", corpus), prompt_length=PROMPT_LENGTH,
                         response_length=RESPONSE_LENGTH, n=N)
    with open_dict(config):
        config.reward.custom_reward_function.path = str(tmp / "user_reward.py")
        config.reward.custom_reward_function.name = "compute_score"
    server = HFServer(model, script=needle_script(tok))
    worker = dummy_worker(config, tok, server)
    data, seen = run_worker(worker, question_batch(QUESTION, "Needle 3", N))
    loops = [seen[i][0] for i in range(N)]
    user = [(len(tok.decode(loop.trajectory.response_ids, skip_special_tokens=True)) % 5) / 4.0 for loop in loops]
    assert [float(data.batch["rm_scores"][i].sum()) for i in range(N)] == user
    assert list(data.non_tensor_batch["user_reward"]) == [1.0] * N and "mempo_em" not in data.non_tensor_batch
    assert len(set(user)) > 1 and user != [_scored(loop).score for loop in loops]  # not mempo's EM
    assert sum(len(loop.memory_rewards) for loop in loops) >= N  # teacher scoring ran on the gold string
    fake = _v1_rows(worker, seen, monkeypatch)
    keys, _ = _v1_advantages(config, fake, monkeypatch, 0.5)
    got = torch.zeros(N, RESPONSE_LENGTH)
    for i, key in enumerate(keys):
        got[i, :fake.rows[key]["advantages"].numel()] = fake.rows[key]["advantages"]
    torch.testing.assert_close(got, _stage_advantages(loops, 0.5, scores=user), rtol=1e-5, atol=1e-5)
    assert (got != _stage_advantages(loops, 0.0, scores=user)).any()  # the memory part is there


def test_under_a_colocated_reward_model_the_loop_leaves_the_outcome_to_it(parts):
    """No reward-loop workers (verl's colocated reward model scores in the trainer): the loop sets no
    score, so no rm_scores reach the batch from it, and the memory fields are there."""
    tmp, corpus, tok, model = parts
    config = verl_config(write_agents_yaml(tmp / "agents_rm.yaml", corpus), prompt_length=PROMPT_LENGTH,
                         response_length=RESPONSE_LENGTH, n=2)
    worker = dummy_worker(config, tok, HFServer(model, script=needle_script(tok)), reward=False)
    data, seen = run_worker(worker, question_batch(QUESTION, GOLDS, 2))
    assert [output.reward_score for _, output in seen.values()] == [None, None]
    assert "rm_scores" not in data.batch.keys()
    assert all(len(rows) >= 1 for rows in data.non_tensor_batch["mempo_mem_rewards"])


def test_no_generation_request_holds_a_gold(scripted, parts):
    _, server, _, _, _, _ = scripted
    tok = parts[2]
    generation = [r for r in server.requests if "prompt_logprobs" not in r["sampling_params"]]
    answer = "<answer>\nNeedle 3\n</answer>"  # the scoring template around the gold: only scoring requests
    logprob_requests = [r for r in server.requests if "prompt_logprobs" in r["sampling_params"]]
    scoring = [r for r in logprob_requests if answer in tok.decode(r["prompt_ids"])]
    forced = [r for r in logprob_requests if answer not in tok.decode(r["prompt_ids"])]  # the forced ids' log-probs
    assert len(generation) >= 2 * N and scoring and len(forced) == N  # context "full": one per trajectory
    records = [{"kind": "task", "question": QUESTION, "golds": GOLDS}]
    records += [{"kind": "generate", "prompts": [r["prompt_ids"]], "strings": [], "int_lists": []}
                for r in generation + forced]
    assert violations(records, tok) == []
    assert not any(answer in tok.decode(r["prompt_ids"]) for r in generation)
    for r in generation:
        assert r["sampling_params"]["max_tokens"] <= 64 and r["sampling_params"]["stop_token_ids"]


def test_random_policy_stays_within_verls_lengths(parts):
    tmp, corpus, tok, model = parts
    config = verl_config(write_agents_yaml(tmp / "agents_random.yaml", corpus), prompt_length=PROMPT_LENGTH,
                         response_length=48, n=2)
    server = HFServer(model)
    data, seen = run_worker(dummy_worker(config, tok, server), question_batch(QUESTION, GOLDS, 2))
    assert data.batch["responses"].shape == (2, 48)
    for i in range(2):
        t = seen[i][0].trajectory
        assert len(t.response_ids) <= 48 and _scored(seen[i][0]).score == 0.0
    for r in server.requests:
        if "prompt_logprobs" not in r["sampling_params"]:
            assert r["sampling_params"]["max_tokens"] <= 48
    logprobs = data.batch["rollout_log_probs"]  # calculate_log_probs (verl's default): the server's, 0 off-sample
    assert logprobs.shape == (2, 48) and (logprobs <= 0).all() and (logprobs < 0).any()


def _memory_context_rows(parts):
    """context_policy memory: refused without V1's session_id; under V1 one output per round."""
    tmp, corpus, tok, model = parts
    config = verl_config(write_agents_yaml(tmp / "agents_memory.yaml", corpus, rollout="context_policy: memory"),
                         prompt_length=PROMPT_LENGTH * 4, response_length=RESPONSE_LENGTH, n=2)
    worker = dummy_worker(config, tok, HFServer(model, script=needle_script(tok, first_variant=2)))
    import asyncio

    from hydra.utils import instantiate
    from verl.experimental.agent_loop.agent_loop import DictConfigWrap, ToolListWrap, _agent_loop_registry
    from verl.utils.dataset.rl_dataset import RLHFDataset

    def build():
        return instantiate(_agent_loop_registry["mempo_agent"], trainer_config=DictConfigWrap(config),
                           server_manager=worker.llm_client, tokenizer=tok, processor=None, hf_model_type="qwen2",
                           dataset_cls=RLHFDataset, data_config=DictConfigWrap(config.data), tools=ToolListWrap([]))

    sample = {"raw_prompt": [{"role": "user", "content": QUESTION}], "reward_model": {"ground_truth": GOLDS},
              "uid": "q0", "extra_info": {}}
    with pytest.raises(ConfigError, match="needs verl's V1 trainer"):
        asyncio.run(build().run({"temperature": 1.0, "logprobs": False}, **sample))
    loop = build()
    outputs = asyncio.run(loop.run({"temperature": 1.0, "logprobs": False}, session_id=0, global_steps=1, **sample))
    t = loop.trajectory
    assert isinstance(outputs, list) and len(outputs) == len(t.rounds) >= 2
    spans = {r.index: r.mem_span for r in t.scored_rounds()}
    for round_, output in zip(t.rounds, outputs):
        assert output.prompt_ids == round_.prompt_ids  # each row's prompt is the memory context it ran on
        assert output.response_ids == t.response_ids[round_.start:round_.tool_end]
        assert set(EXTRA_KEYS) <= set(output.extra_fields)
        own = output.extra_fields["mempo_mem_spans"]
        assert own == ([[spans[round_.index][0] - round_.start, spans[round_.index][1] - round_.start]]
                       if round_.index in spans else [])
    return config, worker, outputs, loop


def test_memory_context_gives_a_row_per_round_through_verls_v1_postprocess_and_trainer(parts, monkeypatch):
    config, worker, outputs, loop = _memory_context_rows(parts)  # and legacy (no session_id) refuses it
    fake = _v1_rows(worker, {0: (loop, outputs)}, monkeypatch)
    keys, metrics = _v1_advantages(config, fake, monkeypatch, 1.0)
    assert keys == [f"q0_0_{i}" for i in range(len(outputs))]  # one session, one row per round
    assert all(float(fake.rows[k]["rm_scores"].sum()) == _scored(loop).score for k in keys)
    # one session in its group: GRPO's outcome part is s / (1 + eps) on every row; the memory part is the
    # pooled z-score of the session's scored rounds on each row's own span
    scored = [k for k, out in zip(keys, outputs) if out.extra_fields["mempo_mem_spans"]]
    assert len(scored) >= 2 and metrics["mempo/scored_rounds"] == len(scored)
    for key, output in zip(keys, outputs):
        adv, mask = fake.rows[key]["advantages"], fake.rows[key]["response_mask"]
        base = _scored(loop).score / (1 + 1e-6)
        off_span = torch.ones_like(mask, dtype=torch.bool)
        for start, end in output.extra_fields["mempo_mem_spans"]:
            off_span[start:end] = False
        torch.testing.assert_close(adv[off_span], base * mask[off_span].float(), rtol=1e-5, atol=1e-6)


def test_bad_options_are_refused_by_name(parts):
    tmp, corpus, tok, model = parts
    from mempo.integrations.verl.agent_loop import loop_settings
    from mempo.integrations.verl.version import VerlVersionError, check_verl_version

    env = {"retriever": "bm25", "corpus_path": str(corpus)}
    with pytest.raises(ConfigError, match=r"mempo_agent.rollout.group_size: is not an option"):
        loop_settings({"rollout": {"group_size": 4}, "env": env}, entry="mempo_agent", score_memory=True,
                      response_length=64)
    with pytest.raises(ConfigError, match=r"mempo_agent.scoring.threshold"):
        loop_settings({"scoring": {"threshold": 2.0}, "env": env}, entry="mempo_agent", score_memory=True,
                      response_length=64)
    with pytest.raises(ConfigError, match=r"mempo_agent_eval.scoring: is read only with score_memory"):
        loop_settings({"scoring": {"threshold": 0.5}, "env": env}, entry="mempo_agent_eval", score_memory=False,
                      response_length=64)
    with pytest.raises(ConfigError, match=r"mempo_agent.forced_logprobs: must be one of engine, exclude"):
        loop_settings({"forced_logprobs": "zero", "env": env}, entry="mempo_agent", score_memory=True,
                      response_length=64)
    with pytest.raises(ConfigError, match=r"mempo_agent_eval.forced_logprobs: is read only by the training loop"):
        loop_settings({"forced_logprobs": "exclude", "env": env}, entry="mempo_agent_eval", score_memory=False,
                      response_length=64)
    with pytest.raises(VerlVersionError, match=r"built against verl 0\.9\.1 and refuses verl 0\.9\.0"):
        check_verl_version("0.9.0")


def _policy_logprobs(model, trajectory, temperature=1.0):
    """log softmax(logits / T) of every response id under `model` (what verl's actor computes), [RESPONSE_LENGTH]."""
    ids = trajectory.prompt_ids + trajectory.response_ids
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([ids])).logits[0].float() / temperature
    logp = torch.log_softmax(logits[:-1], -1).gather(1, torch.tensor(ids[1:])[:, None])[:, 0]
    out = torch.zeros(RESPONSE_LENGTH)
    out[:len(trajectory.response_ids)] = logp[len(trajectory.prompt_ids) - 1:]
    return out


def _forced(loops, shape):
    forced = torch.zeros(shape, dtype=torch.bool)
    for i, loop in enumerate(loops):
        for start, end in trained_forced_spans(loop.trajectory):
            forced[i, start:end] = True
    return forced


def test_forced_ids_carry_the_engines_log_prob_so_verls_is_weights_are_one(scripted, parts):
    """Rollout policy = training policy: verl's own rollout correction gives weight ~1 on every loss
    token, the forced <mem> ids included (they are no longer 0.0); a known shift of the forced ids'
    rollout log-probs gives exactly the weights it should, token and sequence level."""
    from verl.trainer.ppo.rollout_corr_helper import compute_rollout_correction_and_rejection_mask as correct

    _, _, data, _, loops, _ = scripted
    rollout, mask = data.batch["rollout_log_probs"].float(), data.batch["response_mask"]
    old = torch.stack([_policy_logprobs(parts[3], loop.trajectory) for loop in loops])  # the training policy's
    forced = _forced(loops, mask.shape)
    assert int(forced.sum()) >= 2 * N and bool((mask.bool() | ~forced).all())
    torch.testing.assert_close(rollout[forced], old[forced], rtol=0, atol=1e-4)
    assert (rollout[forced] < -1e-3).all()  # a real log-probability, not the 0.0 of an unsampled id
    ones = lambda t: torch.ones_like(t)  # noqa: E731
    for level in ("token", "sequence"):
        weights, _, metrics = correct(old, rollout, mask, rollout_is=level, rollout_is_threshold=2.0)
        w = weights.batch["rollout_is_weights"]
        torch.testing.assert_close(w[mask.bool()], ones(w[mask.bool()]), rtol=0, atol=2e-3)
    assert abs(metrics["rollout_corr/kl"]) < 1e-4
    # a known perturbation of the forced ids' rollout log-probs: weight exp(-delta), capped at 2 (TIS)
    delta = torch.zeros_like(rollout)
    pattern = torch.tensor([0.5, -0.25, -1.0])
    delta[forced] = pattern.repeat(int(forced.sum()) // 3 + 1)[:int(forced.sum())]
    weights, _, _ = correct(old, rollout + delta, mask, rollout_is="token", rollout_is_threshold=2.0)
    w = weights.batch["rollout_is_weights"]
    torch.testing.assert_close(w[forced], torch.exp(-delta[forced]).clamp(max=2.0), rtol=2e-3, atol=0)
    torch.testing.assert_close(w[mask.bool() & ~forced], ones(w[mask.bool() & ~forced]), rtol=0, atol=2e-3)
    weights, _, _ = correct(old, rollout + delta, mask, rollout_is="sequence", rollout_is_threshold=1e4)
    w = weights.batch["rollout_is_weights"]
    for i in range(N):
        torch.testing.assert_close(w[i, mask[i].bool()], torch.exp(-delta[i].sum()).expand(int(mask[i].sum())),
                                   rtol=5e-3, atol=0)


@pytest.mark.parametrize("temperature, options", [(0.7, ""), (1.0, "forced_logprobs: exclude")])
def test_forced_ids_without_an_engine_log_prob_are_left_out_of_verls_correction(parts, monkeypatch, temperature,
                                                                                 options):
    """Sampling at T=0.7 (the engines' prompt log-probs are at T=1), or forced_logprobs: exclude: the loop
    sends no forced-id request and lists the spans; mempo_sync, through verl's own _compute_old_log_prob
    and _compute_advantage, gives them IS weight exactly 1 and computes the correction's metrics without
    them."""
    from omegaconf import open_dict
    from transfer_queue import KVBatchMeta
    from verl.trainer.ppo.rollout_corr_helper import compute_rollout_correction_and_rejection_mask as correct

    tmp, corpus, tok, model = parts
    config = verl_config(write_agents_yaml(tmp / f"agents_{temperature}.yaml", corpus, options=options),
                         prompt_length=PROMPT_LENGTH, response_length=RESPONSE_LENGTH, n=N)
    with open_dict(config):
        config.actor_rollout_ref.rollout.temperature = temperature
        config.algorithm.rollout_correction.rollout_is = "token"
    server = HFServer(model, script=needle_script(tok))
    worker = dummy_worker(config, tok, server)
    _, seen = run_worker(worker, question_batch(QUESTION, GOLDS, N))
    loops = [seen[i][0] for i in range(N)]
    forced = _forced(loops, (N, RESPONSE_LENGTH))
    for i, loop in enumerate(loops):
        assert seen[i][1].extra_fields["mempo_forced_spans"] == [list(s) for s in trained_forced_spans(loop.trajectory)]
    answer = "<answer>\nNeedle 3\n</answer>"
    assert all(answer in tok.decode(r["prompt_ids"]) for r in server.requests if "prompt_logprobs" in
               r["sampling_params"])  # scoring requests only: no forced-id request at this temperature
    fake = _v1_rows(worker, seen, monkeypatch)
    keys = sorted(fake.rows)

    class Actor:  # the actor worker group: the training policy's log-probs at the sampling temperature, one
        def compute_log_prob(self, meta):  # per input id predicting the next (verl's left-shifted layout)
            for i, key in enumerate(meta.keys):
                t, n = loops[i].trajectory, fake.rows[key]["responses"].numel()
                shifted = torch.zeros(len(t.prompt_ids) + n)
                shifted[len(t.prompt_ids) - 1:-1] = _policy_logprobs(model, t, temperature)[:n]
                fake.rows[key]["log_probs"], fake.rows[key]["entropy"] = shifted, torch.zeros_like(shifted)
            return meta

    trainer = _v1_trainer(config, fake, monkeypatch, 1.0)
    trainer.actor_rollout_wg = Actor()
    meta = KVBatchMeta(keys=keys, tags=[{} for _ in keys], partition_id="train")
    metrics = {}
    trainer._compute_old_log_prob(meta, metrics)
    trainer._compute_advantage(meta, metrics)
    assert metrics["mempo/forced_ids_excluded"] == float(forced.sum()) >= 2 * N
    old = torch.zeros(N, RESPONSE_LENGTH)
    rollout, mask = torch.zeros_like(old), torch.zeros_like(old)
    for i, key in enumerate(keys):
        n = fake.rows[key]["response_mask"].numel()
        w = fake.rows[key]["rollout_is_weights"]
        row_forced = forced[i, :n] & fake.rows[key]["response_mask"].bool()
        assert (w[row_forced] == 1.0).all()
        torch.testing.assert_close(w[~row_forced & fake.rows[key]["response_mask"].bool()],
                                   torch.ones(int((~row_forced & fake.rows[key]["response_mask"].bool()).sum())),
                                   rtol=0, atol=2e-3)
        old[i, :n], rollout[i, :n] = fake.rows[key]["old_log_probs"], fake.rows[key]["rollout_log_probs"]
        mask[i, :n] = fake.rows[key]["response_mask"].float()
    _, _, want = correct(old, rollout, mask * ~forced, rollout_is="token", rollout_is_threshold=2.0)
    for name, value in want.items():
        assert metrics[name] == pytest.approx(value, rel=1e-5, abs=1e-6), name
    assert metrics["training/rollout_probs_diff_max"] < 1e-3  # verl's diagnostics, the forced ids left out


# ------------------------------------------------------------------------------------------------
# your tools (verl's tool YAML and function tools, mempo Tools by import path) and the json format
# ------------------------------------------------------------------------------------------------
COLOUR_QUESTION, COLOUR_GOLDS = "What colour is the sky?", ["blue"]
SYSTEM = "You are a careful colour expert."


def _call(name, arguments):
    return f'<tool_call>{{"name": "{name}", "arguments": {arguments}}}</tool_call>'


def _json_rounds(answer):
    """Every tool once (a mempo Tool, a verl BaseTool subclass, a verl function tool, verl's own BaseTool),
    then every way a call can fail, then the answer."""
    mem = "sky is blue</mem>\n<think>\n"
    return ["</mem>\n<think>\nlook it up\n</think>\n" + _call("lookup", '{"key": "sky"}'),
            mem + "the book\n</think>\n" + _call("colour", '{"thing": "grass"}'),
            mem + "shout\n</think>\n" + _call("shout", '{"text": "sky"}'),
            mem + "touch\n</think>\n" + _call("touch", "{}"),
            mem + "explode\n</think>\n" + _call("explode", "{}"),
            mem + "bad json\n</think>\n" + '<tool_call>{"name": "colour", "arguments": {"thing": </tool_call>',
            mem + "unknown\n</think>\n" + _call("weather", "{}"),
            mem + "slow\n</think>\n" + _call("sleep", "{}"),
            mem + "flood\n</think>\n" + _call("flood", "{}"),
            mem + f"done\n</think>\n<answer>{answer}</answer>"]


JSON_VARIANTS = [_json_rounds("blue"), _json_rounds("red")]
USER_TOOLS = ["lookup", "touch", "colour", "explode", "sleep", "flood", "shout"]
JSON_N = 2  # one trajectory per variant


def _tools_config(tmp, name, *, outcome_reward="support.user_tools:overlap_reward"):
    """A verl run whose mempo loops take verl's tools (tool YAML + function tools) and a mempo Tool, in the
    json format, and whose reward is a mempo outcome reward through verl's reward function."""
    from omegaconf import open_dict
    from support.verl_user_tools import FUNCTION_TOOLS, tool_yaml

    env = "{tools: ['support.user_tools:lookup'], tool_timeout: 1, tool_result_chars: 300}"
    agents = write_agents_yaml(tmp / f"{name}.yaml", None, rollout="action_format: json", env=env, max_turns=10,
                               max_new_tokens=160, eval_rollout="action_format: json")
    config = verl_config(agents, prompt_length=1536, response_length=2048, n=JSON_N)
    with open_dict(config):
        multi_turn = config.actor_rollout_ref.rollout.multi_turn
        multi_turn.tool_config_path = str(tool_yaml(tmp / f"{name}_tools.yaml", ["touch", "colour", "explode", "sleep",
                                                                                   "flood"]))
        multi_turn.function_tool_path = str(FUNCTION_TOOLS)
        config.reward.custom_reward_function.path = "pkg://mempo.integrations.verl.reward"
        config.reward.custom_reward_function.name = "outcome_reward_score"
        config.reward.custom_reward_function.reward_kwargs = {"outcome_reward": outcome_reward}
    return config


@pytest.fixture(scope="module")
def json_tools(parts):
    from support import user_tools, verl_user_tools

    tmp, _, tok, model = parts
    config = _tools_config(tmp, "agents_tools")
    server = HFServer(model, script=rounds_script(tok, JSON_VARIANTS))
    user_tools.LOOKUPS.clear()
    user_tools.REWARD_CALLS.clear()
    verl_user_tools.LIFECYCLE.clear()
    worker = dummy_worker(config, tok, server)
    data, seen = run_worker(worker, question_batch(COLOUR_QUESTION, COLOUR_GOLDS, JSON_N, system=SYSTEM,
                                                   extra_info={"id": "colours-1", "topic": "colours"}))
    return config, server, data, [seen[i][0] for i in range(JSON_N)], seen, worker


def test_json_tool_calls_reach_verls_tools_and_a_mempo_tool_and_every_failure_is_one_line(json_tools, parts):
    from mempo.protocol.tags import JSON_TAG_SET
    from support import user_tools, verl_user_tools

    _, server, data, loops, seen, worker = json_tools
    tok = parts[2]
    assert [t.name for t in worker.tools] == USER_TOOLS[1:]  # verl's own loading: the YAML, then function tools
    assert user_tools.LOOKUPS == ["sky"] * JSON_N
    failed = [False] * 4 + [True] * 4 + [False]
    for loop in loops:
        t = loop.trajectory
        assert loop.memory_rewards and t.finish_reason == "answer" and len(t.rounds) == 10
        assert [r.action for r in t.rounds] == ["tool_call"] * 9 + ["answer"]
        seen_text = [tok.decode(t.response_ids[r.information[0]:r.information[1]]) for r in t.rounds[:9]]
        assert seen_text[:4] == ["<tool_response>sky is blue</tool_response>",
                                 "<tool_response>grass is green</tool_response>", "<tool_response>SKY!</tool_response>",
                                 "<tool_response>Updated the tool state.</tool_response>"]
        assert seen_text[4] == ("<tool_response>Error: the explode tool failed (RuntimeError: the sandbox is down "
                                "second line); try again or answer with what you know.</tool_response>")
        assert seen_text[5].startswith("<tool_response>Error: the tool call is not valid JSON")
        assert seen_text[6] == ("<tool_response>Error: no tool named 'weather'; the tools are: "
                                f"{', '.join(USER_TOOLS)}</tool_response>")
        assert seen_text[7] == ("<tool_response>Error: the sleep tool did not answer within 1 s; try again or answer "
                                "with what you know.</tool_response>")
        assert seen_text[8] == ("<tool_response>" + "y" * 300 + "\n[... cut: the first 300 of 1048576 characters]"
                                "</tool_response>")
        assert all("\n" not in text.removesuffix("</tool_response>") for text in seen_text[4:8])  # one line each
        assert [not r.tool_ok for r in t.rounds[:9]] == failed
        assert all(tok.decode(t.response_ids[r.start:r.start + r.prefix_len]) == "<mem>" for r in t.rounds)
        # masks 0 exactly on the tool segments; the <mem> spans are the C++ scanner's under the JSON tags
        tool = [0] * len(t.response_ids)
        for r in t.rounds:
            tool[r.end:r.tool_end] = [1] * (r.tool_end - r.end)
        assert [1 - m for m in t.response_mask] == tool
        spans = find_spans([t.response_ids], TokenBytes.of(tok).table, tags=JSON_TAG_SET).spans_of(0)
        assert {r.mem_span for r in t.scored_rounds()} <= {(s.start, s.end) for s in spans if s.tag == "mem"}
        assert len(t.scored_rounds()) == 9
    # verl's BaseTool lifecycle for every call: create (no per-sample create_kwargs), execute, release, even
    # after the tool raised
    calls = verl_user_tools.LIFECYCLE
    assert sorted(c[0] for c in calls) == ["create"] * 2 * JSON_N + ["execute"] * JSON_N + ["release"] * 2 * JSON_N
    assert all(c[2] == {"create_kwargs": {}} for c in calls if c[0] == "create")
    for instance in {c[1] for c in calls}:
        assert [c[0] for c in calls if c[1] == instance] in (["create", "execute", "release"], ["create", "release"])
    # the model was told the tools: the dataset's system message, then every schema, mempo's and verl's
    first = [r for r in server.requests if "prompt_logprobs" not in r["sampling_params"]][0]
    prompt = tok.decode(first["prompt_ids"])
    assert f"{SYSTEM}\n\n# Tools\n" in prompt
    assert ('{"type": "function", "function": {"name": "colour", "description": "The colour of a thing, from a colour '
            'book.", "parameters": {"type": "object", "properties": {"thing": {"type": "string", "description": '
            '"what to look up"}}, "required": ["thing"]}}}') in prompt
    assert [prompt.index(f'"name": "{n}"') for n in USER_TOOLS] == sorted(prompt.index(f'"name": "{n}"')
                                                                            for n in USER_TOOLS)
    assert "colours" not in prompt  # the row's other fields reach the reward only
    for i in range(JSON_N):
        assert data.non_tensor_batch["mempo_action_format"][i] == "json"
        assert list(data.non_tensor_batch["mempo_tools"][i]) == USER_TOOLS


def test_the_json_rollout_scores_its_memory_and_a_mempo_reward_gives_the_outcome(json_tools, parts):
    """The memory rewards are mempo.scoring's on the same trajectories; the outcome is the user's mempo
    reward (support.user_tools:overlap_reward) through verl's reward loop and mempo's adapter, with
    mempo's EM under the JSON tags as its diagnostics; no generation request holds the gold."""
    from support import user_tools

    _, server, data, loops, _, worker = json_tools
    tok, model = parts[2], parts[3]
    want, _ = compute_memory_rewards(model, tok, [loop.trajectory for loop in loops],
                                     ScoringConfig(method="reference", threshold=None))
    flat = lambda rows: torch.tensor([v for row in rows for v in row], dtype=torch.float64)  # noqa: E731
    torch.testing.assert_close(flat([loop.memory_rewards for loop in loops]), flat(want), rtol=1e-4, atol=1e-9)
    assert flat(want).abs().max() > 0
    assert [float(data.batch["rm_scores"][i].sum()) for i in range(JSON_N)] == [1.0, 0.0]
    assert list(data.non_tensor_batch["mempo_reward"]) == [1.0, 0.0]
    assert list(data.non_tensor_batch["mempo_em"]) == [1.0, 0.0]  # format ok under the JSON tags
    assert list(data.non_tensor_batch["mempo_format_ok"]) == [1.0] * JSON_N
    assert worker.reward_loop_worker_handles[0].calls == JSON_N and len(user_tools.REWARD_CALLS) == JSON_N
    for answer, example in user_tools.REWARD_CALLS:
        assert answer in ("blue", "red") and example["golds"] == [["blue"]]
        assert example["prompt"] == COLOUR_QUESTION and example["questions"] == [COLOUR_QUESTION]
        assert example["id"] == "colours-1" and example["topic"] == "colours" and example["data_source"] == "needle"
        assert not any(key.startswith("mempo_") for key in example)
    # no request but the scoring ones (prompt_logprobs over a context + the answer template) holds the gold
    scoring = [r for r in server.requests if "<answer>\nblue\n</answer>" in tok.decode(r["prompt_ids"])]
    others = [r for r in server.requests if r not in scoring]
    assert len(scoring) == 2 * 9 * JSON_N and all("prompt_logprobs" in r["sampling_params"] for r in scoring)
    assert sum("prompt_logprobs" not in r["sampling_params"] for r in others) == 10 * JSON_N
    assert sum("prompt_logprobs" in r["sampling_params"] for r in others) == JSON_N  # the forced ids' log-probs
    records = [{"kind": "task", "question": COLOUR_QUESTION, "golds": COLOUR_GOLDS}]
    records += [{"kind": "generate", "prompts": [r["prompt_ids"]], "strings": [], "int_lists": []} for r in others]
    assert violations(records, tok) == []


def test_per_sample_tool_options_are_refused_before_any_request(parts):
    """verl's tools_kwargs (create_kwargs can carry the gold into a tool) and extra_info.tool_selection are
    not applied by the mempo loops: the sample is refused by name, before any request."""
    tmp, _, tok, model = parts
    config = _tools_config(tmp, "agents_tools_kwargs")
    server = HFServer(model, script=rounds_script(tok, JSON_VARIANTS))
    worker = dummy_worker(config, tok, server)
    kwargs = {"colour": {"create_kwargs": {"ground_truth": "blue"}}}
    with pytest.raises(ValueError, match=r"the sample has tools_kwargs .* drop them"):
        run_worker(worker, question_batch(COLOUR_QUESTION, COLOUR_GOLDS, 2, tools_kwargs=kwargs))
    with pytest.raises(ValueError, match=r"the sample has extra_info.tool_selection"):
        run_worker(worker, question_batch(COLOUR_QUESTION, COLOUR_GOLDS, 2, extra_info={"tool_selection": ["colour"]}))
    assert server.requests == []


def test_the_json_tools_under_the_memory_context(parts):
    """mempo_agent_eval (context_policy memory): each round sees the system prompt with the tools' schemas,
    the question, the last <mem> and the last <tool_response>, not the rounds before."""
    tmp, _, tok, model = parts
    config = _tools_config(tmp, "agents_tools_memory")
    worker = dummy_worker(config, tok, HFServer(model, script=rounds_script(tok, JSON_VARIANTS)), reward=False)
    _, seen = run_worker(worker, question_batch(COLOUR_QUESTION, COLOUR_GOLDS, 1, agent_name="mempo_agent_eval"))
    loop, output = seen[0]
    t = loop.trajectory
    assert t.policy == "memory" and len(t.rounds) == 10 and t.finish_reason == "answer"
    assert output.extra_fields["mempo_action_format"] == "json" and output.extra_fields["mempo_mem_rewards"] == []
    contexts = [tok.decode(r.prompt_ids) for r in t.rounds]
    assert all('"name": "colour"' in c and COLOUR_QUESTION in c for c in contexts)
    assert "<tool_response>grass is green</tool_response>" in contexts[2]
    assert "<tool_response>sky is blue</tool_response>" not in contexts[2]  # round 0's result: no longer shown
    assert "the book" not in contexts[3] and "<tool_response>SKY!</tool_response>" in contexts[3]
    assert "Error: the explode tool failed" in contexts[5]
