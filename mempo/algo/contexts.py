"""The two teacher-scoring contexts of a scored round and the scored answer, as `ScoringRequest`s.

    full_ctx[r] = sequence_ids[:full_end]               the comparator (an end offset, no copy), by
                                                        ``comparator``:
        "paper"        full_end = len(prompt_ids) + start(r): everything before round r's own output
                       (the paper's; a turn without <mem> follows, which the policy never writes)
        "history_mem"  full_end = len(prompt_ids) + mem_end(r): everything through round r's
                       ``</mem>`` (both contexts then end in </mem> before the same answer)
    mem_ctx[r]  = prompt_ids + response_ids[mem_span]   system + question (chat-formatted), then round r's
                                                        `<mem>...</mem>`; the last tool result is not included
    answer      = template with the gold in "{answer}"  answer_mask_i = 1 iff token i overlaps a gold character
                  (``scoring.answer_template``; default the reference's `DEFAULT_ANSWER_TEMPLATE`)

Both contexts are continued by the same answer ids; teacher scoring (`mempo.scoring`) returns
P(answer | context) for each. Several objectives: the sub-answers joined by "; ", only their
characters gold; with ``per_objective`` the request also labels each gold token with its objective
(`build_objective_answer`), so scoring reduces every objective apart. Requests and results are the
records of `mempo.records.scoring`.
"""
from __future__ import annotations

from functools import partial
from typing import Any, Callable, Optional, Sequence, Union

from mempo.protocol.grammar import DEFAULT_ANSWER_TEMPLATE
from mempo.protocol.reward import objectives_from_golds
from mempo.records.scoring import ScoredRound, ScoringRequest
from mempo.records.trajectory import Round, Trajectory

__all__ = ["COMPARATORS", "DEFAULT_ANSWER_TEMPLATE", "AnswerBuilder", "build_answer", "build_objective_answer",
           "comparator_end", "default_answer_builder", "default_objective_answer_builder", "mem_ctx_ids",
           "scored_round", "scoring_requests"]

#: the comparator contexts (full_ctx) of `comparator_end`; "paper" is the library default
COMPARATORS = ("paper", "history_mem")

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


def build_objective_answer(
    tokenizer,
    golds: Sequence[str],
    template: str = DEFAULT_ANSWER_TEMPLATE,
    *,
    separator: str = "; ",
) -> tuple[list[int], list[int]]:
    """Tokenise the scored continuation of k objectives and label each token with its objective.

    Args:
        tokenizer: as `build_answer`.
        golds: one answer string per objective (k >= 1), joined with `separator` into the template.
        template: the continuation, with "{answer}" exactly once.
        separator: joins the answers.

    Returns:
        (answer_ids, answer_objectives): lists of equal length; answer_objectives[i] = j when token
        i's character span overlaps objective j's characters (the first such j; a token straddling a
        template / answer boundary counts, as in `build_answer`), -1 on template and separator tokens.
        ``[int(j >= 0) for j in answer_objectives]`` is `build_answer`'s mask.
    """
    if template.count("{answer}") != 1:
        raise ValueError("template must contain '{answer}' exactly once")
    parts = [golds] if isinstance(golds, str) else list(golds)
    if not parts or not all(isinstance(p, str) for p in parts):
        raise ValueError("gold must be a str or a non-empty sequence of str")
    head, tail = template.split("{answer}")
    spans, pieces, at = [], [], len(head)  # (start, end, objective) of each non-empty answer
    for j, part in enumerate(parts):
        if j:
            pieces.append(separator)
            at += len(separator)
        pieces.append(part)
        if part:
            spans.append((at, at + len(part), j))
        at += len(part)
    text = head + "".join(pieces) + tail
    ids, offsets = _encode_with_offsets(tokenizer, text)
    objectives = [next((j for g0, g1, j in spans if s < g1 and e > g0), -1) for s, e in offsets]
    return ids, objectives


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
    if not isinstance(gold, str) and not list(gold):
        gold = [""]
    ids, objectives = build_objective_answer(tokenizer, gold, template, separator=separator)
    return ids, [int(j >= 0) for j in objectives]


def default_answer_builder(golds: Any, tokenizer: Any, template: str = DEFAULT_ANSWER_TEMPLATE
                           ) -> tuple[list[int], list[int]]:
    """`build_answer` (`template`) around the first alias of each objective.

    ``golds`` as ``compute_score`` takes them (:func:`mempo.protocol.reward.objectives_from_golds`): one
    objective gives its first alias as the answer, k objectives give the list of first aliases
    (joined by "; ", only the aliases' tokens in the mask)."""
    firsts = [aliases[0] for aliases in objectives_from_golds(golds)]
    return build_answer(tokenizer, firsts[0] if len(firsts) == 1 else firsts, template)


