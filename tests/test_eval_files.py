"""`mempo eval` on QA files: datasets, MEM1 composition, BM25 / HTTP retrievers, records, report, errors.

The agent here is a rule-based *reader* (`ReaderAgent`, behind
`mempo.synthetic.backend.OracleBackend`'s prompt decoding): it searches each question in turn
and answers with the title of the first search hit. It sees only its prompt (system, question, its
memory, tool results), so it answers a question right exactly when the corpus holds a document
titled with the gold answer that the question's words find: "answerable" questions below. The unanswerable ones have golds that appear nowhere in
the corpus or the questions, which also lets the tests check that no gold reaches generation.
"""
import contextlib
import http.server
import json
import re
import subprocess
import sys
import threading
from dataclasses import fields
from pathlib import Path

import pytest

pytest.importorskip("transformers")

from mempo.env.corpus import Document, write_corpus
from mempo.env.data import load_qa_datasets, parse_episode_prompt
from mempo.env.build import build_retriever
from mempo.env.retriever import BM25Retriever
from mempo.eval import EpisodeRecord, EvalReport, evaluate, qa_eval_episodes, render_episode
from mempo.protocol.grammar import parse_round
from mempo.rollout.backends.base import GenerationRequest
from mempo.synthetic.backend import OracleBackend
from mempo.rollout.trajectory import Trajectory
from mempo.config import ConfigError, config_from_dict
from support.rollout_fixtures import chat_tokenizer

FIRST_NAMES = ["Amberly", "Brannic", "Corvina", "Dastrel", "Elowen", "Fennick", "Galvia", "Horatz"]
LAST_NAMES = ["Quist", "Marrow", "Velde", "Ostrand", "Pellin", "Tarrow", "Ibsk", "Wendle"]
FILLER = ("The archive keeps many old ledgers about harbours, bridges and orchards of the valley. " * 12).strip()


def keeper(i: int) -> str:
    return f"{FIRST_NAMES[i % 8]} {LAST_NAMES[(i * 3 + 1) % 8]}"


def answerable(i: int, source=None) -> dict:
    record = {"id": f"a{i}", "question": f"Who is the keeper of zorvath{i}?", "golden_answers": [keeper(i)]}
    return {**record, "data_source": source} if source else record


def unanswerable(i: int, source=None) -> dict:
    record = {"id": f"u{i}", "question": f"Who is the keeper of blorptang{i}?",
              "golden_answers": [f"Qzxvw Unfindable{i}", f"Unfindable Alias{i}"]}
    return {**record, "data_source": source} if source else record


UNFINDABLE = re.compile(r"qzxvw|unfindable", re.I)


def corpus_documents(n: int = 12) -> list[Document]:
    docs = [Document(f"k{i}", keeper(i), f"{keeper(i)} is the keeper of zorvath{i}. {FILLER}") for i in range(n)]
    return docs + [Document(f"f{i}", f"Ledger {i}", f"Ledger number {i} of the valley. {FILLER}") for i in range(4)]


def write_jsonl(path: Path, records) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return path


class ReaderAgent:
    """Search every question in order; answer each with the first hit's title (module docstring)."""

    def respond(self, messages):
        questions = parse_episode_prompt(messages[1]["content"])
        last = max((i for i, m in enumerate(messages) if m["role"] == "assistant"), default=None)
        found = []
        if last is not None:
            mem = parse_round(messages[last]["content"]).mem or ""
            found = [a for a in mem.split("found:", 1)[-1].split("|") if a.strip()] if "found:" in mem else []
            found = [a.strip() for a in found]
            tool = messages[last + 1]["content"] if last + 1 < len(messages) else ""
            hit = re.search(r"Doc 1 \(ID: [^,]*, Title: ([^)]*)\)", tool)
            found.append(hit.group(1) if hit else "unknown")
        mem = "found: " + " | ".join(found) if found else "nothing found yet"
        if len(found) == len(questions):
            return f"<mem>{mem}</mem>\n<think>\nall found\n</think>\n<answer>{'; '.join(found)}</answer>"
        return (f"<mem>{mem}</mem>\n<think>\nnext question\n</think>\n"
                f"<search>{questions[len(found)]}</search>")


class Recording:
    """A backend wrapper that keeps every generation request it forwards."""

    def __init__(self, inner):
        self.inner, self.requests, self.name = inner, [], "recording"

    def generate(self, requests, sampling):
        self.requests.extend(requests)
        return self.inner.generate(requests, sampling)


