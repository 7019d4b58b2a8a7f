"""mempo.algo.contexts: full_ctx / mem_ctx of a scored round and the scoring requests, on hand-made trajectories."""
import pytest

from mempo.algo.contexts import build_answer, default_answer_builder, mem_ctx_ids, scored_round, scoring_requests
from mempo.records.scoring import ScoredRound, ScoringRequest
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
