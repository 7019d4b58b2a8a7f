"""mempo.algo.contexts: full_ctx / mem_ctx of a scored round and the scoring requests, on hand-made trajectories."""
import pytest

from mempo.algo.contexts import (build_answer, build_objective_answer, comparator_end, default_answer_builder,
                                  default_objective_answer_builder, mem_ctx_ids, scored_round, scoring_requests)
from mempo.records.scoring import ScoredRound, ScoringRequest
from mempo.records.trajectory import Round
from support.rollout_fixtures import chat_tokenizer, trajectory


def test_the_two_contexts_of_a_scored_round():
    t = trajectory()
    second = t.rounds[1]
    assert mem_ctx_ids(t, second) == [1, 2, 3, 15, 16]  # prompt + the round's <mem> ids, no tool ids
    assert scored_round(t, second) == ScoredRound(full_end=8, mem_ctx_ids=[1, 2, 3, 15, 16])
    assert t.sequence_ids[:8] == [1, 2, 3, 10, 11, 12, 13, 14]  # full_ctx: everything before round 2's output
    with pytest.raises(ValueError, match="no well-formed <mem>"):
        mem_ctx_ids(trajectory(second_mem=None), trajectory(second_mem=None).rounds[1])


def test_scoring_requests_line_up_with_trajectories():
    calls = []

    def builder(golds, tokenizer):
        calls.append(list(golds))
        return [7, 8, 9], [0, 1, 0]

    scored, unscored = trajectory(), trajectory(second_mem=None)
    requests = scoring_requests([scored, unscored, trajectory()], None, builder)
    assert requests == [
        ScoringRequest([1, 2, 3, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19], [ScoredRound(8, [1, 2, 3, 15, 16])],
                       [7, 8, 9], [0, 1, 0]),
        ScoringRequest(unscored.sequence_ids, [], [7, 8, 9], [0, 1, 0]),  # round 1 is never scored
        ScoringRequest(scored.sequence_ids, [ScoredRound(8, [1, 2, 3, 15, 16])], [7, 8, 9], [0, 1, 0]),
    ]
    assert calls == [["x"]]  # once per distinct golds
    with pytest.raises(ValueError, match="2 ids but 1 mask"):
        scoring_requests([scored], None, lambda golds, tok: ([1, 2], [1]))


def test_default_answer_builder_takes_the_first_alias_of_each_objective():
    tok = chat_tokenizer()
    assert default_answer_builder(["Paris", "paris"], tok) == build_answer(tok, "Paris")
    assert default_answer_builder([["Paris", "paris"], ["42"]], tok) == build_answer(tok, ["Paris", "42"])
    ids, mask = default_answer_builder([["Paris"], ["42"]], tok)
    gold_text = tok.decode([i for i, m in zip(ids, mask) if m])
    assert "Paris" in gold_text and "42" in gold_text and "answer>" not in gold_text


def test_the_in_distribution_comparator_ends_at_the_rounds_mem():
    t = trajectory()
    second = t.rounds[1]
    assert comparator_end(t, second) == comparator_end(t, second, "paper") == second.full_end == 8
    end = comparator_end(t, second, "history_mem")
    assert end == len(t.prompt_ids) + second.mem_span[1] == 10
    # both contexts end in the round's <mem>...</mem> ids before the same answer
    assert t.sequence_ids[:end][-2:] == mem_ctx_ids(t, second)[-2:] == [15, 16]
    assert scored_round(t, second, "history_mem") == ScoredRound(full_end=10, mem_ctx_ids=[1, 2, 3, 15, 16])
    request = scoring_requests([t], None, lambda golds, tok: ([7, 8], [1, 1]), comparator="history_mem")[0]
    assert request.rounds == [ScoredRound(10, [1, 2, 3, 15, 16])]
    with pytest.raises(ValueError, match="comparator must be one of"):
        comparator_end(t, second, "before")
    with pytest.raises(ValueError, match="comparator must be one of"):
        scoring_requests([t], None, comparator="before")
    with pytest.raises(ValueError, match="no well-formed <mem>"):
        comparator_end(t, Round(index=1, start=5, end=10, tool_end=10, full_end=8), "history_mem")


def test_objective_answer_labels_each_gold_token_with_its_objective():
    tok = chat_tokenizer()
    ids, labels = build_objective_answer(tok, ["Marie Curie", "1889", ""])
    assert (ids, [int(j >= 0) for j in labels]) == build_answer(tok, ["Marie Curie", "1889", ""])
    assert {j for j in labels} == {-1, 0, 1}  # the empty third answer labels no token
    for j, text in ((0, "Marie Curie"), (1, "1889")):
        assert tok.decode([i for i, o in zip(ids, labels) if o == j]).strip() == text
    assert labels[0] == -1 and labels[-1] == -1  # the template
    assert default_objective_answer_builder([["Paris", "paris"], ["42"]], tok) == build_objective_answer(
        tok, ["Paris", "42"])
    with pytest.raises(ValueError, match="non-empty sequence"):
        build_objective_answer(tok, [])
    # per-objective requests: the mask from the labels, the objective count from the golds
    t = trajectory(golds=(["Paris"], ["42"], ["x"]))
    request = scoring_requests([t], tok, per_objective=True)[0]
    ids, labels = build_objective_answer(tok, ["Paris", "42", "x"])
    assert (request.answer_ids, request.answer_objectives, request.num_objectives) == (ids, labels, 3)
    assert request.answer_mask == [int(j >= 0) for j in labels]
    assert scoring_requests([t], tok)[0].answer_objectives is None
