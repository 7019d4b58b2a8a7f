"""mempo.eval.run on QA files: rows per dataset and k, the episode records file, no gold in any
request, BM25 and HTTP retrievers (the reader agent and the files: `support.qa_eval`)."""
import contextlib
import http.server
import json
import threading
from dataclasses import fields

import pytest

pytest.importorskip("transformers")

from mempo.env.bm25 import BM25Retriever
from mempo.env.build import build_retriever
from mempo.env.retriever import Retriever, RetrieverUnavailableError
from mempo.protocol.tags import TAG_SET
from mempo.eval import EpisodeRecord, EvalReport, evaluate, qa_eval_episodes, render_episode
from mempo.rollout.backends.base import GenerationRequest
from mempo.records.trajectory import Trajectory
from support.qa_eval import UNFINDABLE, Recording, corpus_documents, expected_em, make_cfg, reader_backend
from support.rollout_fixtures import chat_tokenizer


def test_rows_per_dataset_and_k_with_two_data_sources(tmp_path, qa_files):
    tok = chat_tokenizer()
    cfg = make_cfg(tmp_path, qa_files)
    sets = qa_eval_episodes(cfg)
    assert list(sets.datasets) == ["alpha", "beta", "mixed"]
    assert sets.datasets["beta"] == {"questions": 3, "files": [str(qa_files[0])]}
    for (dataset, k), episodes in sets.episodes.items():
        assert len(episodes) == 4 and all(len(e.questions) == k == len(set(e.source_ids)) for e in episodes)
        prefix = {"alpha": "a", "beta": "u"}.get(dataset)
        assert all(s.startswith(prefix) for e in episodes for s in e.source_ids) if prefix else True
    report = evaluate(None, tok, sets.episodes, build_retriever(cfg), cfg, backend=reader_backend(tok),
                      show_progress=False, log=lambda line: None, keep_trajectories=True)
    assert [(r.dataset, r.objectives, r.policy) for r in report.rows] == [
        (d, k, p) for d in ("alpha", "beta", "mixed") for k in (1, 2) for p in ("memory", "full")]
    for row in report.rows:
        episodes = sets.episodes[(row.dataset, row.objectives)]
        assert row.em == pytest.approx(sum(map(expected_em, episodes)) / len(episodes))
        assert row.format_rate == 1.0 and row.answer_rate == 1.0 and row.episodes == 4
        assert row.mean_turns == row.objectives + 1  # one search per question, then the answer
        trajectories = report.trajectories[(row.dataset, row.objectives, row.policy)]
        assert [t.episode_id for t in trajectories] == [e.id for e in episodes]
        assert row.peak_prompt_tokens > 0 and row.prompt_tokens_per_episode > 0
    assert report.row(2, "memory", "alpha").em == 1.0 and report.row(2, "memory", "beta").em == 0.0
    assert report.row(2, "memory") is None  # rows are per dataset
    scalars = report.scalars()
    assert scalars["eval/alpha/em@k2_memory"] == 1.0 and "eval/em@k2_memory" not in scalars
    # the JSON keeps the dataset of every row
    paths = report.write(tmp_path / "out", "eval")
    loaded = EvalReport.load(paths["json"])
    assert loaded.rows == report.rows and {r["dataset"] for r in json.loads(paths["json"].read_text())["rows"]} \
        == {"alpha", "beta", "mixed"}


def test_trajectory_records_hold_the_rendered_turns_and_the_ids(tmp_path, qa_files):
    tok = chat_tokenizer()
    cfg = make_cfg(tmp_path, qa_files[:1], objectives=[2], episodes=3)
    sets = qa_eval_episodes(cfg)
    path = tmp_path / "out" / "eval_trajectories.jsonl"
    report = evaluate(None, tok, sets.episodes, build_retriever(cfg), cfg, backend=reader_backend(tok),
                      show_progress=False, log=lambda line: None, trajectories_path=path, keep_trajectories=True)
    lines = path.read_text(encoding="utf-8").splitlines()
    assert len(lines) == 2 * 1 * 2 * 3 == report.metadata["trajectories"]["episodes"]  # datasets x k x policies x n
    assert not list(path.parent.glob("*.tmp"))
    records = [EpisodeRecord.from_dict(json.loads(line)) for line in lines]
    for record in records:
        episode = next(e for e in sets.episodes[(record.dataset, 2)] if e.id == record.episode_id)
        assert record.questions == episode.questions and record.golds == episode.golds
        assert record.user == episode.prompt and record.system == "You are a helpful assistant."
        assert len(record.rounds) == 3 and record.rounds[-1].action == "answer"
        for r, question in zip(record.rounds[:2], episode.questions):
            assert r.action == "search" and r.action_argument == question and r.assistant.startswith("<mem>")
            assert r.tool_result.startswith("<information>") and r.tool_ok
        assert record.final_answer == "; ".join(record.predictions)
        assert record.em == expected_em(episode) and record.format_ok
        # the ids read back as a trajectory; the memory policy records each round's exact prompt
        trajectory = Trajectory.from_dict(record.trajectory)
        kept = next(t for t in report.trajectories[(record.dataset, 2, record.policy)]
                    if t.episode_id == record.episode_id)
        assert trajectory.response_ids == kept.response_ids
        for r, kept_round in zip(record.rounds, kept.rounds):
            if record.policy == "memory":
                assert tok.encode(r.prompt, add_special_tokens=False) == kept_round.prompt_ids
            else:
                assert r.prompt is None
            assert r.prompt_tokens == len(kept.round_context_ids(kept_round))
    # the record of a kept trajectory renders the same without the evaluation
    again = render_episode(kept, episode, tok, dataset=record.dataset, system_prompt=record.system)
    assert again.to_dict() == records[-1].to_dict()


