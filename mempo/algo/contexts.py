"""The two teacher-scoring contexts of a scored round and the scored answer, as `ScoringRequest`s.

    full_ctx[r] = sequence_ids[:full_end]               full_end = len(prompt_ids) + start(r): everything
                                                        before round r's own output (an end offset, no copy)
    mem_ctx[r]  = prompt_ids + response_ids[mem_span]   system + question (chat-formatted), then round r's
                                                        `<mem>...</mem>`; the last tool result is not included
    answer      = template with the gold in "{answer}"  answer_mask_i = 1 iff token i overlaps a gold character

Both contexts are continued by the same answer ids; teacher scoring (`mempo.scoring`) returns
P(answer | context) for each. Several objectives: the sub-answers joined by "; ", only their
characters gold. Requests and results are the records of `mempo.records.scoring`.
"""
from __future__ import annotations

from typing import Any, Callable, Optional, Sequence, Union

from mempo.protocol.reward import objectives_from_golds
from mempo.records.scoring import ScoredRound, ScoringRequest
from mempo.records.trajectory import Round, Trajectory

__all__ = ["DEFAULT_ANSWER_TEMPLATE", "AnswerBuilder", "build_answer", "default_answer_builder", "mem_ctx_ids",
           "scored_round", "scoring_requests"]

DEFAULT_ANSWER_TEMPLATE = "\n<think>\nI have the answer.\n</think>\n<answer>\n{answer}\n</answer>"

AnswerBuilder = Callable[[Any, Any], tuple[Sequence[int], Sequence[int]]]


# ------------------------------------------------------------------------------------------------
# answer template + answer mask
# ------------------------------------------------------------------------------------------------
def _encode_with_offsets(tokenizer, text: str):
    """(ids, offsets) without special tokens, from a `tokenizers.Tokenizer` or an HF fast tokenizer."""
    if not callable(tokenizer) and hasattr(tokenizer, "encode"):  # tokenizers.Tokenizer
        enc = tokenizer.encode(text, add_special_tokens=False)
        return list(enc.ids), [tuple(o) for o in enc.offsets]
    try:
        enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    except NotImplementedError as exc:  # slow (Python) HF tokenizers have no offsets
        raise ValueError("build_answer needs character offsets: use a fast tokenizer "
                         "(tokenizers / PreTrainedTokenizerFast)") from exc
    return list(enc["input_ids"]), [tuple(o) for o in enc["offset_mapping"]]


def build_answer(
    tokenizer,
    gold: Union[str, Sequence[str]],
    template: str = DEFAULT_ANSWER_TEMPLATE,
    *,
    separator: str = "; ",
) -> tuple[list[int], list[int]]:
    """Tokenise the scored continuation and mark its gold-answer tokens.

    Args:
        tokenizer: a `tokenizers.Tokenizer` or an HF fast tokenizer (character offsets needed; works
            with byte-level BPE). Special tokens are not added.
        gold: the gold answer; a list/tuple of sub-answers (multi-objective) is joined with
            `separator`, and only the sub-answers' characters count as gold (separators do not). A
            str is one answer, all of its characters gold.
        template: the continuation, with "{answer}" exactly once where the gold text goes.
        separator: joins sub-answers.

    Returns:
        (answer_ids, answer_mask): lists of equal length; answer_mask[i] = 1 iff token i's character
        span [start, end) overlaps a gold character (a token that straddles a template/gold boundary,
        such as " London" after "; ", counts as gold). An empty gold gives an all-zero mask
        (P = empty_value for every context).
    """
    if template.count("{answer}") != 1:
        raise ValueError("template must contain '{answer}' exactly once")
    parts = [gold] if isinstance(gold, str) else list(gold)
    if not all(isinstance(p, str) for p in parts):
        raise ValueError("gold must be a str or a sequence of str")
    head, tail = template.split("{answer}")
    spans, pieces, at = [], [], len(head)
    for j, part in enumerate(parts):
        if j:
            pieces.append(separator)
            at += len(separator)
        pieces.append(part)
        if part:
            spans.append((at, at + len(part)))
        at += len(part)
    text = head + "".join(pieces) + tail
    ids, offsets = _encode_with_offsets(tokenizer, text)
    mask = [int(any(s < g1 and e > g0 for g0, g1 in spans)) for s, e in offsets]
    return ids, mask


def default_answer_builder(golds: Any, tokenizer: Any) -> tuple[list[int], list[int]]:
    """`build_answer` (default template) around the first alias of each objective.

    ``golds`` as ``compute_score`` takes them (:func:`mempo.protocol.reward.objectives_from_golds`): one
    objective gives its first alias as the answer, k objectives give the list of first aliases
    (joined by "; ", only the aliases' tokens in the mask)."""
    firsts = [aliases[0] for aliases in objectives_from_golds(golds)]
    return build_answer(tokenizer, firsts[0] if len(firsts) == 1 else firsts)


# ------------------------------------------------------------------------------------------------
# the contexts of a scored round
# ------------------------------------------------------------------------------------------------
def mem_ctx_ids(trajectory: Trajectory, round_: Round) -> list[int]:
    """``mem_ctx[r]`` = prompt ids + the round's ``<mem>...</mem>`` ids [P + |mem|] (ValueError
    without a mem span)."""
    if round_.mem_span is None:
        raise ValueError(f"round {round_.index} has no well-formed <mem> block")
    start, end = round_.mem_span
    return trajectory.prompt_ids + trajectory.response_ids[start:end]


def scored_round(trajectory: Trajectory, round_: Round) -> ScoredRound:
    """Both contexts of a scored round: full_ctx as its end offset ``full_end``, mem_ctx as ids."""
    return ScoredRound(full_end=round_.full_end, mem_ctx_ids=mem_ctx_ids(trajectory, round_))


def scoring_requests(trajectories: Sequence[Trajectory], tokenizer: Any,
                     answer_builder: Optional[AnswerBuilder] = None) -> list[ScoringRequest]:
    """One `ScoringRequest` per trajectory, in order (an empty ``rounds`` for a trajectory with no
    scored round, so results line up with trajectories); the answer is built once per distinct golds.

    Args:
        trajectories: rollout output.
        tokenizer: passed to ``answer_builder``.
        answer_builder: ``(golds, tokenizer) -> (answer_ids, answer_mask)``, both lists of ints of
            one length (mask 1 on the gold answer's tokens); default `default_answer_builder`.
            Called once per distinct ``golds``.
    """
    if answer_builder is None:
        answer_builder = default_answer_builder
    requests = []
    answers: dict[str, tuple[list[int], list[int]]] = {}
    for trajectory in trajectories:
        key = repr(trajectory.golds)
        if key not in answers:
            answer_ids, answer_mask = answer_builder(trajectory.golds, tokenizer)
            answer_ids, answer_mask = [int(t) for t in answer_ids], [int(m) for m in answer_mask]
            if len(answer_ids) != len(answer_mask):
                raise ValueError(f"answer_builder gave {len(answer_ids)} ids but {len(answer_mask)} mask values")
            answers[key] = (answer_ids, answer_mask)
        answer_ids, answer_mask = answers[key]
        rounds = [scored_round(trajectory, r) for r in trajectory.scored_rounds()]
        requests.append(ScoringRequest(sequence_ids=trajectory.sequence_ids, rounds=rounds,
                                       answer_ids=list(answer_ids), answer_mask=list(answer_mask)))
    return requests
