"""mempo.serve.agent: the memory loop as a service over the real BM25 retriever (and the real
retrieval server for a retriever that dies): rounds as they finish, round-by-round batching across
requests, per-request options, deadlines, a failing backend or retriever, and the same episodes as
`mempo.eval.evaluate` runs."""
import threading

import pytest

pytest.importorskip("transformers")

from mempo.config import config_from_dict
from mempo.env.data import DataError
from mempo.env.client import HTTPRetriever
from mempo.env.data import make_episode_prompt
from mempo.env.server import RetrieverServer
from mempo.eval import eval_rollout_config, evaluate, round_prompt_tokens
from mempo.serve.agent import AgentOptions, AgentService, DeadlineExceeded, AgentError, ServiceClosed
from support.rollout_fixtures import chat_tokenizer
from support.serve_fixtures import TWO_SEARCHES, FailingBackend, GatedBackend, needle_backend, question


def _cfg(**eval_section):
    return config_from_dict({"env": {"topk": 3, "doc_chars": 300}, "rollout": {"max_new_tokens_per_round": 200},
                             "eval": {"max_turns": 4, **eval_section}})


@pytest.fixture
def tok():
    return chat_tokenizer()


def _service(tok, retriever, backend=None, cfg=None, **options):
    return AgentService.from_config(cfg or _cfg(), None, tok, retriever, backend or needle_backend(tok), **options)


def test_an_episode_searches_reads_and_answers_with_its_rounds(tok, bm25):
    seen = []
    with _service(tok, bm25) as service:
        answer = service.answer(question(3), on_round=seen.append)
    assert answer.answer == "Needle 3" and answer.finish_reason == "answer"
    assert [r.action for r in answer.rounds] == ["search", "answer"] and seen == answer.rounds
    first, last = answer.rounds
    assert first.argument == "zebulon3" and first.tool_ok is True and first.tool_error is None
    assert first.tool_result.startswith("<information>") and "Needle 3" in first.tool_result
    assert first.assistant.startswith("<mem></mem>") and first.memory == ""
    assert last.memory == "zebulon3 is in the document titled Needle 3" and last.tool_result is None
    # token counts are the trajectory's: what `mempo eval` counts
    assert [r.prompt_tokens for r in answer.rounds] == round_prompt_tokens(answer.trajectory)
    assert [r.generated_tokens for r in answer.rounds] == [r.end - r.start for r in answer.trajectory.rounds]
    assert first.tool_tokens == answer.trajectory.rounds[0].tool_end - answer.trajectory.rounds[0].end > 0
    assert answer.prompt_tokens == sum(round_prompt_tokens(answer.trajectory))
    assert answer.trajectory.golds is None  # a served question carries no gold


def test_served_episodes_equal_the_evaluation_s(tok, bm25):
    """The same questions through `evaluate` and the service: the same rounds, ids and answers."""
    cfg = _cfg(policies=["memory"])
    # as `mempo eval` lays out a question of QA files (`user_turn`: the "numbered" layout)
    episodes = [{"id": f"q{i}", "prompt": make_episode_prompt([question(i)]), "golds": [f"Needle {i}"]}
                for i in (2, TWO_SEARCHES)]
    report = evaluate(None, tok, {1: episodes}, bm25, cfg, backend=needle_backend(tok), show_progress=False,
                      log=lambda line: None, keep_trajectories=True)
    evaluated = report.trajectories[("", 1, "memory")]
    assert report.rows[0].em == 1.0
    with _service(tok, bm25, cfg=cfg) as service:
        assert service.config == eval_rollout_config(cfg, "memory")
        for episode, expected in zip(episodes, evaluated):
            served = service.answer(question(int(episode["id"][1:]))).trajectory  # the question as typed
            assert served.response_ids == expected.response_ids and served.prompt_ids == expected.prompt_ids
            assert [r.prompt_ids for r in served.rounds] == [r.prompt_ids for r in expected.rounds]
            assert served.final_answer == expected.final_answer and served.finish_reason == expected.finish_reason
    assert len(evaluated[1].rounds) == 3


def test_requests_share_batches_round_by_round(tok, bm25):
    """A and B arrive together and share their first batch; C, sent when A's first round ends, joins
    A's second round; B (one search) is answered while A (two searches) still runs."""
    backend = needle_backend(tok)
    with _service(tok, bm25, backend=backend, gather_s=0.05) as service:
        tickets = {}

        def after_round(round_):
            if round_.index == 0 and "c" not in tickets:
                tickets["c"] = service.submit(question(5))

        tickets["a"] = service.submit(question(TWO_SEARCHES), on_round=after_round)
        tickets["b"] = service.submit(question(1))
        answers = {name: tickets[name].result(30) for name in ("a", "b")}
        answers["c"] = tickets["c"].result(30)
    assert {k: a.answer for k, a in answers.items()} == {"a": "Needle 7", "b": "Needle 1", "c": "Needle 5"}
    sizes = [len(call) for call in backend.calls]
    assert sizes[0] == 2  # A and B together
    assert max(sizes[1:]) >= 2 and sum(sizes) == 3 + 2 + 2  # C rode along with A's later rounds
    assert answers["b"].seconds < answers["a"].seconds
    assert list(service.batch_sizes) == sizes and service.generation_batches == len(sizes)
    assert service.generated_rounds == sum(sizes)


