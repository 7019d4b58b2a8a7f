"""mempo.serve.openai_api on a loopback port: the real `openai` client (non-streaming, streaming,
strict response validation, its exception per status) and plain HTTP for the error cases; the
agent is the scripted needle agent over the real BM25 retriever (tests/support/serve_fixtures.py)
or a tiny random Qwen2 for batching through the HF backend."""
import gc
import http.client
import json
import logging
import threading
import time
import urllib.parse

import pytest

from mempo.config import config_from_dict
from mempo.env.client import HTTPRetriever
from mempo.env.server import RetrieverServer
from mempo.rollout.backends.factory import hf_backend
from mempo.serve.agent import AgentService
from mempo.serve.openai_api import AgentServer
from support.rollout_fixtures import chat_tokenizer, tiny_qwen2
from support.serve_fixtures import FailingBackend, GatedBackend, needle_backend, question

pytest.importorskip("transformers")
openai = pytest.importorskip("openai")

MODEL = "needle-agent"


def _cfg():
    return config_from_dict({"env": {"topk": 3, "doc_chars": 300}, "rollout": {"max_new_tokens_per_round": 200},
                             "eval": {"max_turns": 4}})


@pytest.fixture(scope="module")
def tok():
    return chat_tokenizer()


@pytest.fixture(scope="module")
def server(tok, bm25):
    service = AgentService.from_config(_cfg(), None, tok, bm25, needle_backend(tok), max_turns_limit=8)
    with AgentServer(service, model_id=MODEL, max_body_bytes=4096) as running:
        yield running
    service.close()


def _client(url, **options):
    return openai.OpenAI(base_url=url + "/v1", **{"api_key": "unused", "max_retries": 0, **options})


def _ask(i):
    return [{"role": "system", "content": "ignored: the agent has its own"}, {"role": "user", "content": question(i)}]


def _post(url, body, headers=None, path="/v1/chat/completions", method="POST"):
    """(status, headers, decoded JSON or text) of one plain HTTP request."""
    parts = urllib.parse.urlsplit(url)
    connection = http.client.HTTPConnection(parts.hostname, parts.port, timeout=30)
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    connection.request(method, path, body=data if method == "POST" else None,
                       headers={"content-type": "application/json", **(headers or {})})
    response = connection.getresponse()
    raw = response.read()
    connection.close()
    try:
        payload = json.loads(raw)
    except ValueError:
        payload = raw.decode()
    return response.status, dict(response.getheaders()), payload


def test_chat_completion_answers_with_its_rounds(server):
    client = _client(server.url, _strict_response_validation=True)
    assert [m.id for m in client.models.list().data] == [MODEL]
    done = client.chat.completions.create(model=MODEL, messages=_ask(3), temperature=0, max_tokens=200)
    assert done.object == "chat.completion" and done.model == MODEL
    choice = done.choices[0]
    assert choice.message.role == "assistant" and choice.message.content == "Needle 3"
    assert choice.finish_reason == "stop"
    agent = done.model_extra["agent"]
    assert agent["finish_reason"] == "answer" and agent["turns"] == 2
    search, answer = agent["rounds"]
    assert search["action"] == "search" and search["argument"] == "zebulon3" and search["tool_ok"] is True
    assert "Needle 3" in search["tool_result"] and answer["memory"].endswith("Needle 3")
    assert done.usage.prompt_tokens == search["prompt_tokens"] + answer["prompt_tokens"]
    assert done.usage.completion_tokens == search["generated_tokens"] + answer["generated_tokens"]
    assert done.usage.total_tokens == done.usage.prompt_tokens + done.usage.completion_tokens
    # content parts, max_turns (extension, through extra_body) and unknown fields ignored
    parts = [{"role": "user", "content": [{"type": "text", "text": question(4)}]}]
    short = client.chat.completions.create(model=MODEL, messages=parts, extra_body={"max_turns": 1, "foo": [1]},
                                           tools=[{"type": "function", "function": {"name": "f"}}], seed=3)
    assert short.choices[0].finish_reason == "length" and short.choices[0].message.content == ""
    assert short.model_extra["agent"]["finish_reason"] == "turn_limit" and short.model_extra["agent"]["turns"] == 1