def default_objective_answer_builder(golds: Any, tokenizer: Any, template: str = DEFAULT_ANSWER_TEMPLATE
                                     ) -> tuple[list[int], list[int]]:
    """`build_objective_answer` (`template`) around the first alias of each objective: the same
    ids as `default_answer_builder`, each gold token labelled with its objective (-1 elsewhere)."""
    return build_objective_answer(tokenizer, [aliases[0] for aliases in objectives_from_golds(golds)], template)


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


def comparator_end(trajectory: Trajectory, round_: Round, comparator: str = "paper") -> int:
    """The sequence offset where full_ctx[r] ends (``full_ctx = sequence_ids[:end]``): "paper"
    ``Round.full_end`` (= P + start(r)), "history_mem" P + the end of the round's ``<mem>`` span
    (everything the policy saw and wrote through that ``</mem>``). ValueError for another name, or
    for "history_mem" on a round without a mem span."""
    if comparator == "paper":
        return round_.full_end
    if comparator == "history_mem":
        if round_.mem_span is None:
            raise ValueError(f"round {round_.index} has no well-formed <mem> block")
        return len(trajectory.prompt_ids) + round_.mem_span[1]
    raise ValueError(f"comparator must be one of {COMPARATORS}, got {comparator!r}")


def scored_round(trajectory: Trajectory, round_: Round, comparator: str = "paper") -> ScoredRound:
    """Both contexts of a scored round: full_ctx as its end offset (`comparator_end`), mem_ctx as ids."""
    return ScoredRound(full_end=comparator_end(trajectory, round_, comparator),
                       mem_ctx_ids=mem_ctx_ids(trajectory, round_))


def scoring_requests(trajectories: Sequence[Trajectory], tokenizer: Any,
                     answer_builder: Optional[AnswerBuilder] = None, *, comparator: str = "paper",
                     per_objective: bool = False, template: str = DEFAULT_ANSWER_TEMPLATE) -> list[ScoringRequest]:
    """One `ScoringRequest` per trajectory, in order (an empty ``rounds`` for a trajectory with no
    scored round, so results line up with trajectories); the answer is built once per distinct golds.

    Args:
        trajectories: rollout output.
        tokenizer: passed to ``answer_builder``.
        answer_builder: ``(golds, tokenizer) -> (answer_ids, labels)``, both lists of ints of one
            length, called once per distinct ``golds``. Without ``per_objective`` the labels are the
            answer mask (1 on the gold answer's tokens; default `default_answer_builder`); with it they
            are the objective of each token (-1 off gold; default `default_objective_answer_builder`),
            and the request's ``num_objectives`` is the count of `objectives_from_golds`.
        comparator: one of `COMPARATORS` (`comparator_end`), the full_ctx of every round.
        per_objective: label the answer's tokens by objective (every context is then scored per
            objective too).
        template: the default builders' answer template (``scoring.answer_template``); ValueError when
            given with an ``answer_builder`` (which builds its own answer).
    """
    if comparator not in COMPARATORS:
        raise ValueError(f"comparator must be one of {COMPARATORS}, got {comparator!r}")
    if answer_builder is None:
        builder = default_objective_answer_builder if per_objective else default_answer_builder
        answer_builder = partial(builder, template=template)
    elif template != DEFAULT_ANSWER_TEMPLATE:
        raise ValueError("scoring_requests: pass either an answer_builder or a template, not both")
    requests = []
    answers: dict[str, tuple[list[int], list[int]]] = {}
    for trajectory in trajectories:
        key = repr(trajectory.golds)
        if key not in answers:
            answer_ids, labels = answer_builder(trajectory.golds, tokenizer)
            answer_ids, labels = [int(t) for t in answer_ids], [int(m) for m in labels]
            if len(answer_ids) != len(labels):
                raise ValueError(f"answer_builder gave {len(answer_ids)} ids but {len(labels)} mask values")
            answers[key] = (answer_ids, labels)
        answer_ids, labels = answers[key]
        rounds = [scored_round(trajectory, r, comparator) for r in trajectory.scored_rounds()]
        if per_objective:
            extra = dict(answer_mask=[int(j >= 0) for j in labels], answer_objectives=list(labels),
                         num_objectives=len(objectives_from_golds(trajectory.golds)))
        else:
            extra = dict(answer_mask=list(labels))
        requests.append(ScoringRequest(sequence_ids=trajectory.sequence_ids, rounds=rounds,
                                       answer_ids=list(answer_ids), **extra))
    return requests
