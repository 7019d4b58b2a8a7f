"""mempo.records.trajectory: the record's rules (validate), its JSON round trip and the per-round training inputs."""
import dataclasses

import pytest

from mempo.protocol.memory import CONTEXT_POLICIES
from mempo.records.trajectory import Trajectory, round_training_inputs
from support.rollout_fixtures import trajectory


def test_round_trip_keeps_every_field():
    t = dataclasses.replace(trajectory(), protocol_text="<mem>a</mem>...", outcome={"score": 1.0, "failed_rules": ()})
    loaded = Trajectory.from_dict(t.to_dict())
    assert loaded.to_dict() == t.to_dict()
    assert loaded.protocol_text == "<mem>a</mem>..." and loaded.outcome["failed_rules"] == []  # JSON: tuples -> lists
    assert Trajectory.from_dict({k: v for k, v in t.to_dict().items() if k != "protocol_text"}).protocol_text is None


def test_validate_names_the_broken_rule():
    assert set(CONTEXT_POLICIES) == {"full", "memory"}
    with pytest.raises(ValueError, match="policy must be one of"):
        dataclasses.replace(trajectory(), policy="summary").validate()
    with pytest.raises(ValueError, match="finish_reason"):
        dataclasses.replace(trajectory(), finish_reason="timeout").validate()
    bad = trajectory()
    bad.rounds[1].full_end += 1
    with pytest.raises(ValueError, match="full_end"):
        bad.validate()


def test_round_training_inputs_of_the_full_policy():
    t = trajectory()
    first, second = round_training_inputs(t)
    assert first.input_ids == [1, 2, 3, 10, 11, 12] and first.context_len == 3
    assert second.input_ids == t.sequence_ids and second.context_len == 8
    assert second.loss_mask == [0] * 8 + [1] * 5
    assert [r.index for r in t.scored_rounds()] == [1]


def test_retrieved_objectives_per_scored_round():
    """The objectives whose gold an <information> showed before each scored round (the `seen` of
    memory_keeps): round 2 saw nothing yet, round 3 saw Paris, round 4 both."""
    from support.rollout_fixtures import chat_tokenizer, text_trajectory

    tok = chat_tokenizer()
    rounds = [("q", "<search>a</search>", "<information>nothing here</information>"),
              ("none yet", "<search>b</search>", "<information>Tamor lives in Paris.</information>"),
              ("Paris", "<search>c</search>", "<information>the river is the Rome.</information>"),
              ("Paris and Rome", "<answer>Paris; Rome</answer>", None)]
    t = text_trajectory(tok, "Where and which river?", rounds, [["Paris", "paris"], ["Rome"]])
    assert len(t.scored_rounds()) == 3
    assert t.retrieved_objectives(tok) == [[], [0], [0, 1]]
    assert t.memory_keeps(tok) == [None, True, True]
    assert t.memory_kept_shares(tok) == [None, 1.0, 1.0]
    t.golds = None
    assert t.retrieved_objectives(tok) == [] and t.memory_keeps(tok) == [] and t.memory_kept_shares(tok) == []


def test_memory_kept_shares_and_answered_pending():
    """The graded keeps (the share of retrieved golds a <mem> keeps), and whether the answer came while
    some objective's gold had not been read: answering after one of three searches is answering pending."""
    from support.rollout_fixtures import chat_tokenizer, text_trajectory

    tok = chat_tokenizer()
    golds = [["Paris"], ["Rome"], ["Nefu"]]
    rounds = [("q", "<search>a</search>", "<information>Tamor lives in Paris and swims in the Rome.</information>"),
              ("Paris", "<search>b</search>", "<information>Bevat studied at Nefu.</information>"),
              ("Rome", "<answer>Paris; Rome; Nefu</answer>", None)]
    t = text_trajectory(tok, "Where, which river, which university?", rounds, golds)
    assert len(t.scored_rounds()) == 2  # the first round writes no memory of anything read
    assert t.memory_kept_shares(tok) == [pytest.approx(1 / 2), pytest.approx(1 / 3)]
    assert t.memory_keeps(tok) == [False, False]
    assert t.answered_pending(tok) is None  # no answer extracted: nothing to judge
    t.final_answer = "Paris; Rome; Nefu"
    assert t.answered_pending(tok) is False  # every gold was read before the answer
    early = text_trajectory(tok, "Where, which river, which university?",
                            [rounds[0], ("Paris Rome", "<answer>Paris; Rome; unknown</answer>", None)], golds)
    early.final_answer = "Paris; Rome; unknown"
    assert early.answered_pending(tok) is True  # Nefu was never read: answered with a question pending
    early.golds = None
    assert early.answered_pending(tok) is None


def test_looped_is_an_unanswered_episode_ending_on_a_repeated_round():
    """The same round twice in a row (same ids) at the end of an episode without an answer: stuck."""
    from support.rollout_fixtures import chat_tokenizer, text_trajectory

    tok = chat_tokenizer()
    search = ("Q1: ?", "<search>a</search>", "<information>nothing</information>")
    stuck = text_trajectory(tok, "Where?", [search, search, search], [["Paris"]])
    stuck.finish_reason = "turn_limit"
    assert stuck.looped()
    moved = text_trajectory(tok, "Where?", [search, ("Q1: Paris", "<search>b</search>", None)], [["Paris"]])
    moved.finish_reason = "turn_limit"
    assert not moved.looped()  # the last round differs from the one before
    once = text_trajectory(tok, "Where?", [search], [["Paris"]])
    once.finish_reason = "turn_limit"
    assert not once.looped()
    stuck.finish_reason = "answer"
    assert not stuck.looped()  # an answered episode is not stuck
