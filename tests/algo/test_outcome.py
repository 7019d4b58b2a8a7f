"""mempo.algo.outcome: the outcome is compute_score of the rollout's protocol text (EM), its F1, or a user's
reward function named by import path, on new records; a reward that fails is one error naming it."""
import dataclasses

import pytest

from mempo.algo.outcome import OutcomeRewardError, outcome, resolve_outcome_reward, score_outcomes
from mempo.config import ConfigError
from mempo.protocol.reward import compute_score
from mempo.protocol.tags import JSON_TAG_SET
from support import user_tools
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


# ------------------------------------------------------------------------------------------------
# rollout.outcome_reward: F1 and a user's function (tests/support/user_tools.py, by import path)
# ------------------------------------------------------------------------------------------------

TWO = "<mem>m</mem>\n<think>\nt\n</think>\n<answer>Paris; big red Rome</answer>"
BROKEN = "<think>t</think> stray text <answer>Paris; Rome</answer>"


def scored(text, golds=(("Paris",), ("Rome",)), reward="em", example=None, **kwargs):
    t = dataclasses.replace(trajectory(), golds=[list(g) for g in golds] if golds else None, protocol_text=text,
                            example=example)
    return outcome(t, reward=reward, **kwargs)


def test_f1_reward_is_the_mode_aggregate_of_per_objective_f1():
    assert scored(TWO)["score"] == 0.5  # EM: Paris right, "big red rome" wrong
    assert scored(TWO, reward="f1")["score"] == pytest.approx((1.0 + 0.5) / 2)
    assert scored(TWO, reward="f1", mode="sum")["score"] == pytest.approx(1.5)
    assert scored(BROKEN, reward="f1")["score"] == 0.0  # the format gate applies to every reward


def test_a_users_reward_reads_the_answer_and_the_example():
    user_tools.REWARD_CALLS.clear()
    example = {"id": "e1", "golds": [["Paris"], ["Rome"]], "questions": ["a?", "b?"], "source": "atlas"}
    result = scored(TWO, reward="support.user_tools:overlap_reward", example=example)
    assert result["score"] == result["reward"] == 1.0 and result["em"] == 0.5  # EM stays a diagnostic
    assert user_tools.REWARD_CALLS == [("Paris; big red Rome", example)]
    assert scored(BROKEN, reward=user_tools.overlap_reward, example=example)["score"] == 0.0
    # no example given: the golds and the episode id
    user_tools.REWARD_CALLS.clear()
    scored(TWO, reward=user_tools.overlap_reward)
    assert user_tools.REWARD_CALLS[0][1] == {"id": None, "golds": [["Paris"], ["Rome"]]}
    # no reference answer at all: the user's reward still scores it
    free = scored(TWO, golds=None, reward=user_tools.answered_reward)
    assert free["score"] == 1.0 and free["em"] == 0.0 and free["format_ok"]
    # the json format's tags decide the format and the answer
    json_text = TWO.replace("<answer>", "<tool_call>{}</tool_call><tool_response>r</tool_response>"
                                        "<mem>m</mem><think>t</think><answer>")
    assert scored(json_text, reward="f1", tags=JSON_TAG_SET)["format_ok"]


def test_em_retrieved_scores_an_answer_only_after_every_gold_was_retrieved():
    searched = ("<mem>m</mem><think>t</think><search>where</search>"
                "<information>Paris is a city. {more}</information>\n")
    both = searched.format(more="So is Rome.") + TWO
    one = searched.format(more="") + TWO.replace("big red Rome", "Rome")
    assert scored(both, reward="em_retrieved")["score"] == scored(both)["score"] == 0.5
    assert scored(both, reward="em_retrieved")["all_retrieved"] is True
    guessed = scored(one, reward="em_retrieved")  # both right, but Rome was never in a tool result
    assert guessed["score"] == 0.0 and guessed["em"] == 1.0 and guessed["all_retrieved"] is False
    assert scored(one)["score"] == 1.0  # plain EM pays the guess
    assert scored(TWO, reward="em_retrieved")["score"] == 0.0  # nothing searched at all
    assert scored(both, reward="em_retrieved", mode="sum")["score"] == 1.0
    assert scored(searched.format(more="Rome.") + BROKEN, reward="em_retrieved")["score"] == 0.0  # format gate
    assert outcome(dataclasses.replace(trajectory(), golds=None, protocol_text=both), reward="em_retrieved") == {}


@pytest.mark.parametrize("name, fragment", [
    ("nan_reward", "returned nan on trajectory q/0; it must return a finite float"),
    ("string_reward", "returned str '1.0' on trajectory q/0; it must return a float"),
    ("raising_reward", "raised on trajectory q/0 (KeyError: 'no such field')"),
])
def test_a_bad_reward_is_one_clear_error_naming_the_function(name, fragment):
    with pytest.raises(OutcomeRewardError) as caught:
        score_outcomes([dataclasses.replace(trajectory(golds=["x"]), protocol_text=TEXT)],
                       reward=f"support.user_tools:{name}")
    message = str(caught.value)
    assert message.startswith(f"rollout.outcome_reward: support.user_tools:{name} ") and fragment in message, message
    assert "\n" not in message


@pytest.mark.parametrize("spec, fragment", [
    ("support.user_tools:nope", "has no attribute 'nope'"),
    ("support.user_tools:TABLE", "is a dict, not a function"),
    ("exact", "must be one of ('em', 'f1', 'em_retrieved') or an import path"),
])
def test_reward_specs_that_cannot_work_fail_at_once(spec, fragment):
    with pytest.raises(ConfigError) as caught:
        resolve_outcome_reward(spec)
    assert caught.value.field == "rollout.outcome_reward" and fragment in str(caught.value)
