"""The SGLang path on CPU: request/response mapping, the weight-update session, every status checked,
memory release around the trainer's stages, the server backend over HTTP, and the config factory.

sglang itself cannot run here (it needs a CUDA GPU and is not installed): these tests run against
the stand-ins of tests/support/sglang_standin.py, which follow the API read in SGLang's source and
generate with a real tiny Qwen2. The real engine is exercised by tests/rollout/backends/test_sglang.py
(``gpu`` tier, skipped here with its reason).
"""
import copy

import pytest
import torch

from support.sglang_standin import NO_SESSION, StandInEngine, StandInServer
from mempo.rollout.backends import GenerationRequest, HFBackend, SamplingParams
from mempo.rollout.backends.factory import build_backend, sglang_installed
from mempo.rollout.backends.sglang import (
    SGLangBackend, SGLangError, SGLangServerBackend, check_status, weight_buckets,
)
from mempo.config import ConfigError, load_config
from support.rollout_fixtures import chat_tokenizer, tiny_qwen2
from support.paths import REPO

TINY = REPO / "configs" / "tiny.yaml"


@pytest.fixture(scope="module")
def tok():
    return chat_tokenizer()


@pytest.fixture
def model(tok):
    torch.manual_seed(0)
    return tiny_qwen2(len(tok), seed=0)


def enc(tok, text):
    return tok.encode(text, add_special_tokens=False)


def _different_weights(model):
    other = copy.deepcopy(model)
    with torch.no_grad():
        for p in other.parameters():
            p.add_(0.5)
    return other.state_dict()


def test_check_status_accepts_the_reply_forms_and_raises_with_sglang_message():
    assert check_status((True, "Success"), "x") == "Success"
    assert check_status({"success": True, "message": "ok", "num_paused_requests": 0}, "x") == "ok"
    with pytest.raises(SGLangError, match="update_weights_from_tensor failed: " + NO_SESSION[:30]):
        check_status((False, NO_SESSION), "update_weights_from_tensor")
    with pytest.raises(SGLangError, match="failed: disk"):
        check_status({"success": False, "message": "disk"}, "update_weights_from_disk")
    with pytest.raises(SGLangError, match="unexpected reply None"):
        check_status(None, "begin_weight_update")


def test_requests_and_outputs_map_to_sglang(tok, model):
    engine = StandInEngine(model, tok)
    backend = SGLangBackend(tokenizer=tok, engine=engine)
    prefix = enc(tok, "<mem>")
    requests = [GenerationRequest(enc(tok, "a prompt") + prefix, 7, len(prefix), (3,)),
                GenerationRequest(enc(tok, "another one") + prefix, 5, len(prefix), ())]
    outputs = backend.generate(requests, SamplingParams(temperature=0.7, top_p=0.9, top_k=0, seed=3))
    first, second = engine.last_sampling_params
    assert first["max_new_tokens"] == 7 and second["max_new_tokens"] == 5
    assert first["temperature"] == 0.7 and first["top_p"] == 0.9 and first["top_k"] == -1
    assert first["skip_special_tokens"] is False and first["no_stop_trim"] is True and "sampling_seed" not in first
    assert 3 in first["stop_token_ids"] and set(backend.action_stop_ids) <= set(second["stop_token_ids"])
    expected = HFBackend(model, tok).generate(requests, SamplingParams(temperature=0))  # greedy reference below
    greedy = backend.generate(requests, SamplingParams(temperature=0))
    assert [o.token_ids for o in greedy] == [o.token_ids for o in expected]
    assert all(1 <= len(o.token_ids) <= r.max_new_tokens for o, r in zip(outputs, requests))
    assert all(o.finish_reason in ("stop", "length") for o in outputs)
    seeded = SGLangBackend(tokenizer=tok, engine=engine, seed_requests=True)
    seeded.generate(requests, SamplingParams(temperature=1.0, seed=11))
    assert [p["sampling_seed"] for p in engine.last_sampling_params] == [11, 12]
    # return_logprob: the engine's output_token_logprobs become each output's logprobs
    assert engine.last_return_logprob is True and backend.returns_logprobs
    for output in outputs:
        assert len(output.logprobs) == len(output.token_ids)
        want = [e[0] for e in output.metadata["meta_info"]["output_token_logprobs"]]
        assert output.logprobs == want and max(want) < 0


