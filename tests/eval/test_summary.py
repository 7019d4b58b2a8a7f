"""mempo.eval.summary: a cell's row from trajectories."""
import math

import pytest

from mempo.eval import summarize


def test_summarize_empty_is_finite():
    row = summarize([], 2, "memory")
    assert row.episodes == 0 and row.em == 0.0 and row.peak_prompt_tokens == 0


def test_eval_rows_carry_standard_errors():
    class T:
        def __init__(self, em):
            self.outcome, self.rounds, self.prompt_ids, self.response_mask = {"em": em, "f1": em}, [], [1], [1]
            self.finish_reason = "answer"

        def looped(self):
            return False

    row = summarize([T(1.0), T(0.0), T(1.0), T(0.0)], 2, "memory")
    assert row.em == 0.5 and row.em_se == pytest.approx(math.sqrt(1 / 3 / 4))
    assert summarize([T(1.0)], 2, "memory").em_se == 0.0


def test_the_row_says_how_many_answers_came_with_a_question_pending():
    """``answered_pending``: the share of answered episodes whose answer came before some objective's gold
    was read (`Trajectory.answered_pending`), None where nothing could be judged."""
    from support.rollout_fixtures import chat_tokenizer, text_trajectory

    tok = chat_tokenizer()
    golds = [["Paris"], ["Nefu"]]
    searched = ("q", "<search>a</search>", "<information>Tamor lives in Paris.</information>")
    second = ("Paris", "<search>b</search>", "<information>Bevat studied at Nefu.</information>")
    both = text_trajectory(tok, "Where, which university?",
                           [searched, second, ("Paris Nefu", "<answer>Paris; Nefu</answer>", None)], golds)
    early = text_trajectory(tok, "Where, which university?", [searched, ("Paris", "<answer>Paris; x</answer>", None)],
                            golds)
    unanswered = text_trajectory(tok, "Where, which university?", [searched], golds)
    for t, answer in ((both, "Paris; Nefu"), (early, "Paris; x"), (unanswered, None)):
        t.final_answer, t.outcome = answer, {"em": 0.0}
    assert summarize([both, early, unanswered], 2, "memory", tokenizer=tok).answered_pending == 0.5
    assert summarize([both, early], 2, "memory").answered_pending is None  # no tokenizer: results not read
    assert summarize([unanswered], 2, "memory", tokenizer=tok).answered_pending is None  # nothing answered


def test_the_row_says_how_many_episodes_ended_in_a_loop():
    from support.rollout_fixtures import chat_tokenizer, text_trajectory

    tok = chat_tokenizer()
    search = ("Q1: ?", "<search>a</search>", "<information>nothing</information>")
    stuck = text_trajectory(tok, "Where?", [search, search], [["Paris"]])
    slow = text_trajectory(tok, "Where?", [search, ("Q1: ? ?", "<search>b</search>", None)], [["Paris"]])
    for t in (stuck, slow):
        t.finish_reason, t.outcome = "turn_limit", {"em": 0.0}
    assert summarize([stuck, slow], 1, "memory").looped == 0.5
