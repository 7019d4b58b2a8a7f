"""HFBackend (transformers generation on a tiny random Qwen2) and the training views of trajectories:
seeded batched sampling, left padding, per-row stops on the action marker / EOS / length, weight
sync, the loop end to end with a real model, and log-prob equality of the per-round training
sequences with independent recomputations."""
import json

import pytest
import torch

from mempo.algo.outcome import score_outcomes
from mempo.config import RolloutConfig
from mempo.protocol.memory import AgentMemory
from mempo.records.trajectory import round_training_inputs
from mempo.rollout.backends import (
    GenerationRequest, HFBackend, SamplingParams, ScriptedBackend, cut_round, round_script,
)
from mempo.rollout.loop import RolloutEngine
from support.rollout_fixtures import merged_closer
from support.rollout_fixtures import chat_tokenizer, identity_weights, needle_scripts, needle_task, tiny_qwen2


@pytest.fixture(scope="module")
def tok():
    return chat_tokenizer()


@pytest.fixture(scope="module")
def model(tok):
    return tiny_qwen2(len(tok), seed=0)


def enc(tok, text):
    return tok.encode(text, add_special_tokens=False)


def requests_for(tok, prompts, max_new=16, stops=()):
    prefix = enc(tok, "<mem>")
    return [GenerationRequest(enc(tok, p) + prefix, max_new, len(prefix), tuple(stops)) for p in prompts]


PROMPTS = ["a short prompt", "a much longer prompt about the river city and its museum", "x"]


def test_seeded_batched_sampling_is_reproducible(tok, model):
    backend = HFBackend(model, tok)
    requests = requests_for(tok, PROMPTS)
    first = backend.generate(requests, SamplingParams(temperature=1.0, seed=3))
    again = backend.generate(requests, SamplingParams(temperature=1.0, seed=3))
    other = backend.generate(requests, SamplingParams(temperature=1.0, seed=4))
    assert [o.token_ids for o in first] == [o.token_ids for o in again]
    assert [o.token_ids for o in first] != [o.token_ids for o in other]
    assert all(len(o.token_ids) == 16 and o.finish_reason == "length" for o in first)
    state = torch.random.get_rng_state()
    backend.generate(requests, SamplingParams(seed=5))
    assert torch.equal(state, torch.random.get_rng_state())  # the caller's RNG is untouched
    chunked = HFBackend(model, tok, max_batch_size=2).generate(requests, SamplingParams(temperature=0))
    assert [o.token_ids for o in chunked] == [o.token_ids for o in backend.generate(requests, SamplingParams(0))]


def _forward_logprobs(model, prompt, ids, temperature):
    """log softmax(logits / T) of `ids` after `prompt`, from one forward (what the trainer computes)."""
    full = prompt + ids
    with torch.no_grad():
        logp = torch.log_softmax(model(input_ids=torch.tensor([full])).logits[0].float() / temperature, -1)
    return [float(logp[len(prompt) - 1 + j, t]) for j, t in enumerate(ids)]


@pytest.mark.parametrize("temperature, top_k", [(1.0, 0), (0.7, 5), (0.0, 0)])
def test_outputs_carry_the_sampled_ids_log_probs(tok, model, temperature, top_k):
    """Each returned id's log-prob under the model at the sampling temperature (top-k not applied, the
    raw distribution when greedy), read off the generation scores of a left-padded chunked batch."""
    backend = HFBackend(model, tok, max_batch_size=2)
    assert backend.returns_logprobs
    requests = requests_for(tok, PROMPTS, max_new=9)
    outputs = backend.generate(requests, SamplingParams(temperature=temperature, top_k=top_k, seed=1))
    for request, output in zip(requests, outputs):
        assert len(output.logprobs) == len(output.token_ids) >= 1
        want = _forward_logprobs(model, request.prompt_ids, output.token_ids, temperature or 1.0)
        torch.testing.assert_close(torch.tensor(output.logprobs), torch.tensor(want), rtol=0, atol=1e-5)
        assert max(output.logprobs) < 0  # a random model's ids: probabilities below 1, not a default


def test_left_padded_greedy_batch_equals_one_by_one(tok, model):
    backend = HFBackend(model, tok)
    requests = requests_for(tok, PROMPTS, max_new=12)
    batched = backend.generate(requests, SamplingParams(temperature=0))
    for request, output in zip(requests, batched):
        assert backend.generate([request], SamplingParams(temperature=0))[0].token_ids == output.token_ids