def test_request_options_and_their_bounds(tok, bm25):
    with _service(tok, bm25, max_turns_limit=6) as service:
        one = service.answer(question(2), AgentOptions(max_turns=1))
        assert one.finish_reason == "turn_limit" and len(one.rounds) == 1 and one.answer is None
        short = service.answer(question(2), AgentOptions(max_new_tokens=3))
        assert short.rounds[0].generated_tokens == len(service.engine.chat.prefix_ids) + 3  # <mem> and 3 ids
        assert short.rounds[0].stop_reason == "length" and short.finish_reason == "malformed"
        for bad in (AgentOptions(max_turns=7), AgentOptions(max_turns=0), AgentOptions(temperature=-1.0),
                    AgentOptions(top_p=0.0), AgentOptions(max_new_tokens=True)):
            with pytest.raises(ValueError):
                service.submit(question(2), bad)
        with pytest.raises(ValueError, match="empty"):
            service.submit("   ")
        # issue 47: the check of a QA file's question (lines apart): a lone surrogate reached the
        # tokenizer (a TypeError), a question of any length was taken
        for bad, reason in (("Who is \ud800 here?", "is not encodable text"),
                            ("why " * 1100, "4400 characters long; the limit is 4096")):
            with pytest.raises(DataError, match=reason):
                service.submit(bad)
        assert service.answer(question(3) + "\n(two lines)").answer == "Needle 3"
        assert service.answer(question(4), AgentOptions(temperature=0.7, top_p=0.9)).answer == "Needle 4"


def test_deadline_failing_backend_and_close(tok, bm25):
    gated = GatedBackend(needle_backend(tok))
    with _service(tok, bm25, backend=gated, deadline_s=0.2) as service:
        ticket = service.submit(question(2))
        assert gated.entered.wait(10)
        threading.Timer(0.4, gated.gate.set).start()  # the batch ends after the deadline
        with pytest.raises(DeadlineExceeded, match="deadline"):
            ticket.result(30)
        assert service.answer(question(3), AgentOptions(deadline_s=30)).answer == "Needle 3"  # still serving
    failing = FailingBackend(needle_backend(tok))
    with _service(tok, bm25, backend=failing) as service:
        with pytest.raises(AgentError, match="generation failed: RuntimeError: the GPU fell off the bus"):
            service.answer(question(2))
        assert service.answer(question(2)).answer == "Needle 2"
    gated = GatedBackend(needle_backend(tok))
    service = _service(tok, bm25, backend=gated)
    ticket = service.submit(question(2))
    assert gated.entered.wait(10)
    threading.Timer(0.2, gated.gate.set).start()
    service.close()
    with pytest.raises(ServiceClosed):
        ticket.result(10)
    with pytest.raises(ServiceClosed):
        service.submit(question(2))


def test_a_retriever_that_dies_is_a_tool_error_in_the_rounds(tok, bm25):
    server = RetrieverServer(bm25).start()
    retriever = HTTPRetriever(server.url, retries=0, timeout=2)
    with _service(tok, retriever) as service:
        assert service.answer(question(6)).rounds[0].tool_ok is True
        server.stop()  # the retriever goes away between two requests' searches
        answer = service.answer(question(6))
    first = answer.rounds[0]
    assert first.action == "search" and first.tool_ok is False and "Error" in first.tool_result
    assert first.tool_error and answer.answer == "Needle 6"  # the scripted agent answers anyway


def test_an_unexpected_error_fails_the_requests_not_the_service(tok, bm25):
    """A backend answering garbage (ids that are not ids) breaks the loop's step: the requests of that
    pass fail with an AgentError naming it, and the model thread goes on serving."""
    from mempo.rollout.backends.base import GenerationOutput

    class Garbage:
        name, calls = "garbage", 0

        def generate(self, requests, sampling):
            self.calls += 1
            if self.calls == 1:
                return [GenerationOutput(None) for _ in requests]
            return needle_backend(tok).generate(requests, sampling)

        def sync_weights(self, weights=None):
            """Nothing to load."""

    with _service(tok, bm25, backend=Garbage()) as service:
        with pytest.raises(AgentError, match="internal error: TypeError"):
            service.answer(question(2))
        assert service.answer(question(2)).answer == "Needle 2"