def test_streaming_sends_each_round_then_the_answer(server):
    client = _client(server.url, _strict_response_validation=True)
    chunks = list(client.chat.completions.create(model=MODEL, messages=_ask(7), stream=True,
                                                 stream_options={"include_usage": True}))
    assert len({c.id for c in chunks}) == 1 and all(c.object == "chat.completion.chunk" for c in chunks)
    assert chunks[0].choices[0].delta.role == "assistant"
    rounds = [c.model_extra["agent_round"] for c in chunks if "agent_round" in (c.model_extra or {})]
    assert [r["action"] for r in rounds] == ["search", "search", "answer"] and [r["index"] for r in rounds] == [0, 1, 2]
    assert all(not c.choices for c in chunks if "agent_round" in (c.model_extra or {}))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "Needle 7"
    finish = [c for c in chunks if c.choices and c.choices[0].finish_reason]
    assert len(finish) == 1 and finish[0].choices[0].finish_reason == "stop"
    assert finish[0].model_extra["agent"]["turns"] == 3
    assert chunks[-1].usage is not None and not chunks[-1].choices
    # the client's stream helper reads the same events into one message
    with client.chat.completions.stream(model=MODEL, messages=_ask(2)) as stream:
        final = stream.get_final_completion()
    assert final.choices[0].message.content == "Needle 2"


def test_bad_requests_get_openai_errors_and_the_server_keeps_serving(server):
    url = server.url
    cases = [
        (b"{not json", 400, None, "invalid_json"),
        (b"[1, 2]", 400, None, None),
        (b"\xff\xfe", 400, None, "invalid_json"),
        ({"model": MODEL}, 400, "messages", None),
        ({"model": MODEL, "messages": []}, 400, "messages", None),
        ({"model": MODEL, "messages": [{"role": "system", "content": "s"}]}, 400, "messages", None),
        ({"model": MODEL, "messages": [{"role": "user", "content": "  "}]}, 400, "messages", None),
        ({"model": MODEL, "messages": [{"content": "x"}]}, 400, "messages[0]", None),
        ({"model": MODEL, "messages": [{"role": "user", "content": 5}]}, 400, "messages[0].content", None),
        # issue 47 S31: a lone surrogate reached the tokenizer, a 500
        ({"model": MODEL, "messages": [{"role": "user", "content": "Who is \ud800 here?"}]}, 400,
         "messages[0].content", None),
        ({"model": MODEL, "messages": [{"role": "user", "content": "ok"},
                                       {"role": "user", "content": [{"type": "text", "text": "\udfff"}]}]}, 400,
         "messages[1].content", None),
        ({"messages": _ask(1)}, 400, "model", None),
        ({"model": "gpt-4o", "messages": _ask(1)}, 404, "model", "model_not_found"),
        ({"model": MODEL, "messages": _ask(1), "temperature": "hot"}, 400, "temperature", None),
        ({"model": MODEL, "messages": _ask(1), "temperature": -1}, 400, "temperature", None),
        ({"model": MODEL, "messages": _ask(1), "max_tokens": 0}, 400, "max_tokens", None),
        ({"model": MODEL, "messages": _ask(1), "max_turns": 9}, 400, "max_turns", None),
        ({"model": MODEL, "messages": _ask(1), "n": 2}, 400, "n", None),
        ({"model": MODEL, "messages": _ask(1), "stream": "yes"}, 400, "stream", None),
        ({"model": MODEL, "messages": _ask(1), "padding": "x" * 5000}, 413, None, "request_too_large"),
    ]
    for body, status, param, code in cases:
        got, headers, payload = _post(url, body)
        assert got == status, (body, payload)
        error = payload["error"]
        assert set(error) == {"message", "type", "param", "code"} and error["message"], payload
        assert error["param"] == param and (code is None or error["code"] == code), (body, payload)
    status, _, payload = _post(url, b"", path="/v1/nowhere", method="GET")
    assert status == 404 and payload["error"]["message"]
    status, _, payload = _post(url, b"", path="/v1/chat/completions", method="GET")
    assert status == 405 and payload["error"]["code"] == "method_not_allowed"
    # the client raises its exception per status; a stream's bad request fails before any chunk
    client = _client(url)
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="other", messages=_ask(1))
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": ""}], stream=True)
    assert _post(url, b"", path="/health", method="GET")[2]["status"] == "ok"
    assert client.chat.completions.create(model=MODEL, messages=_ask(5)).choices[0].message.content == "Needle 5"


