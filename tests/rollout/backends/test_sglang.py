"""SGLangBackend against a real `sglang.Engine` (GPU tier: skipped without CUDA or without sglang).

A tiny random Qwen2 (2 layers, 256 wide, head dim 64) is saved to a temporary directory and served
with ``skip_tokenizer_init=True``; token ids go in and come out. Weight sync is checked with weights
under which the model greedily repeats its last input token (the same premise is checked on CPU
with HFBackend in tests/rollout/backends/test_hf.py::test_sync_weights). The engine the trainer builds from the
config (`mempo.rollout.backends.factory`) is checked too: memory released after a rollout, weights
loaded back through the update session. The same logic runs on CPU against a stand-in engine in
tests/rollout/backends/test_sglang_cpu.py.
"""
import pytest

pytestmark = pytest.mark.gpu

import torch  # noqa: E402

if not torch.cuda.is_available():
    pytest.skip("SGLangBackend needs a CUDA device; this machine has none (GPU tier)", allow_module_level=True)
pytest.importorskip("sglang", reason="SGLangBackend needs the 'sglang' package (GPU install: pip install sglang)")

from mempo.config import RolloutConfig  # noqa: E402
from mempo.rollout.backends import GenerationRequest, SGLangBackend, SamplingParams, cut_round  # noqa: E402
from mempo.rollout.loop import RolloutEngine  # noqa: E402
from support.rollout_fixtures import chat_tokenizer, identity_weights, needle_task, tiny_qwen2  # noqa: E402


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    tok = chat_tokenizer()
    model = tiny_qwen2(len(tok), seed=0, hidden=256)
    path = tmp_path_factory.mktemp("tiny-qwen2")
    model.save_pretrained(path)
    tok.save_pretrained(path)
    backend = SGLangBackend(str(path), tok, engine_kwargs=dict(mem_fraction_static=0.1, dtype="bfloat16",
                                                               disable_cuda_graph=True, random_seed=0))
    yield tok, model, backend
    backend.close()


def enc(tok, text):
    return tok.encode(text, add_special_tokens=False)


def test_token_ids_in_and_out(served):
    tok, _, backend = served
    prefix = enc(tok, "<mem>")
    requests = [GenerationRequest(enc(tok, p) + prefix, 12, len(prefix)) for p in ("a prompt", "another one here")]
    first = backend.generate(requests, SamplingParams(temperature=0))
    again = backend.generate(requests, SamplingParams(temperature=0))
    assert [o.token_ids for o in first] == [o.token_ids for o in again]
    for output in first:
        assert 1 <= len(output.token_ids) <= 12 and all(0 <= t < len(tok) for t in output.token_ids)
    sampled = backend.generate(requests, SamplingParams(temperature=1.0, top_p=0.9, top_k=50))
    assert all(1 <= len(o.token_ids) <= 12 for o in sampled)


def test_sync_weights_and_cutting_an_overgenerated_round(served):
    tok, model, backend = served
    backend.sync_weights(identity_weights(model))
    prompt = enc(tok, "<mem>m</mem><think>t</think><search>q</search>")
    assert tok.decode(prompt[-1:]) == ">"
    request = GenerationRequest(prompt, 6, 0)
    (output,) = backend.generate([request], SamplingParams(temperature=0))
    assert output.token_ids == [prompt[-1]] * 6  # the engine runs on with the new weights (no marker stop)
    # read as the continuation of "...</search", the first ">" closes the action: the cut keeps it only
    cut = cut_round(output.token_ids, backend.token_bytes, prefix_ids=prompt[:-1], max_new_tokens=6)
    assert cut.token_ids == prompt[-1:] and cut.reason == "action" and cut.action == "search"
    backend.sync_weights(model.state_dict())  # back to the random weights


def test_rollout_loop_on_sglang(served, bm25):
    tok, _, backend = served
    config = RolloutConfig(group_size=4, max_new_tokens_per_round=32, max_turns=2, seed=0)
    trajectories = RolloutEngine(backend, tok, retriever=bm25, config=config).run([needle_task(3), needle_task(4)])
    assert len(trajectories) == 8
    for t in trajectories:
        t.validate()
        assert t.rounds and all(r.end - r.start <= 32 + r.prefix_len for r in t.rounds)


# ------------------------------------------------------------------------------------------------
# the colocated engine the trainer builds (mempo.rollout.backends.factory): memory released after a
# rollout, weights loaded back through the update session (begin / update_weights_from_tensor in
# buckets / end), every (ok, message) checked
# ------------------------------------------------------------------------------------------------
def test_factory_engine_releases_memory_and_syncs_through_the_session(tmp_path):
    from mempo.rollout.backends.factory import build_backend
    from mempo.rollout.backends.sglang import SGLangError
    from mempo.config import load_config

    tok = chat_tokenizer()
    model = tiny_qwen2(len(tok), seed=1, hidden=256)
    model.save_pretrained(tmp_path / "m")
    tok.save_pretrained(tmp_path / "m")
    cfg = load_config(None, ["rollout.backend=sglang", "rollout.sglang_mem_fraction=0.1", "model.dtype=bfloat16"])
    backend = build_backend(cfg, model, tok, model_path=str(tmp_path / "m"))
    try:
        assert isinstance(backend, SGLangBackend) and backend.release_memory_enabled
        backend.bucket_bytes = 1 << 20  # several buckets in one session
        prompt = enc(tok, "<mem>m</mem><think>t</think><search>q</search>")
        request = [GenerationRequest(prompt, 6, 0)]
        backend.release_memory()
        assert backend.released == {"kv_cache", "weights"}
        with pytest.raises(SGLangError, match="released and not loaded again"):
            backend.generate(request, SamplingParams(temperature=0))
        backend.sync_weights(identity_weights(model))  # resume weights, session, resume kv cache
        assert not backend.released and not backend.weights_stale
        (output,) = backend.generate(request, SamplingParams(temperature=0))
        assert output.token_ids == [prompt[-1]] * 6  # the synced weights, not the released garbage
    finally:
        backend.close()