class ForcedScripts:
    """A logits processor forcing row-specific token scripts (then leaving the model free)."""

    def __init__(self, scripts):
        self.scripts, self.width = scripts, None

    def __call__(self, input_ids, scores):
        if self.width is None:
            self.width = input_ids.shape[1]
        step = input_ids.shape[1] - self.width
        for row, script in enumerate(self.scripts):
            if step < len(script):
                scores[row] = float("-inf")
                scores[row, script[step]] = 0.0
        return scores


def test_stops_per_row_on_the_marker_eos_and_length(tok, model):
    closer, _ = merged_closer(tok)
    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    action = enc(tok, "</mem><think>x</think><search>q</search") + [closer] + enc(tok, " junk junk junk")
    eos = enc(tok, "</mem><think>y</think>") + [im_end] + enc(tok, " more text")
    long = enc(tok, "</mem><think>" + "z " * 40)
    think_only = enc(tok, "</mem><think>I could </search> here</think><answer>") + enc(tok, "done</ans") + \
        enc(tok, "wer> after")
    scripts = [action, eos, long, think_only]
    backend = HFBackend(model, tok, logits_processors=[ForcedScripts(scripts)])
    prefix = enc(tok, "<mem>")
    prompt = enc(tok, "same length prompt")
    requests = [GenerationRequest(prompt + prefix, n, len(prefix), (im_end,)) for n in (40, 40, 12, 60)]
    out = backend.generate(requests, SamplingParams(temperature=0))
    assert out[0].token_ids == action[:action.index(closer) + 1] and out[0].finish_reason == "action"
    assert out[1].token_ids == eos[:eos.index(im_end) + 1] and out[1].finish_reason == "eos"
    assert out[2].token_ids == long[:12] and out[2].finish_reason == "length"
    answer_end = next(k for k in range(len(think_only) + 1) if "</answer>" in tok.decode(think_only[:k]))
    assert out[3].finish_reason == "action" and tok.decode(out[3].token_ids).endswith("done</answer>")
    assert len(out[3].token_ids) == answer_end
    for request, output in zip(requests, out):  # the loop's authoritative cut agrees with the backend
        cut = cut_round(output.token_ids, backend.token_bytes, prefix_ids=prefix, stop_token_ids=(im_end,),
                        max_new_tokens=request.max_new_tokens)
        assert cut.token_ids == output.token_ids and cut.reason == output.finish_reason


def test_the_models_own_eos_stops_a_row_without_padding(tok):
    model = tiny_qwen2(len(tok), seed=0)
    backend = HFBackend(model, tok)
    requests = requests_for(tok, ["a short prompt", "x y"], max_new=16)
    free = backend.generate(requests, SamplingParams(temperature=0))
    model.generation_config.eos_token_id = free[0].token_ids[2]  # transformers applies it on its own
    stopped = backend.generate(requests, SamplingParams(temperature=0))
    assert stopped[0].token_ids == free[0].token_ids[:3] and stopped[0].finish_reason == "eos"
    assert stopped[1].token_ids == free[1].token_ids[:len(stopped[1].token_ids)]


def test_sync_weights(tok):
    rollout_model, trainer_model = tiny_qwen2(len(tok), seed=0), tiny_qwen2(len(tok), seed=1)
    backend = HFBackend(rollout_model, tok)
    requests = requests_for(tok, PROMPTS, max_new=8)
    before = backend.generate(requests, SamplingParams(0))
    expected = HFBackend(trainer_model, tok).generate(requests, SamplingParams(0))
    assert [o.token_ids for o in before] != [o.token_ids for o in expected]
    backend.sync_weights(trainer_model.state_dict())
    assert [o.token_ids for o in backend.generate(requests, SamplingParams(0))] == [o.token_ids for o in expected]
    weight = rollout_model.model.embed_tokens.weight
    pointer, values = weight.data_ptr(), weight.detach().clone()
    backend.sync_weights(rollout_model.state_dict())  # shared storage: skipped
    backend.sync_weights(None)  # the trainer shares the model object
    assert weight.data_ptr() == pointer and torch.equal(weight, values)
    with pytest.raises(KeyError):
        backend.sync_weights({"no.such.weight": torch.zeros(1)})
    backend.sync_weights(identity_weights(trainer_model))  # the premise of the SGLang weight-sync test
    for request, output in zip(requests, backend.generate(requests, SamplingParams(0))):
        assert output.token_ids == [request.prompt_ids[-1]] * 8