def reader_backend(tok):
    return OracleBackend(tok, agent=ReaderAgent())


def make_cfg(tmp_path, files, *, objectives=(1, 2), episodes=4, policies=("memory", "full"), max_turns=8, **env):
    env = {"corpus_path": str(tmp_path / "corpus.jsonl"), "topk": 2, "doc_chars": 500, **env}
    return config_from_dict({"data": {"source": "files", "eval_files": [str(f) for f in files]}, "env": env,
                             "rollout": {"max_new_tokens_per_round": 400},
                             "eval": {"objectives": list(objectives), "episodes": episodes,
                                      "policies": list(policies), "max_turns": max_turns}})


@pytest.fixture()
def qa_files(tmp_path):
    """qa.jsonl: dataset 'alpha' (answerable) and 'beta' (unanswerable) by data_source;
    mixed.jsonl: no data_source, dataset 'mixed' (both kinds); the corpus."""
    write_corpus(tmp_path / "corpus.jsonl", corpus_documents())
    qa = write_jsonl(tmp_path / "qa.jsonl", [answerable(i, "alpha") for i in range(4)]
                     + [unanswerable(i, "beta") for i in range(3)])
    mixed = write_jsonl(tmp_path / "mixed.jsonl", [answerable(i) for i in range(4, 8)] + [unanswerable(i)
                                                                                           for i in range(3, 6)])
    return qa, mixed


def expected_em(episode) -> float:
    """The reader's EM on an episode: the share of its questions that are answerable."""
    return sum(source.startswith("a") for source in episode.source_ids) / len(episode.source_ids)


# ------------------------------------------------------------------------------------------------
# datasets, rows and records
# ------------------------------------------------------------------------------------------------
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


def test_examples_and_the_markdown_report(tmp_path, qa_files):
    tok = chat_tokenizer()
    cfg = make_cfg(tmp_path, qa_files)
    sets = qa_eval_episodes(cfg)
    report = evaluate(None, tok, sets.episodes, build_retriever(cfg), cfg, backend=reader_backend(tok),
                      show_progress=False, log=lambda line: None)
    report.metadata["datasets"] = sets.datasets
    for (dataset, k), examples in report.examples.items():
        episodes = sets.episodes[(dataset, k)]
        has_correct = any(expected_em(e) == 1.0 for e in episodes)
        has_failed = any(expected_em(e) < 1.0 for e in episodes)
        assert (examples.correct is not None) == has_correct and (examples.failed is not None) == has_failed
        if examples.correct is not None:
            assert examples.correct.correct and examples.correct.em == 1.0
        if examples.failed is not None:
            assert not examples.failed.correct
    text = report.markdown("Files")
    assert "### Dataset `alpha` (4 questions from" in text and "#### alpha, k = 2" in text
    alpha = text.split("### Dataset `alpha`")[1].split("### Dataset `beta`")[0]
    assert alpha.count("No failed episode in this table.") == 2 and "A correct episode: `alpha-k1-" in alpha
    beta = text.split("### Dataset `beta`")[1].split("### Dataset `mixed`")[0]
    assert beta.count("No correct episode in this table.") == 2 and "A failed episode: `beta-k2-" in beta
    # an example shows the messages, each round's text, the shortened tool results and the scores
    example = report.examples[("alpha", 2)].correct
    rendered = example.render()
    assert rendered.startswith("[system] You are a helpful assistant.\n[user] Answer the questions below")
    assert "[assistant, turn 1] <mem>nothing found yet</mem>" in rendered
    assert "[search result] <information>Doc 1 (ID: k" in rendered and "more characters]" in rendered
    assert f"[score] EM 1.00, F1 1.00, score 1.00, format ok" in rendered
    assert rendered in text
    assert "A correct episode" not in report.markdown("Files", examples=False)


