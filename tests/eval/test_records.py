"""mempo.eval.records: the example episodes and the markdown report of an evaluation on QA files."""
import pytest

pytest.importorskip("transformers")

from mempo.env.build import build_retriever
from mempo.eval import evaluate, qa_eval_episodes
from support.qa_eval import expected_em, make_cfg, reader_backend
from support.rollout_fixtures import chat_tokenizer


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
