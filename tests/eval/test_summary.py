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

    row = summarize([T(1.0), T(0.0), T(1.0), T(0.0)], 2, "memory")
    assert row.em == 0.5 and row.em_se == pytest.approx(math.sqrt(1 / 3 / 4))
    assert summarize([T(1.0)], 2, "memory").em_se == 0.0