def test_trajectory_records_hold_the_rendered_turns_and_the_ids(tmp_path, qa_files):
    tok = chat_tokenizer()
    cfg = make_cfg(tmp_path, qa_files[:1], objectives=[2], episodes=3)
    sets = qa_eval_episodes(cfg)
    path = tmp_path / "out" / "eval_trajectories.jsonl"
    report = evaluate(None, tok, sets.episodes, build_retriever(cfg), cfg, backend=reader_backend(tok),
                      show_progress=False, log=lambda line: None, trajectories_path=path, keep_trajectories=True)
    lines = path.read_text(encoding="utf-8").splitlines()
    assert len(lines) == 2 * 1 * 2 * 3 == report.metadata["trajectories"]["episodes"]  # datasets x k x policies x n
    assert not path.with_name(path.name + ".tmp").exists()
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
                                                           "stop_token_ids"}
    golds = {alias for episodes in sets.episodes.values() for e in episodes for aliases in e.golds
             for alias in aliases}
    assert len(backend.requests) > 100
    for request in backend.requests:
        text = tok.decode(request.prompt_ids)
        assert not UNFINDABLE.search(text)
        if "Doc 1 (ID:" not in text:  # nothing retrieved yet
            assert not any(gold in text for gold in golds)


def test_parquet_input_in_search_r1_layout(tmp_path):
    """Search-R1's merged test.parquet: FlashRAG ids repeat across data sources; the golds also sit
    in reward_model.ground_truth.target; the prompt column holds Search-R1's own instruction."""
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    write_corpus(tmp_path / "corpus.jsonl", corpus_documents())
    rows = []
    for source, make, numbers in (("nq", answerable, range(3)), ("bamboogle", unanswerable, range(2))):
        for index, i in enumerate(numbers):
            record = make(i)
            rows.append({"id": f"test_{index}", "question": record["question"],
                         "golden_answers": record["golden_answers"], "data_source": source,
                         "prompt": [{"role": "user", "content": "Answer the given question. " + record["question"]}],
                         "ability": "fact-reasoning",
                         "reward_model": {"style": "rule", "ground_truth": {"target": record["golden_answers"]}},
                         "extra_info": {"split": "test", "index": index}})
    path = tmp_path / "test.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)
    datasets = load_qa_datasets([path])
    assert {name: [r.id for r in d.records] for name, d in datasets.items()} == {
        "nq": ["test_0", "test_1", "test_2"], "bamboogle": ["test_0", "test_1"]}
    tok = chat_tokenizer()
    cfg = make_cfg(tmp_path, [path], objectives=[1, 2], episodes=3, policies=["memory"])
    sets = qa_eval_episodes(cfg)
    report = evaluate(None, tok, sets.episodes, build_retriever(cfg), cfg, backend=reader_backend(tok),
                      show_progress=False, log=lambda line: None)
    assert [(r.dataset, r.objectives, r.em) for r in report.rows] == [
        ("nq", 1, 1.0), ("nq", 2, 1.0), ("bamboogle", 1, 0.0), ("bamboogle", 2, 0.0)]


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


# ------------------------------------------------------------------------------------------------
# the command line
# ------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    """A tiny random Qwen2 and its own byte-level BPE, saved with save_pretrained (a plain HF directory)."""
    from mempo.model.builtin import tiny_model, train_tokenizer

    texts = [f"{d.title}\n{d.text}" for d in corpus_documents()] + [answerable(i)["question"] for i in range(8)]
    tok = train_tokenizer(texts, vocab_size=600)
    path = tmp_path_factory.mktemp("model")
    tiny_model(tok, seed=0).save_pretrained(path)
    tok.save_pretrained(path)
    return path