class Recording:
    """Wraps a backend and keeps every raw output (to compare with the stored trajectories); resets
    the scripted logits processors before each call."""

    def __init__(self, backend, processors=()):
        self.backend, self.outputs, self.processors = backend, {}, processors

    def generate(self, requests, sampling):
        for processor in self.processors:
            processor.width = None
        outputs = self.backend.generate(requests, sampling)
        for request, output in zip(requests, outputs):
            self.outputs[request.key] = list(output.token_ids)
        return outputs

    def sync_weights(self, weights=None):
        self.backend.sync_weights(weights)


class RoundScripts(ForcedScripts):
    """Forces script[r] in round r, r = the number of assistant turns already in the row's context
    (works for the full policy, whose context holds every earlier turn)."""

    def __init__(self, tok, scripts):
        super().__init__(None)
        self.turn = enc(tok, "<|im_start|>assistant")
        self.round_scripts, self.rows = scripts, None

    def __call__(self, input_ids, scores):
        if self.width is None:
            rows = []
            for row in input_ids.tolist():
                turns = sum(row[i:i + len(self.turn)] == self.turn for i in range(len(row)))
                rows.append(self.round_scripts[min(turns - 1, len(self.round_scripts) - 1)])
            self.scripts = rows
        return super().__call__(input_ids, scores)


def test_hf_backend_in_the_loop(tok, model, bm25):
    scripts = [enc(tok, text) for text in needle_scripts(3)]
    forced = RoundScripts(tok, scripts)
    backend = Recording(HFBackend(model, tok, logits_processors=[forced]), [forced])
    config = RolloutConfig(group_size=3, max_new_tokens_per_round=64, temperature=1.0, seed=11)
    trajectories = score_outcomes(RolloutEngine(backend, tok, retriever=bm25, config=config).run([needle_task(3)]))
    for t in trajectories:
        t.validate()
        assert t.finish_reason == "answer" and t.score == 1.0 and len(t.rounds) == 2
        for r in t.rounds:
            assert t.response_ids[r.start + r.prefix_len:r.end] == backend.outputs[(t.uid, t.sample_index, r.index)]
        assert t.rounds[1].scored

    free = Recording(HFBackend(model, tok))  # the random model alone: it does not follow the protocol
    config = RolloutConfig(group_size=4, max_new_tokens_per_round=24, max_turns=2, seed=1)
    trajectories = score_outcomes(RolloutEngine(free, tok, retriever=bm25, config=config).run([needle_task(3),
                                                                                             needle_task(4)]))
    assert len(trajectories) == 8
    for t in trajectories:
        t.validate()
        assert t.finish_reason == "malformed" and t.score == 0.0
        r = t.rounds[0]
        assert t.response_ids[r.start + r.prefix_len:r.end] == free.outputs[(t.uid, t.sample_index, 0)]


def test_trajectories_carry_the_sampled_ids_log_probs(tok, model, bm25):
    """The loop keeps each sampled id's log-prob at its response position (the backend's, for the ids
    the round kept); forced-prefix and tool ids were not sampled: 0.0 there, and not sampled_positions.
    A backend without log-probs gives trajectories without them; the field survives a JSON round trip."""
    from mempo.records.trajectory import Trajectory

    scripts = [enc(tok, text) for text in needle_scripts(3)]
    forced = RoundScripts(tok, scripts)  # the model's own log-probs of the scripted ids (before the processor)
    config = RolloutConfig(group_size=2, max_new_tokens_per_round=64, temperature=0.8, seed=5)
    backend = HFBackend(model, tok, logits_processors=[forced])
    trajectories = RolloutEngine(backend, tok, retriever=bm25, config=config).run([needle_task(3)])
    for t in trajectories:
        sampled = t.sampled_positions()
        assert len(t.rollout_logprobs) == len(t.response_ids) == len(sampled)
        want = torch.tensor(_forward_logprobs(model, t.prompt_ids, t.response_ids, 0.8))
        got = torch.tensor(t.rollout_logprobs)
        mask = torch.tensor(sampled)
        torch.testing.assert_close(got[mask], want[mask], rtol=0, atol=1e-5)
        assert (got[~mask] == 0.0).all() and (got[mask] < 0).all()
        for r in t.rounds:  # forced prefix and tool segment: not sampled
            assert not any(sampled[r.start:r.start + r.prefix_len]) and not any(sampled[r.end:r.tool_end])
            assert all(sampled[r.start + r.prefix_len:r.end])
        again = Trajectory.from_dict(json.loads(json.dumps(t.to_dict())))
        assert again.rollout_logprobs == t.rollout_logprobs
    plain = ScriptedBackend(round_script(tok, {"q3": needle_scripts(3)}), tok)
    (t,) = RolloutEngine(plain, tok, retriever=bm25, config=RolloutConfig(group_size=1)).run([needle_task(3)])
    assert t.rollout_logprobs is None and Trajectory.from_dict(t.to_dict()).rollout_logprobs is None


