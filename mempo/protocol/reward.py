"""Outcome scoring of MemPO trajectories: normalisation, EM, token F1, multi-objective episodes.

Comparisons are on SQuAD-normalised strings (`normalize_answer`); F1 is plain SQuAD token F1 on
their white-space tokens (no HotpotQA yes/no special case). Gold answers are *aliases*: a
prediction is right when it matches any alias (EM), and its F1 is the best over the aliases.
Scores are Python floats: EM and F1 in [0, 1], an episode score in [0, 1] (``"mean"``, ``"all"``)
or [0, k] (``"sum"``).
"""
from __future__ import annotations

import re
import string
from collections import Counter
from numbers import Real
from typing import Any, Iterable, Mapping, Optional, Sequence, Union

from mempo.protocol.grammar import extract_solution, split_rounds, validate_format
from mempo.protocol.tags import TAG_SET, TagSet

__all__ = [
    "SCORE_MODES",
    "normalize_answer",
    "em_check",
    "f1_score",
    "split_answer",
    "objectives_from_golds",
    "compute_score",
    "memory_keeps",
    "memory_kept_share",
    "objectives_seen",
    "retrieved_objectives",
    "response_retrieved_objectives",
]

SCORE_MODES = ("mean", "all", "sum")

_PUNCTUATION = frozenset(string.punctuation)
_ARTICLES_RE = re.compile(r"\b(a|an|the)\b")

Aliases = Union[str, Iterable[str]]


def normalize_answer(s: str) -> str:
    """SQuAD normalisation (as verl's ``search_r1_like_qa_em.normalize_answer``): lower-case, drop
    every ``string.punctuation`` character, replace the articles a/an/the (whole words) by a space,
    collapse white space."""
    lowered = s.lower()
    no_punctuation = "".join(ch for ch in lowered if ch not in _PUNCTUATION)
    no_articles = _ARTICLES_RE.sub(" ", no_punctuation)
    return " ".join(no_articles.split())


def _is_scalar_alias(gold: Any) -> bool:
    """A string or a real number (numpy scalars included; numpy's bool is no Real, Python's is excluded)."""
    return isinstance(gold, str) or (isinstance(gold, Real) and not isinstance(gold, bool))


def _alias_text(gold: Any) -> str:
    """An alias as text: a string as it is, a number as its string form (a whole float without ".0")."""
    if not _is_scalar_alias(gold):
        raise ValueError(f"a gold alias must be a string or a number, got {type(gold).__name__} {gold!r}")
    if isinstance(gold, str):
        return str(gold)
    value = gold.item() if hasattr(gold, "item") else gold  # numpy scalars: their Python value
    if isinstance(value, float) and value.is_integer() and abs(value) < 2 ** 53:
        value = int(value)
    return str(value)


def _sequence(golds: Any) -> list:
    if isinstance(golds, Mapping):
        raise ValueError(f"golds must be an alias (a string or a number) or a sequence of aliases, got a "
                         f"{type(golds).__name__}")
    try:
        return list(golds)
    except TypeError:
        raise ValueError(f"golds must be an alias (a string or a number) or a sequence of aliases, got "
                         f"{type(golds).__name__} {golds!r}") from None


def _aliases(golds: Aliases) -> list[str]:
    if _is_scalar_alias(golds):
        return [_alias_text(golds)]
    return [_alias_text(gold) for gold in _sequence(golds)]


def em_check(prediction: Optional[str], golds: Aliases) -> bool:
    """True when the normalised prediction equals the normalised form of any alias in ``golds``.

    ``golds`` is one alias string or an iterable of aliases (a string is never split into
    characters). A number (int, float, numpy scalar; not bool) is an alias compared as its string
    form (``5`` and ``5.0`` -> ``"5"``, ``2.5`` -> ``"2.5"``); any other non-string, non-sequence
    gold (None, a bool, a dict) is a ValueError naming it. ``None`` (no answer) is never right.
    """
    if prediction is None:
        return False
    normalized = normalize_answer(prediction)
    return any(normalize_answer(gold) == normalized for gold in _aliases(golds))


def _token_f1(prediction_tokens: list[str], gold_tokens: list[str]) -> float:
    if not prediction_tokens or not gold_tokens:
        return float(prediction_tokens == gold_tokens)
    common = Counter(prediction_tokens) & Counter(gold_tokens)
    overlap = sum(common.values())
    if overlap == 0:
        return 0.0
    precision = overlap / len(prediction_tokens)
    recall = overlap / len(gold_tokens)
    return 2 * precision * recall / (precision + recall)