def test_output_token_logprobs_must_be_for_the_output_ids(tok):
    from mempo.rollout.backends.sglang import outputs_from_results

    request = GenerationRequest([1, 2], 5, 0, (9,))
    meta = {"finish_reason": {"type": "length"}, "output_token_logprobs": [[-0.5, 4, None], [-1.5, 5, None]]}
    (out,) = outputs_from_results([request], [{"output_ids": [4, 5], "meta_info": meta}])
    assert out.logprobs == [-0.5, -1.5]
    with pytest.raises(SGLangError, match="output_token_logprobs are for other ids"):
        outputs_from_results([request], [{"output_ids": [4, 6], "meta_info": meta}])
    (plain,) = outputs_from_results([request], [{"output_ids": [4], "meta_info": {}}])
    assert plain.logprobs is None  # a reply without them (return_logprob not honoured)


def test_a_trimmed_stop_id_is_put_back_and_a_text_reply_is_refused(tok):
    from mempo.rollout.backends.sglang import outputs_from_results

    request = GenerationRequest([1, 2], 5, 0, (9,))
    (out,) = outputs_from_results([request], [{"output_ids": [4, 5], "meta_info": {"finish_reason":
                                                                                   {"type": "stop", "matched": 9}}}])
    assert out.token_ids == [4, 5, 9] and out.finish_reason == "stop" and out.logprobs is None
    with pytest.raises(SGLangError, match="skip-tokenizer-init"):
        outputs_from_results([request], [{"text": "hello", "meta_info": {}}])
    with pytest.raises(SGLangError, match="2 results for 1 requests"):
        outputs_from_results([request], [{"output_ids": []}, {"output_ids": []}])


def test_weight_sync_goes_through_the_session_in_buckets(tok, model):
    engine = StandInEngine(copy.deepcopy(model), tok)
    backend = SGLangBackend(tokenizer=tok, engine=engine, bucket_bytes=4096)
    weights = _different_weights(model)
    backend.sync_weights(weights)
    kinds = [e[0] for e in engine.events]
    assert kinds[0] == "begin_weight_update" and kinds[-1] == "end_weight_update"
    updates = [e for e in engine.events if e[0] == "update_weights_from_tensor"]
    assert len(updates) == len(weight_buckets(weights, 4096)) > 1
    assert [flush for _, _, flush in updates] == [False] * (len(updates) - 1) + [True]  # flush with the last
    assert [n for _, names, _ in updates for n in names] == list(weights)
    for name, tensor in engine.model.state_dict().items():
        assert torch.equal(tensor, weights[name]), name
    # the update alone (what the backend did before) is refused by a session-gated engine
    assert engine.update_weights_from_tensor(list(weights.items())) == (False, NO_SESSION)


def test_every_status_is_checked_and_the_session_is_closed(tok, model):
    weights = model.state_dict()
    failing = StandInEngine(copy.deepcopy(model), tok, fail_update="shape mismatch in lm_head.weight")
    with pytest.raises(SGLangError, match="update_weights_from_tensor .*failed: shape mismatch in lm_head.weight"):
        SGLangBackend(tokenizer=tok, engine=failing).sync_weights(weights)
    assert failing.events[-1] == ("end_weight_update",) and not failing.session_open
    refused = StandInEngine(copy.deepcopy(model), tok, fail_begin="staged weight updates are enabled")
    with pytest.raises(SGLangError, match="begin_weight_update failed: staged weight updates are enabled"):
        SGLangBackend(tokenizer=tok, engine=refused).sync_weights(weights)
    assert [e[0] for e in refused.events] == ["begin_weight_update"]
    ending = StandInEngine(copy.deepcopy(model), tok, fail_end="quant finalize failed")
    with pytest.raises(SGLangError, match="end_weight_update failed: quant finalize failed"):
        SGLangBackend(tokenizer=tok, engine=ending).sync_weights(weights)
    old = StandInEngine(copy.deepcopy(model), tok, session_api=False)  # an engine before the session API
    SGLangBackend(tokenizer=tok, engine=old).sync_weights(_different_weights(model))
    assert [e[0] for e in old.events] == ["update_weights_from_tensor"]


def test_memory_is_released_after_rollout_and_resumed_around_the_weight_load(tok, model):
    engine = StandInEngine(copy.deepcopy(model), tok)
    backend = SGLangBackend(tokenizer=tok, engine=engine, release_memory=True)
    request = [GenerationRequest(enc(tok, "a prompt"), 4, 0)]
    before = backend.generate(request, SamplingParams(temperature=0))
    backend.release_memory()
    assert engine.released == {"kv_cache", "weights"}
    with pytest.raises(SGLangError, match="released and not loaded again"):
        backend.generate(request, SamplingParams(temperature=0))
    engine.events.clear()
    backend.sync_weights(model.state_dict())
    assert [e[:2] if e[0].endswith("occupation") else e[:1] for e in engine.events] == [
        ("resume_memory_occupation", ("weights",)), ("begin_weight_update",), ("update_weights_from_tensor",),
        ("end_weight_update",), ("resume_memory_occupation", ("kv_cache",))]
    assert [o.token_ids for o in backend.generate(request, SamplingParams(temperature=0))] == \
        [o.token_ids for o in before]
    SGLangBackend(tokenizer=tok, engine=engine).release_memory()  # release_memory=False: nothing
    assert not engine.released


