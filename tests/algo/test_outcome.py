"""mempo.algo.outcome: the outcome is compute_score of the rollout's protocol text, on new records."""
import dataclasses

import pytest

from mempo.algo.outcome import outcome, score_outcomes
from mempo.protocol.reward import compute_score
from support.rollout_fixtures import trajectory

TEXT = "<mem>m</mem>\n<think>\nt\n</think>\n<answer>\nx\n</answer>"


def test_score_outcomes_makes_scored_copies():
    t = dataclasses.replace(trajectory(golds=["x"]), protocol_text=TEXT)
    (scored,) = score_outcomes([t])
    assert scored is not t and t.outcome == {}  # the rollout's record is not changed
    assert scored.outcome == compute_score(TEXT, ["x"]) and scored.score == 1.0
    assert score_outcomes([t], mode="sum")[0].outcome == compute_score(TEXT, ["x"], mode="sum")
    assert dataclasses.replace(scored, outcome={}) == t


def test_no_golds_no_outcome_and_no_text_is_an_error():
    assert outcome(dataclasses.replace(trajectory(), golds=None)) == {}
    with pytest.raises(ValueError, match="protocol_text"):
        outcome(trajectory())