def test_a_failed_evaluation_leaves_no_trajectory_file(tmp_path, qa_files):
    class Failing:
        name = "failing"

        def __init__(self, inner):
            self.inner, self.calls = inner, 0

        def generate(self, requests, sampling):
            self.calls += 1
            if self.calls > 3:  # after the first cells are written
                raise RuntimeError("backend lost")
            return self.inner.generate(requests, sampling)

    tok = chat_tokenizer()
    cfg = make_cfg(tmp_path, qa_files[:1], objectives=[1], episodes=2)
    path = tmp_path / "out" / "t.jsonl"
    with pytest.raises(RuntimeError, match="backend lost"):
        evaluate(None, tok, qa_eval_episodes(cfg).episodes, build_retriever(cfg), cfg,
                 backend=Failing(reader_backend(tok)), show_progress=False, log=lambda line: None,
                 trajectories_path=path)
    assert sorted(p.name for p in path.parent.iterdir()) == []


def test_no_gold_reaches_generation(tmp_path, qa_files):
    """Every request holds ids only; none decodes to an unanswerable gold (absent from the corpus
    and the questions); the first round of an episode, before any retrieval, holds no gold at all."""
    tok = chat_tokenizer()
    cfg = make_cfg(tmp_path, qa_files)
    sets = qa_eval_episodes(cfg)
    backend = Recording(reader_backend(tok))
    evaluate(None, tok, sets.episodes, build_retriever(cfg), cfg, backend=backend, show_progress=False,
             log=lambda line: None)
    assert {f.name for f in fields(GenerationRequest)} <= {"key", "prompt_ids", "max_new_tokens", "prefix_len",
                                                           "stop_token_ids", "tags"}
    assert all(request.tags == TAG_SET for request in backend.requests)  # the protocol's tags: no episode data
    golds = {alias for episodes in sets.episodes.values() for e in episodes for aliases in e.golds
             for alias in aliases}
    assert len(backend.requests) > 100
    for request in backend.requests:
        text = tok.decode(request.prompt_ids)
        assert not UNFINDABLE.search(text)
        if "Doc 1 (ID:" not in text:  # nothing retrieved yet
            assert not any(gold in text for gold in golds)


# ------------------------------------------------------------------------------------------------
# retrievers
# ------------------------------------------------------------------------------------------------
def test_http_retriever_gives_the_numbers_of_in_process_bm25(tmp_path, qa_files):
    """The real retrieval server on a loopback port (`env.retriever: http`) gives the same rows as
    BM25 in-process over the same corpus."""
    from mempo.env.client import HTTPRetriever
    from mempo.env.server import RetrieverServer

    tok = chat_tokenizer()
    local = make_cfg(tmp_path, qa_files, policies=["memory"])
    sets = qa_eval_episodes(local)
    expected = evaluate(None, tok, sets.episodes, build_retriever(local), local, backend=reader_backend(tok),
                        show_progress=False, log=lambda line: None)
    with RetrieverServer(BM25Retriever.build(corpus_documents())) as server:
        remote = make_cfg(tmp_path, qa_files, policies=["memory"], retriever="http", retriever_url=server.url,
                          corpus_path=None)
        retriever = build_retriever(remote)
        assert isinstance(retriever, HTTPRetriever) and retriever.base_url == server.url
        report = evaluate(None, tok, qa_eval_episodes(remote).episodes, retriever, remote,
                          backend=reader_backend(tok), show_progress=False, log=lambda line: None)
    strip = lambda rows: [{k: v for k, v in vars(r).items() if k != "seconds"} for r in rows]  # noqa: E731
    assert strip(report.rows) == strip(expected.rows)