def f1_score(prediction: Optional[str], golds: Aliases) -> float:
    """Token F1 of the normalised prediction, the best over the aliases in ``golds``.

    Empty cases: ``None`` gives 0; a prediction and an alias that both normalise to nothing give 1;
    one of them empty gives 0; no aliases give 0 (EM agrees in each case).
    """
    if prediction is None:
        return 0.0
    prediction_tokens = normalize_answer(prediction).split()
    return max((_token_f1(prediction_tokens, normalize_answer(gold).split())
                for gold in _aliases(golds)), default=0.0)


def split_answer(text: Optional[str], num_objectives: int) -> list[Optional[str]]:
    """The ``num_objectives`` sub-answers of an answer text, by position; ``None`` = missing.

    With one objective the stripped text is the answer (no split). With k > 1 the text is split
    on ``";"`` and each part stripped; part i answers objective i, an empty part or a part beyond
    the text's end is missing (``None``), parts after the k-th are ignored. ``text=None`` (no
    answer at all) gives k missing sub-answers. (The MEM1 protocol: k sub-questions answered in one
    ``<answer>``; sub-answers beyond the k-th are ignored as MEM1 does.)
    """
    if num_objectives < 1:
        raise ValueError(f"num_objectives must be >= 1, got {num_objectives}")
    if text is None:
        return [None] * num_objectives
    if num_objectives == 1:
        return [text.strip()]
    parts = [part.strip() for part in text.split(";")][:num_objectives]
    sub_answers: list[Optional[str]] = [part if part else None for part in parts]
    return sub_answers + [None] * (num_objectives - len(sub_answers))


def objectives_from_golds(golds: Any) -> list[list[str]]:
    """The gold aliases of each objective.

    Accepted forms: an alias (one objective, one alias); a sequence of aliases (one objective,
    those aliases); a sequence of sequences of aliases (objective i = the aliases of element i).
    An alias is a string or a number (its string form: ``[5, 6]`` is one objective with aliases
    "5" and "6"). So ``["Paris", "Rome"]`` is one objective with two aliases and
    ``[["Paris"], ["Rome"]]`` two objectives. Any non-string iterable counts as a sequence (tuples,
    numpy arrays as read from parquet). Mixing aliases and sequences at the top level
    (ambiguous), passing no gold at all, or a gold that is neither raises ``ValueError``.
    """
    if _is_scalar_alias(golds):
        return [[_alias_text(golds)]]
    items = _sequence(golds)
    if not items:
        raise ValueError("golds is empty: give at least one alias")
    kinds = {_is_scalar_alias(item) for item in items}
    if kinds == {True}:
        return [[_alias_text(item) for item in items]]
    if kinds == {False}:
        return [_aliases(item) for item in items]
    raise ValueError("golds mixes aliases (strings or numbers) and per-objective alias lists")


def _aggregate(values: Sequence[float], mode: str) -> float:
    if mode == "mean":
        return sum(values) / len(values)
    if mode == "all":
        return float(all(value == 1.0 for value in values))
    return float(sum(values))


def compute_score(response_text: str, golds: Any, *, mode: str = "mean",
                  format_kwargs: Optional[Mapping[str, Any]] = None, tags: TagSet = TAG_SET) -> dict[str, Any]:
    """Score one response against its gold answers.

    The answer is `mempo.protocol.grammar.extract_solution` of the response (never the prompt),
    split by `split_answer`; sub-answer i is scored against the aliases of objective i (a missing
    sub-answer scores 0). The score is gated on the format: a response that fails
    `mempo.protocol.grammar.validate_format` scores 0; ``em`` / ``f1`` / ``per_objective`` are
    computed whatever the format (diagnostics only).

    Args:
        response_text: the response only (rounds and information blocks), never the prompt.
        golds: aliases of one objective, or per-objective alias lists
            (:func:`objectives_from_golds`); no gold at all (an empty sequence) scores 0.
        mode: how per-objective EM becomes the score: ``"mean"`` (default, in [0, 1]), ``"all"``
            (1 only when all are right) or ``"sum"`` (MEM1's reward, in [0, k]); with one
            objective the three agree.
        format_kwargs: keyword arguments for :func:`mempo.protocol.grammar.validate_format`.
        tags: the protocol's tag set (`mempo.protocol.tags`; the json format's ``JSON_TAG_SET``).

    Returns a dict:
        ``score`` (float): the ``mode`` aggregate of the per-objective EM when the format is valid,
        else 0.0; ``em``/``f1`` (float): the mean per-objective EM / F1, computed whatever the
        format (diagnostics); ``format_ok`` (bool); ``failed_rules`` (tuple of rule names);
        ``num_objectives`` (int); ``per_objective`` (list of dicts with ``prediction`` (str or
        None), ``golds`` (list of aliases), ``em`` and ``f1`` (floats)); ``answer`` (the extracted
        answer text, or None).
    """
    if mode not in SCORE_MODES:
        raise ValueError(f"mode must be one of {SCORE_MODES}, got {mode!r}")
    if not _is_scalar_alias(golds):
        golds = _sequence(golds)  # once: golds may be a one-shot iterator
    no_gold = isinstance(golds, list) and not golds
    objectives = [[]] if no_gold else objectives_from_golds(golds)  # no aliases: EM 0, F1 0
    report = validate_format(response_text, tags=tags, **dict(format_kwargs or {}))
    answer = extract_solution(response_text, tags)
    sub_answers = split_answer(answer, len(objectives))
    per_objective = [
        {
            "prediction": prediction,
            "golds": aliases,
            "em": float(em_check(prediction, aliases)),
            "f1": f1_score(prediction, aliases),
        }
        for prediction, aliases in zip(sub_answers, objectives)
    ]
    em_values = [item["em"] for item in per_objective]
    return {
        "score": _aggregate(em_values, mode) if report.ok else 0.0,
        "em": sum(em_values) / len(em_values),
        "f1": sum(item["f1"] for item in per_objective) / len(per_objective),
        "format_ok": report.ok,
        "failed_rules": report.failed_rules,
        "num_objectives": len(objectives),
        "per_objective": per_objective,
        "answer": answer,
    }