def test_eval_command_on_files_writes_tables_trajectories_and_report(tmp_path, qa_files, model_dir):
    out = tmp_path / "out"
    command = [sys.executable, "-m", "mempo.apps.cli", "eval", "--model", str(model_dir), "--out", str(out),
               "--no-progress", "eval.objectives=[1,2]", "eval.episodes=2", "eval.max_turns=3",
               "eval.policies=[memory,full]", "rollout.max_new_tokens_per_round=12", "env.doc_chars=200",
               "--data", "files", "--files", str(qa_files[0]), str(qa_files[1]),
               "--corpus", str(tmp_path / "corpus.jsonl")]
    done = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=300)  # the installed package
    assert done.returncode == 0, done.stderr
    report = EvalReport.load(out / "eval.json")
    assert [(r.dataset, r.objectives, r.policy, r.episodes) for r in report.rows] == [
        (d, k, p, 2) for d in ("alpha", "beta", "mixed") for k in (1, 2) for p in ("memory", "full")]
    for row in report.rows:
        assert 0.0 <= row.em <= 1.0 and 1 <= row.mean_turns <= 3 and row.peak_prompt_tokens > 0
    assert report.metadata["data"] == "files" and report.metadata["datasets"]["mixed"]["questions"] == 7
    assert report.metadata["retriever"] == f"bm25 over {tmp_path / 'corpus.jsonl'}"
    markdown = (out / "eval.md").read_text()
    assert markdown.count("### Dataset `") == 3 and markdown.count("| k | policy |") == 6
    # the random model answers nothing right: every table shows a failed episode and says so of the correct one
    assert markdown.count("No correct episode in this table.") + markdown.count("A correct episode") == 6
    assert markdown.count("A failed episode") + markdown.count("No failed episode in this table.") == 6
    assert "[assistant, turn 1] <mem>" in markdown
    lines = (out / "eval_trajectories.jsonl").read_text().splitlines()
    assert len(lines) == 3 * 2 * 2 * 2
    records = [EpisodeRecord.from_dict(json.loads(line)) for line in lines]
    assert all(r.rounds and r.rounds[0].assistant.startswith("<mem>") and r.golds for r in records)
    assert "EM" in done.stdout and "wrote" in done.stdout and "A failed episode" not in done.stdout


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


def _run(args, capsys):
    from mempo.apps.cli import main

    code = main(["eval", *args])
    return code, capsys.readouterr().err


def test_eval_command_errors_name_the_file_or_field(tmp_path, qa_files, capsys):
    model = tmp_path / "model"
    model.mkdir()  # data errors come before the model is loaded
    base = ["--model", str(model), "--out", str(tmp_path / "out"), "--no-progress"]
    corpus = ["--corpus", str(tmp_path / "corpus.jsonl")]
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n\n")
    small = write_jsonl(tmp_path / "small.jsonl", [answerable(i) for i in range(3)])
    cases = [
        (["--files", str(tmp_path / "absent.jsonl"), *corpus], f"data.eval_files: {tmp_path / 'absent.jsonl'}: "
                                                               "QA file not found"),
        (["--files", str(empty), *corpus], f"{empty}: no QA records"),
        (["eval.objectives=[2,5]", "--files", str(small), *corpus],
         "eval.objectives: k=5 needs at least 5 questions per dataset; dataset 'small'"),
        (["--files", str(small)], "env.corpus_path: must name a corpus"),
        (["--files", str(small), "--corpus", str(tmp_path / "nope.jsonl")],
         f"env.corpus_path: {tmp_path / 'nope.jsonl'}: corpus file not found"),
        (["--data", "files", *corpus], "data.eval_files: must list at least one QA file"),
        (["--files", str(small), *corpus, "--retriever-url", "http://127.0.0.1:1"], "not both"),
        (["--data", "synthetic", "--files", str(small)], "data.source: --files lists QA files"),
        (["--files", str(small), "eval.episodes=2", *corpus], "looks like a config override"),
        (["--files", str(small), *corpus], f"--model: {model} holds no saved model"),
    ]
    for args, message in cases:
        overrides = [] if args[0].startswith("eval.") else ["eval.objectives=[1]"]
        code, err = _run([*base, *overrides, *args], capsys)
        last = err.strip().splitlines()[-1]  # progress lines (an index build) may come first
        assert code == 2 and last.startswith("mempo eval: ") and message in last, (args, err)
    bad = write_jsonl(tmp_path / "bad.jsonl", [answerable(0), {"question": "no gold"}])
    code, err = _run([*base, "eval.objectives=[1]", "--files", str(bad), *corpus], capsys)
    assert code == 2 and f"{bad}:2: missing gold answers" in err


def test_an_unreachable_retriever_fails_before_any_episode(tmp_path, qa_files, capsys):
    import socket

    with socket.socket() as probe:  # a free port nobody listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    model = tmp_path / "model"
    model.mkdir()
    code, err = _run(["--model", str(model), "--out", str(tmp_path / "out"), "eval.objectives=[1]",
                      "--files", str(qa_files[0]),
                      "--retriever-url", f"http://127.0.0.1:{port}"], capsys)
    assert code == 2 and (f"mempo eval: env.retriever_url: retriever at http://127.0.0.1:{port} failed its health "
                          "check") in err
    with pytest.raises(ConfigError, match="env.retriever_url"):
        build_retriever(make_cfg(tmp_path, qa_files, retriever="http", retriever_url="ftp://x"))