class _SearchR1Handler(http.server.BaseHTTPRequestHandler):
    """Search-R1's retrieval_server.py API, nothing more: POST /retrieve; no /health, no /access."""

    retriever = None

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if self.path != "/retrieve":
            return self._send(404, {"detail": "Not Found"})
        result = [[{"document": {"id": hit.doc_id, "contents": f'"{hit.title}"\n{hit.text}'}, "score": hit.score}
                   for hit in hits] for hits in self.retriever.search(body["queries"], body.get("topk", 3))]
        self._send(200, {"result": result})

    def do_GET(self):
        self._send(404, {"detail": "Not Found"})

    def _send(self, status, obj):
        data = json.dumps(obj).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


@contextlib.contextmanager
def search_r1_server(retriever):
    handler = type("Handler", (_SearchR1Handler,), {"retriever": retriever})
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join()


def test_a_search_r1_server_works_as_is(tmp_path, qa_files):
    tok = chat_tokenizer()
    with search_r1_server(BM25Retriever.build(corpus_documents())) as url:
        cfg = make_cfg(tmp_path, qa_files[:1], policies=["memory"], retriever="http", retriever_url=url,
                       corpus_path=None)
        sets = qa_eval_episodes(cfg)
        report = evaluate(None, tok, sets.episodes, build_retriever(cfg), cfg, backend=reader_backend(tok),
                          show_progress=False, log=lambda line: None)
    assert [(r.dataset, r.objectives, r.em) for r in report.rows] == [
        ("alpha", 1, 1.0), ("alpha", 2, 1.0), ("beta", 1, 0.0), ("beta", 2, 0.0)]


def test_a_random_hf_model_is_told_no_gold(tmp_path, qa_files, model_dir):
    """The real HF backend of a tiny random Qwen2 over BM25: finite numbers, and no request decodes
    to a gold that retrieval cannot have shown (the unanswerable ones)."""
    import math

    from mempo.model.loading import load_model_dir
    from mempo.rollout.backends import make_backend

    model, tok = load_model_dir(model_dir)
    cfg = make_cfg(tmp_path, qa_files, objectives=[1, 2], episodes=2, max_turns=3)
    sets = qa_eval_episodes(cfg)
    backend = Recording(make_backend("hf", model=model, tokenizer=tok))
    report = evaluate(model, tok, sets.episodes, build_retriever(cfg), cfg, backend=backend, max_new_tokens=12,
                      show_progress=False, log=lambda line: None)
    assert len(report.rows) == 12 and len(backend.requests) >= 24
    for row in report.rows:
        assert all(math.isfinite(v) for v in vars(row).values() if isinstance(v, float))
    for request in backend.requests:
        assert not UNFINDABLE.search(tok.decode(request.prompt_ids))


class _FailingRetriever(Retriever):
    """Every call fails, as against a server whose /health answers and /retrieve returns HTTP 500."""

    def num_docs(self):
        return 1

    def search(self, queries, topk=3):
        raise RetrieverUnavailableError("retriever at http://x/retrieve answered HTTP 500")

    def access(self, doc_id, page=0, page_chars=None):
        raise RetrieverUnavailableError("retriever at http://x/access answered HTTP 500")


def test_failed_tool_calls_are_counted_warned_and_written(tmp_path, qa_files):
    """Issue 21, case 1: every call failing used to give "EM 0.000, format 1.00" and no word about it."""
    tok = chat_tokenizer()
    cfg = make_cfg(tmp_path, qa_files[:1], policies=["memory"], objectives=[1])
    lines = []
    report = evaluate(None, tok, qa_eval_episodes(cfg).episodes, _FailingRetriever(), cfg,
                      backend=reader_backend(tok), show_progress=False, log=lines.append)
    assert all(r.tool_calls > 0 and r.failed_tool_calls == r.tool_calls for r in report.rows), report.rows
    assert report.all_tool_calls_failed()
    warnings = [line for line in lines if "tool calls failed" in line]
    assert len(warnings) == len(report.rows) and all("_FailingRetriever" in line for line in warnings)
    assert "every tool call failed" in lines[-1] and "_FailingRetriever" in lines[-1]
    paths = report.write(tmp_path / "out", "eval")
    rows = json.loads(paths["json"].read_text())["rows"]
    assert all(r["failed_tool_calls"] == r["tool_calls"] > 0 for r in rows)
    assert "| failed calls |" in paths["markdown"].read_text()
    # the same run against the working retriever: calls counted, none failed, no warning
    lines.clear()
    good = evaluate(None, tok, qa_eval_episodes(cfg).episodes, build_retriever(cfg), cfg,
                    backend=reader_backend(tok), show_progress=False, log=lines.append)
    assert all(r.tool_calls > 0 and r.failed_tool_calls == 0 for r in good.rows)
    assert not good.all_tool_calls_failed() and not any("failed" in line for line in lines)
