"""mempo.eval.episodes: QA files in Search-R1's parquet layout."""
import pytest

pytest.importorskip("transformers")

from mempo.env.build import build_retriever
from mempo.env.corpus import write_corpus
from mempo.env.data import load_qa_datasets
from mempo.eval import evaluate, qa_eval_episodes
from support.qa_eval import answerable, corpus_documents, make_cfg, reader_backend, unanswerable
from support.rollout_fixtures import chat_tokenizer


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