def test_in_flight_bound_deadline_agent_failure_and_api_key(tok, bm25):
    gated = GatedBackend(needle_backend(tok))
    service = AgentService.from_config(_cfg(), None, tok, bm25, gated, deadline_s=30)
    with AgentServer(service, model_id=MODEL, max_in_flight=1, api_key="s3cret") as running:
        client = _client(running.url, api_key="s3cret")
        with pytest.raises(openai.AuthenticationError):
            _client(running.url, api_key="wrong").models.list()
        for path in ("/v1/models", "/v1/nowhere"):
            assert _post(running.url, b"", path=path, method="GET")[0] == 401
        assert _post(running.url, b"", path="/health", method="GET")[0] == 200  # no key needed
        first = {}
        thread = threading.Thread(target=lambda: first.update(
            done=client.chat.completions.create(model=MODEL, messages=_ask(2))))
        thread.start()
        assert gated.entered.wait(10)
        status, headers, payload = _post(running.url, {"model": MODEL, "messages": _ask(3)},
                                         headers={"authorization": "Bearer s3cret"})
        assert status == 429 and headers.get("retry-after") == "1"
        assert payload["error"]["type"] == "rate_limit_error"
        with pytest.raises(openai.RateLimitError):
            client.chat.completions.create(model=MODEL, messages=_ask(3))
        gated.gate.set()
        thread.join(30)
        assert first["done"].choices[0].message.content == "Needle 2"
        assert client.chat.completions.create(model=MODEL, messages=_ask(3)).choices[0].message.content == "Needle 3"
    service.close()

    failing = FailingBackend(needle_backend(tok))
    service = AgentService.from_config(_cfg(), None, tok, bm25, failing)
    with AgentServer(service, model_id=MODEL) as running:
        status, headers, payload = _post(running.url, {"model": MODEL, "messages": _ask(2)})
        assert status == 500 and headers.get("x-should-retry") == "false"
        assert "generation failed" in payload["error"]["message"] and payload["error"]["type"] == "server_error"
        assert _post(running.url, {"model": MODEL, "messages": _ask(2)})[0] == 200

    gated = GatedBackend(needle_backend(tok))
    service = AgentService.from_config(_cfg(), None, tok, bm25, gated, deadline_s=0.3)
    with AgentServer(service, model_id=MODEL) as running:
        threading.Timer(0.8, gated.gate.set).start()
        status, headers, payload = _post(running.url, {"model": MODEL, "messages": _ask(2)})
        assert status == 504 and headers.get("x-should-retry") == "false"
        assert payload["error"]["code"] == "deadline_exceeded"
        # a stream's deadline comes in-band, after its 200: the client raises APIError
        gated.gate.clear()
        threading.Timer(0.8, gated.gate.set).start()
        with pytest.raises(openai.APIError, match="deadline"):
            list(_client(running.url).chat.completions.create(model=MODEL, messages=_ask(2), stream=True))
    service.close()


def test_a_retriever_failing_mid_episode_is_a_tool_error_not_a_500(tok, bm25):
    retrieval = RetrieverServer(bm25).start()
    service = AgentService.from_config(_cfg(), None, tok, HTTPRetriever(retrieval.url, retries=0, timeout=2),
                                       needle_backend(tok))
    with AgentServer(service, model_id=MODEL) as running:
        client = _client(running.url)
        retrieval.stop()
        done = client.chat.completions.create(model=MODEL, messages=_ask(4))
        search = done.model_extra["agent"]["rounds"][0]
        assert search["tool_ok"] is False and search["tool_error"] and "Error" in search["tool_result"]
        assert done.choices[0].message.content == "Needle 4"
    service.close()