def test_a_training_step_on_the_in_process_engine(tmp_path, tok):
    """train_step with an SGLangBackend on the stand-in engine: rollout, release, the trainer's
    stages, then the session sync; afterwards the engine holds exactly the actor's weights."""
    from mempo.train.step import train_step
    from mempo.train.trainer import build_run, step_episodes

    torch.set_num_threads(1)
    cfg = load_config(TINY, ["data.questions_per_step=1", "rollout.group_size=2", "trainer.tensorboard=false",
                             "trainer.progress=false", f"trainer.out_dir={tmp_path}", "rollout.protocol_scaffold=false",
                             "rollout.max_new_tokens_per_round=16", "actor.lr=1e-2",
                             "algorithm.skip_zero_variance_groups=false"])  # update even at reward 0
    run = build_run(cfg)
    engine = StandInEngine(copy.deepcopy(run.model), run.tokenizer)
    run.ctx.backend = SGLangBackend(tokenizer=run.tokenizer, engine=engine, release_memory=True)
    before = {k: v.clone() for k, v in run.model.state_dict().items()}
    result = train_step(run.ctx, step_episodes(run.episodes, 1, 1, seed=0), 1)
    kinds = [e[0] for e in engine.events]
    assert kinds.index("release_memory_occupation") > max(i for i, k in enumerate(kinds) if k == "generate")
    assert kinds[-4:] == ["begin_weight_update", "update_weights_from_tensor", "end_weight_update",
                          "resume_memory_occupation"]
    assert result.metrics["actor/num_tokens"] > 0
    after = run.model.state_dict()
    assert any(not torch.equal(before[k], after[k]) for k in after)
    for name, tensor in engine.model.state_dict().items():
        assert torch.equal(tensor, after[name]), name


def test_server_backend_over_http(tmp_path, tok, model):
    from mempo.model.export import save_model_dir

    save_model_dir(tmp_path / "base", model, tok)
    with StandInServer(copy.deepcopy(model), tok) as server:
        server.engine.model.load_state_dict(_different_weights(model))  # serving something else at first
        backend = SGLangServerBackend(server.url, tok, weights_dir=tmp_path / "versions", model_dir=tmp_path / "base",
                                      save_weights=lambda w, d: save_model_dir(d, model, tok, state_dict=dict(w)))
        assert server.requests[0] == ("/get_model_info", None)
        assert server.requests[1] == ("/update_weights_from_disk", {"model_path": str((tmp_path / "base").resolve())})
        for name, tensor in server.engine.model.state_dict().items():  # now it serves the given model
            assert torch.equal(tensor, model.state_dict()[name]), name
        requests = [GenerationRequest(enc(tok, "a prompt"), 6, 0, (2,)), GenerationRequest(enc(tok, "b"), 3, 0)]
        outputs = backend.generate(requests, SamplingParams(temperature=0))
        path, body = server.requests[-1]
        assert path == "/generate" and body["input_ids"] == [r.prompt_ids for r in requests]
        assert body["return_logprob"] is True and all(len(o.logprobs) == len(o.token_ids) for o in outputs)
        assert [p["max_new_tokens"] for p in body["sampling_params"]] == [6, 3]
        assert [o.token_ids for o in outputs] == \
            [o.token_ids for o in HFBackend(model, tok).generate(requests, SamplingParams(temperature=0))]

        trained = _different_weights(model)
        backend.sync_weights(trained)
        backend.sync_weights(trained)
        assert [p.name for p in (tmp_path / "versions").iterdir()] == ["v000002"]  # v1 removed once v2 loaded
        assert server.requests[-1] == ("/update_weights_from_disk",
                                       {"model_path": str((tmp_path / "versions" / "v000002").resolve())})
        for name, tensor in server.engine.model.state_dict().items():
            assert torch.equal(tensor, trained[name]), name
        server.fail_disk = "Failed to load: out of memory"
        with pytest.raises(SGLangError, match="update_weights_from_disk.*failed: Failed to load: out of memory"):
            backend.sync_weights(trained)
    with pytest.raises(SGLangError, match="no SGLang server answers at"):
        backend.generate(requests, SamplingParams(temperature=0))