# ------------------------------------------------------------------------------------------------
# training views: log-probs of every round's tokens
# ------------------------------------------------------------------------------------------------

def token_logprobs(model, ids):
    """log p(ids[i] | ids[:i]) for i >= 1, one forward in float64 [len(ids) - 1]."""
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0]
    logprobs = torch.log_softmax(logits.double(), dim=-1)
    return logprobs[:-1].gather(1, torch.tensor(ids[1:])[:, None])[:, 0]


@pytest.fixture(scope="module")
def model64(tok):
    return tiny_qwen2(len(tok), seed=2).double()


def scripted_run(tok, bm25, policy):
    scripts = {"q4": ["</mem><think>find it</think><search>zebulon4</search>",
                      "search found needle-4</mem><think>read it</think><access>needle-4</access>",
                      "needle-4 is Needle 4</mem><think>done</think><answer>Needle 4</answer>"]}
    backend = ScriptedBackend(round_script(tok, scripts), tok)
    config = RolloutConfig(context_policy=policy, group_size=1, max_new_tokens_per_round=64)
    (t,) = RolloutEngine(backend, tok, retriever=bm25, config=config).run([needle_task(4)])
    return t


def chatml(messages):
    """ChatML text with the generation prompt, written out here (not through mempo.rollout.chat)."""
    return "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages) + \
        "<|im_start|>assistant\n"


def test_memory_policy_round_inputs_equal_fresh_prompts(tok, model64, bm25):
    t = scripted_run(tok, bm25, "memory")
    inputs = round_training_inputs(t)
    memory = AgentMemory(needle_task(4)["prompt"])
    for r, round_input in zip(t.rounds, inputs):
        generated = t.response_ids[r.start:r.end]
        fresh = enc(tok, chatml(memory.messages("memory"))) + generated
        assert round_input.input_ids == fresh
        n = len(generated)
        assert round_input.loss_mask == [0] * (len(fresh) - n) + [1] * n
        ours = token_logprobs(model64, round_input.input_ids)[-n:]
        theirs = token_logprobs(model64, fresh)[-n:]
        assert torch.allclose(ours, theirs, atol=1e-12, rtol=0)
        masked = token_logprobs(model64, round_input.input_ids)[torch.tensor(round_input.loss_mask[1:]).bool()]
        assert torch.equal(masked, ours)
        memory.add_llm_gen(tok.decode(generated))
        if r.information is not None:
            text = tok.decode(t.response_ids[r.information[0]:r.information[1]])
            (memory.add_webpage if r.action == "access" else memory.add_search_results)(text)


def test_full_policy_round_logprobs_inside_the_long_sequence(tok, model64, bm25):
    t = scripted_run(tok, bm25, "full")
    whole = token_logprobs(model64, t.sequence_ids)
    prompt_len = len(t.prompt_ids)
    for r, round_input in zip(t.rounds, round_training_inputs(t)):
        prefix_only = token_logprobs(model64, t.prompt_ids + t.response_ids[:r.end])
        inside = whole[prompt_len + r.start - 1:prompt_len + r.end - 1]
        assert torch.allclose(inside, prefix_only[-(r.end - r.start):], atol=1e-10, rtol=0)
        assert round_input.input_ids == t.prompt_ids + t.response_ids[:r.end]