def test_concurrent_requests_share_hf_generation_batches(tok, bm25):
    import torch

    torch.set_num_threads(1)
    model = tiny_qwen2(len(tok))
    cfg = config_from_dict({"rollout": {"max_new_tokens_per_round": 6}, "eval": {"max_turns": 2}})
    service = AgentService.from_config(cfg, model, tok, bm25, hf_backend(model, tok), gather_s=0.05)
    with AgentServer(service, model_id="tiny") as running:
        client = _client(running.url)
        results = [None] * 6

        def ask(i):
            results[i] = client.chat.completions.create(model="tiny",
                                                        messages=[{"role": "user", "content": question(i)}])

        threads = [threading.Thread(target=ask, args=(i,)) for i in range(6)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
    service.close()
    assert all(r is not None and r.model_extra["agent"]["turns"] >= 1 for r in results)
    assert max(service.batch_sizes) > 1 and len(service.batch_sizes) < sum(r.model_extra["agent"]["turns"]
                                                                            for r in results)


def test_a_client_that_goes_away_cancels_its_episode(tok, bm25, caplog):
    """Streaming and not: the client closes its connection while the first round is generated; the
    episode (three rounds if run out) stops at its next round and leaves the in-flight count, and its
    expected "cancelled" error is not logged as a future's exception never retrieved (issue 47)."""
    caplog.set_level(logging.ERROR, logger="asyncio")
    for stream in (True, False):
        gated = GatedBackend(needle_backend(tok))
        service = AgentService.from_config(_cfg(), None, tok, bm25, gated)
        with AgentServer(service, model_id=MODEL, ping_s=0.05) as running:
            parts = urllib.parse.urlsplit(running.url)
            connection = http.client.HTTPConnection(parts.hostname, parts.port, timeout=30)
            body = {"model": MODEL, "messages": _ask(7), "stream": stream}
            connection.request("POST", "/v1/chat/completions", body=json.dumps(body),
                               headers={"content-type": "application/json"})
            assert gated.entered.wait(10)
            if stream:
                response = connection.getresponse()
                assert response.status == 200 and response.readline().startswith(b"data: ")
            connection.sock.shutdown(2)
            connection.close()
            threading.Timer(1.2, gated.gate.set).start()  # the round ends after the client has gone
            deadline = time.monotonic() + 20
            while _post(running.url, b"", path="/health", method="GET")[2]["in_flight"] and time.monotonic() < deadline:
                time.sleep(0.05)
            assert _post(running.url, b"", path="/health", method="GET")[2]["in_flight"] == 0
            assert sum(service.batch_sizes) < 3, (stream, service.batch_sizes)  # not run to its end
            time.sleep(0.2)  # the server's loop sets its own future after the service failed the episode
            gc.collect()
        service.close()
    assert not [r for r in caplog.records if "never retrieved" in r.getMessage()], caplog.text


def test_a_question_is_laid_out_as_the_config_s_episodes_and_one_it_cannot_hold_is_a_400(tok, bm25):
    cfg = config_from_dict({"env": {"topk": 3, "doc_chars": 300}, "rollout": {"max_new_tokens_per_round": 200},
                            "eval": {"max_turns": 4}, "data": {"source": "synthetic"},
                            "synthetic": {"world_prompt_style": "joined"}})
    service = AgentService.from_config(cfg, None, tok, bm25, needle_backend(tok))
    with AgentServer(service, model_id=MODEL) as running:
        done = _client(running.url).chat.completions.create(model=MODEL, messages=_ask(3))
        assert done.choices[0].message.content == "Needle 3"
        assert done.model_extra["agent"]["rounds"][0]["prompt_tokens"] > 0
        status, _, payload = _post(running.url, {"model": MODEL, "messages": [
            {"role": "user", "content": "1. Which document mentions a; b?\n2. And c?"}]})
        assert status == 400 and payload["error"]["param"] == "messages" and "joined" in payload["error"]["message"]
    service.close()