def _word_text(text: str) -> str:
    """`text` normalised for whole-word alias search: once with punctuation as word breaks (tags and
    a sentence's full stop split words: ``Belis.</information>``) and once as `normalize_answer` drops
    it (``O'Brien`` -> ``obrien``), each padded with spaces."""
    spaced = "".join(" " if ch in _PUNCTUATION else ch for ch in text)
    return f" {normalize_answer(spaced)} | {normalize_answer(text)} "


def retrieved_objectives(seen_text: str, golds: Any) -> list[int]:
    """The indices (into `objectives_from_golds`) of the objectives with an alias in ``seen_text``, in
    order: an alias is "in" a text when its `normalize_answer` form occurs there as whole words
    (``"paris"`` in ``"capital is paris"``, not in ``"parisian"``; an alias that normalises to
    nothing never is)."""
    seen = _word_text(seen_text)
    return [j for j, aliases in enumerate(objectives_from_golds(golds))
            if any(f" {normalize_answer(a)} " in seen for a in aliases if normalize_answer(a))]


def response_retrieved_objectives(response_text: str, golds: Any, tags: TagSet = TAG_SET) -> list[int]:
    """`retrieved_objectives` of everything the response's tool results (``<information>`` blocks, or the
    tag set's tool-result tag) showed the agent: the objectives it could have read its gold in."""
    seen = " ".join(r.information for r in split_rounds(response_text, tags) if r.information)
    return retrieved_objectives(seen, golds)


def objectives_seen(seen_text: str, golds: Any) -> int:
    """How many objectives (`objectives_from_golds`) have an alias in ``seen_text`` as whole words:
    the objectives `memory_keeps` counts as needed, by the same rule (`retrieved_objectives`)."""
    return len(retrieved_objectives(seen_text, golds))


def memory_keeps(mem_text: str, seen_text: str, golds: Any) -> Optional[bool]:
    """Whether a ``<mem>`` keeps the facts a later round needs: the objectives with an alias in
    ``seen_text`` (what the agent had read before writing the ``<mem>``; `retrieved_objectives`) are
    needed; True when every needed one has an alias in ``mem_text`` too, False when one has none,
    None when nothing is needed yet (aliases found as in `retrieved_objectives`)."""
    objectives = objectives_from_golds(golds)
    needed = retrieved_objectives(seen_text, golds)
    if not needed:
        return None
    return len(_kept(mem_text, objectives, needed)) == len(needed)


def memory_kept_share(mem_text: str, seen_text: str, golds: Any) -> Optional[float]:
    """The graded `memory_keeps`: the share of the needed objectives (those with an alias in
    ``seen_text``, `retrieved_objectives`) that have an alias in ``mem_text`` too, in [0, 1] (1.0
    exactly when `memory_keeps` is True); None when nothing is needed yet."""
    objectives = objectives_from_golds(golds)
    needed = retrieved_objectives(seen_text, golds)
    if not needed:
        return None
    return len(_kept(mem_text, objectives, needed)) / len(needed)


def _kept(mem_text: str, objectives: Sequence[Sequence[str]], needed: Sequence[int]) -> list[int]:
    """The objectives of `needed` with an alias in `mem_text` as whole words (as `retrieved_objectives`)."""
    mem = _word_text(mem_text)
    return [j for j in needed if any(f" {normalize_answer(a)} " in mem for a in objectives[j] if normalize_answer(a))]
