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
    assert "[score] EM 1.00, F1 1.00, score 1.00, format ok" in rendered
    assert rendered in text
    assert "A correct episode" not in report.markdown("Files", examples=False)


def test_golds_and_answers_are_shortened_like_the_other_fields():
    """Issue 21, case 7: eval.md printed every gold alias whole (a 100 kB alias list, a 100 kB line)."""
    from mempo.eval import TOOL_RESULT_CHARS, EpisodeRecord, EvalReport, Examples, EvalRow

    golds = [[f"alias number {i} " + "x" * 50 for i in range(2000)]]
    record = EpisodeRecord(dataset="d", objectives=1, policy="memory", episode_id="e0", questions=["q?"], golds=golds,
                           system="s", user="q?", rounds=[], finish_reason="answer", final_answer="y" * 5000,
                           predictions=["y" * 5000], em=0.0, f1=0.0, score=0.0, format_ok=True)
    row = EvalRow(objectives=1, policy="memory", episodes=1, em=0.0, f1=0.0, score=0.0, format_rate=1.0,
                  answer_rate=1.0, mean_turns=1.0, prompt_tokens_per_episode=1.0, peak_prompt_tokens=1,
                  mean_prompt_tokens_per_turn=1.0, generated_tokens_per_episode=1.0, dataset="d")
    text = EvalReport([row], examples={("d", 1): Examples(None, record)}).markdown("t")
    gold_line = next(line for line in text.splitlines() if line.startswith("  1. predicted"))
    assert len(gold_line) < 3 * TOOL_RESULT_CHARS and gold_line.count("more characters]") == 2
    assert "alias number 0 " in gold_line and "alias number 1999" not in text
    assert max(len(line) for line in text.splitlines()) < 2000