def test_factory_follows_the_config(tmp_path, tok, model):
    from mempo.rollout.backends.scaffold import ProtocolScaffold

    hf = build_backend(load_config(None, []), model, tok)
    assert isinstance(hf, HFBackend) and hf.model is model and hf.logits_processors == []
    scaffold = ProtocolScaffold(tok, turns=2)
    scaffolded = build_backend(load_config(None, []), model, tok, logits_processors=[scaffold])
    assert scaffolded.logits_processors == [scaffold]
    sglang = load_config(None, ["rollout.backend=sglang"])
    with pytest.raises(ConfigError, match="^rollout.protocol_scaffold: needs rollout.backend 'hf'"):
        build_backend(sglang, model, tok, logits_processors=[scaffold])
    if not sglang_installed():
        with pytest.raises(ConfigError, match=r"^rollout\.backend: 'sglang' needs the sglang package"):
            build_backend(sglang, model, tok, model_path="some/model")
    with StandInServer(copy.deepcopy(model), tok) as server:
        cfg = load_config(None, ["rollout.backend=sglang", f"rollout.sglang_url={server.url}"])
        remote = build_backend(cfg, model, tok, model_path="builtin-tiny", weights_dir=tmp_path / "w")
        assert isinstance(remote, SGLangServerBackend) and remote.url == server.url
        assert [p for p, _ in server.requests] == ["/get_model_info"]  # builtin-tiny: no checkpoint to load
    with pytest.raises(ConfigError, match=r"^rollout\.sglang_url: no SGLang server answers at"):
        build_backend(cfg, model, tok)


def test_train_step_through_an_sglang_server(tmp_path):
    """`build_run` with rollout.backend=sglang and a server URL: one step; the server then serves
    the actor's weights, loaded from the version the trainer wrote under <out>/sglang_weights."""
    from mempo.train.step import train_step
    from mempo.train.trainer import build_run, step_episodes

    torch.set_num_threads(1)
    base = ["data.questions_per_step=1", "rollout.group_size=2", "trainer.tensorboard=false", "trainer.progress=false",
            "rollout.protocol_scaffold=false", "rollout.max_new_tokens_per_round=16", "actor.lr=1e-2",
            "algorithm.skip_zero_variance_groups=false", f"trainer.out_dir={tmp_path}"]  # update even at reward 0
    probe = build_run(load_config(TINY, base))  # the initial model the server starts with
    with StandInServer(copy.deepcopy(probe.model), probe.tokenizer) as server:
        run = build_run(load_config(TINY, base + ["rollout.backend=sglang", f"rollout.sglang_url={server.url}"]))
        assert isinstance(run.ctx.backend, SGLangServerBackend) and run.eval_backend is run.ctx.backend
        metrics = train_step(run.ctx, step_episodes(run.episodes, 1, 1, seed=0), 1).metrics
        assert any(path == "/generate" for path, _ in server.requests)
        # SGLang rollouts: rollout correction on by default (actor.rollout_is auto), from the server's log-probs;
        # the stand-in serves the actor's own fp32 weights, so the weights are ~1 and the KL ~0
        assert metrics["actor/rollout_is_applied"] == 1.0 and metrics["actor/rollout_is_tokens"] > 0
        assert abs(metrics["actor/rollout_is_mean"] - 1) < 1e-3 and abs(metrics["actor/rollout_kl"]) < 1e-4
        assert (tmp_path / "sglang_weights" / "v000001" / "config.json").is_file()
        for name, tensor in server.engine.model.state_dict().items():
            assert torch.equal(tensor, run.model.state_dict()[name]), name


@pytest.mark.skipif(sglang_installed(), reason="sglang is installed here: the in-process engine can be built")
@pytest.mark.parametrize("command", ["train", "eval"])
def test_cli_refuses_sglang_when_it_is_not_installed(tmp_path, capsys, command, tok, model):
    from mempo.apps.cli import main
    from mempo.model.export import save_model_dir

    torch.set_num_threads(1)
    save_model_dir(tmp_path / "m", model, tok)
    extra = ["--model", str(tmp_path / "m")] if command == "eval" else [f"model.path={tmp_path / 'm'}"]
    code = main([command, "--config", str(TINY), "--out", str(tmp_path / "out"), *extra, "rollout.backend=sglang",
                 "rollout.protocol_scaffold=false", "trainer.tensorboard=false", "trainer.progress=false"])
    err = capsys.readouterr().err
    assert code == 2, err[-2000:]
    assert "rollout.backend: 'sglang' needs the sglang package" in err and "Traceback" not in err
    assert not (tmp_path / "out" / "model").exists()
