"""The oracle's memory: what it writes in ``<mem>`` and reads back every round.

Format (one line each; parsed back by `parse_oracle_memory`)::

    Step 3.
    Q1: founder of Velora Works = Anika Dorsel; birthplace of Anika Dorsel = Tamsk
    Q2: establishment year of Brisk Mills = ? see chronicle-0001 page 2
    Q3: founder of Kelm Press = ? (tried 1)
    Q4: not started

A hop is ``<relation label> of <subject> = <value>``; the value is the fact found, ``?`` with
the failed search count ``(tried n)`` while searching, ``? see <doc-id> page <p>`` when the
fact sits on a chronicle page to open, or ``unknown`` when the oracle gave up. ``Step n`` is
the round number (1-based), the only way the oracle knows its turn budget. ``Q<n>: done``
(`LOST`) is a question closed without its facts: only the deliberately imperfect teacher
(``OracleAgent(drop_fact_prob=...)``) writes it, and its answer is then ``unknown``. With
``lost_line="subject"`` the line names the question's subject first (``Q<n>: Tamor done``), as a kept
fact sentence does; with ``lost_line="value"`` it is the first hop's fact sentence with ``unknown`` for
its value (``Q<n>: Tamor was born in the city of unknown.``; `LOST_LINES`).
`memory_line_kinds` classifies what each objective's line holds (the demo's report counts them).
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Optional, Sequence

from mempo.protocol.grammar import check_answer_template

from mempo.protocol.reward import normalize_answer
from mempo.synthetic.grammar import RELATIONS, QuestionParse, fact_pattern, parse_question

__all__ = ["UNKNOWN", "LOST", "LOST_LINES", "FACT_STYLES", "HopState", "ObjectiveState", "parse_oracle_memory",
           "MEMORY_LINE_KINDS", "memory_line_kinds", "check_teacher_options"]

UNKNOWN = "unknown"
LOST = "done"
#: How a lost question's line reads: ``"bare"`` ``Q<n>: done``; ``"subject"`` ``Q<n>: <subject> done``
#: (the question's first subject); ``"value"`` the first hop's fact sentence (facts styles; ``<label> of
#: <subject> = unknown`` in the labels style) with `UNKNOWN` in the value's place. With "subject" the
#: keep-or-drop choice of a listed/facts memory falls after the subject, which both lines write, not on
#: the subject itself (a held-out name in evaluation, which the cold start's trajectories never write:
#: docs/experiments/T11-em-along-sft.md); with "value" it falls on the value, and the answer for the
#: question is always the line's last word.
LOST_LINES = ("bare", "subject", "value")

_LABEL_TO_RELATION = {r.label: r.name for r in RELATIONS.values()}
_HOP_RE = re.compile(
    r"^(?P<label>" + "|".join(re.escape(label) for label in sorted(_LABEL_TO_RELATION, key=len, reverse=True))
    + r") of (?P<subject>.+?) = (?P<value>.+)$")
_TRIED_RE = re.compile(r"^\? \(tried (\d+)\)$")
_SEE_RE = re.compile(r"^\? see (\S+) page (\d+)$")
_STEP_RE = re.compile(r"^Step (\d+)\.$")
#: The memory styles whose lines copy the corpus's fact sentences (`OracleAgent`'s memory_style).
FACT_STYLES = ("facts", "listed")
_OBJECTIVE_RE = re.compile(r"^Q(\d+): (.*)$")


# ---------------------------------------------------------------------------------------------
# State carried in <mem>
# ---------------------------------------------------------------------------------------------


@dataclass
class HopState:
    """One hop of a question: the relation applied to ``subject`` and what is known of its value.

    ``value`` is the fact once found (``UNKNOWN`` after giving up); ``tried`` counts failed
    searches; ``pointer`` is ``(doc_id, page)`` when an article said where the fact is written.
    """

    relation: str
    subject: Optional[str] = None
    value: Optional[str] = None
    tried: int = 0
    pointer: Optional[tuple[str, int]] = None

    @property
    def label(self) -> str:
        return RELATIONS[self.relation].label

    def memory_text(self, style: str = "labels") -> str:
        if style in FACT_STYLES:
            if self.value == UNKNOWN:
                return UNKNOWN
            if self.value is not None:  # the sentence the corpus states the fact with
                return RELATIONS[self.relation].fact.format(s=self.subject, o=self.value)
            if self.pointer is not None:
                return f"? see {self.pointer[0]} page {self.pointer[1]}"
            return f"? (tried {self.tried})" if self.tried else "?"
        if self.value is not None:
            shown = self.value
        elif self.pointer is not None:
            shown = f"? see {self.pointer[0]} page {self.pointer[1]}"
        else:
            shown = f"? (tried {self.tried})"
        return f"{self.label} of {self.subject} = {shown}"


@dataclass
class ObjectiveState:
    """One sub-question: its number (1-based), text, parse (None: outside the grammar) and hops."""

    number: int
    question: str
    parse: Optional[QuestionParse]
    hops: list[HopState]
    lost: bool = False  # closed in memory without its facts (`OracleAgent` drop_fact_prob): answer unknown

    @classmethod
    def plan(cls, number: int, question: str) -> "ObjectiveState":
        """The fresh state of a question: its hops, the first one's subject known."""
        try:
            parsed = parse_question(question)
        except ValueError:
            return cls(number, question, None, [])
        hops = [HopState(relation) for relation in parsed.relations]
        hops[0].subject = parsed.start
        return cls(number, question, parsed, hops)

    @property
    def failed(self) -> bool:
        return self.lost or self.parse is None or any(hop.value == UNKNOWN for hop in self.hops)

    @property
    def done(self) -> bool:
        return self.failed or all(hop.value is not None for hop in self.hops)

    @property
    def answer(self) -> str:
        if self.failed or not self.done:
            return UNKNOWN
        return self.hops[-1].value

    def next_hop(self) -> Optional[HopState]:
        """The first hop without a value (its subject is known), or None when done."""
        if self.done:
            return None
        return next(hop for hop in self.hops if hop.value is None)

    def set_value(self, hop: HopState, value: str) -> None:
        """Record a hop's value and make it the next hop's subject."""
        hop.value = value
        position = self.hops.index(hop)
        if value != UNKNOWN and position + 1 < len(self.hops):
            self.hops[position + 1].subject = value

    def lost_text(self, lost_line: str = "bare", style: str = "labels") -> str:
        """A lost question's line after ``Q<n>: `` (`LOST_LINES`; the question parses)."""
        if lost_line == "subject":
            return f"{self.parse.start} {LOST}"
        if lost_line == "value":
            first = self.hops[0]
            if style in FACT_STYLES:
                return RELATIONS[first.relation].fact.format(s=self.parse.start, o=UNKNOWN)
            return f"{first.label} of {self.parse.start} = {UNKNOWN}"
        return LOST

    def memory_text(self, focused: bool, style: str = "labels", lost_line: str = "bare") -> Optional[str]:
        """This question's memory line (None: no line, a question not started in the facts style);
        lost_line: how a lost question reads (`LOST_LINES`)."""
        if self.parse is None:
            return f"Q{self.number}: {UNKNOWN}"
        if self.lost:
            return f"Q{self.number}: {self.lost_text(lost_line, style)}"
        shown = [hop for hop in self.hops if hop.value is not None]
        pending = self.next_hop()
        if pending is not None and (focused or pending.tried or pending.pointer):
            shown.append(pending)
        if not shown:
            if style == "listed":
                return f"Q{self.number}: ?"
            return None if style == "facts" else f"Q{self.number}: not started"
        joiner = " " if style in FACT_STYLES else "; "
        return f"Q{self.number}: " + joiner.join(hop.memory_text(style) for hop in shown)


def parse_oracle_memory(mem: str, questions: Sequence[str]) -> tuple[int, list[ObjectiveState]]:
    """Read an oracle ``<mem>`` back: ``(step, objective states)`` for ``questions``.

    Lines that do not follow the format are ignored (a missing line means "not started"); the
    hops of each question are re-derived from its text, and the memory fills in their values.
    """
    step = 0
    recorded: dict[int, str] = {}
    for line in mem.splitlines():
        line = line.strip()
        step_match = _STEP_RE.match(line)
        if step_match:
            step = int(step_match.group(1))
            continue
        objective_match = _OBJECTIVE_RE.match(line)
        if objective_match:
            recorded[int(objective_match.group(1))] = objective_match.group(2).strip()
    objectives = [ObjectiveState.plan(number, question) for number, question in enumerate(questions, 1)]
    for objective in objectives:
        body = recorded.get(objective.number, "")
        if objective.parse is None or not body or body == "not started":
            continue
        if body == UNKNOWN:
            objective.hops[0].value = UNKNOWN
            continue
        # any `LOST_LINES` form (the labels style's "value" form is a given-up hop's line, read as such below)
        if body in {objective.lost_text(form, "facts") for form in LOST_LINES}:
            objective.lost = True
            continue
        known: dict[tuple[str, str], str] = {}
        for part in body.split("; "):
            hop_match = _HOP_RE.match(part.strip())
            if hop_match:
                relation = _LABEL_TO_RELATION[hop_match.group("label")]
                known[(relation, hop_match.group("subject"))] = hop_match.group("value").strip()
        if not known:  # not the labels style: the facts style (fact sentences, then the pending hop)
            _read_fact_line(objective, body)
            continue
        for hop in objective.hops:
            text = known.get((hop.relation, hop.subject)) if hop.subject is not None else None
            if text is None:
                break
            tried, see = _TRIED_RE.match(text), _SEE_RE.match(text)
            if tried:
                hop.tried = int(tried.group(1))
                break
            if see:
                hop.pointer = (see.group(1), int(see.group(2)))
                break
            objective.set_value(hop, text)
            if text == UNKNOWN:
                break
    return step, objectives


#: What an objective's line of an oracle-format ``<mem>`` holds (`memory_line_kinds`).
MEMORY_LINE_KINDS = ("gold", "dropped", "other", "pending")


def memory_line_kinds(mem: Optional[str], golds: Sequence[Sequence[str]]) -> list[str]:
    """For each objective i (1-based line ``Q<i>:``), what the ``<mem>`` holds for it:

    ``"gold"``: the line contains one of ``golds[i]`` (SQuAD-normalised, whole words);
    ``"dropped"``: the line is `LOST`, alone or after other words, or ends in a sentence whose value is
    `UNKNOWN` (the `LOST_LINES` forms: closed without its fact); ``"pending"``: no line, or a
    pending marker only (``?``, ``? (tried n)``, ``? see <doc> page <p>``, ``unknown``, ``not
    started``); ``"other"``: any other text (a fact of another entity, a garbled copy). ``mem``
    None (no ``<mem>`` block) counts every objective as pending.
    """
    recorded: dict[int, str] = {}
    for line in (mem or "").splitlines():
        match = _OBJECTIVE_RE.match(line.strip())
        if match:
            recorded.setdefault(int(match.group(1)), match.group(2).strip())
    kinds = []
    for number, aliases in enumerate(golds, 1):
        body = recorded.get(number)
        words = f" {normalize_answer(body)} " if body is not None else ""
        wanted = [normalize_answer(a) for a in aliases]
        if body is not None and any(a and f" {a} " in words for a in wanted):
            kinds.append("gold")
        elif body is not None and (body == LOST or body.endswith((f" {LOST}", f" {UNKNOWN}."))):
            kinds.append("dropped")
        elif body is None or body == "not started" or _PENDING_RE.fullmatch(" " + body):
            kinds.append("pending")
        else:
            kinds.append("other")
    return kinds


_PENDING_RE = re.compile(r"(?:^|\s)(?:\?(?: \(tried (?P<tried>\d+)\)| see (?P<doc>\S+) page (?P<page>\d+))?"
                         r"|(?P<unknown>" + UNKNOWN + r"))$")


def _read_fact_line(objective: ObjectiveState, body: str) -> None:
    """Fill ``objective`` from a facts-style line: its hops' fact sentences in order, then the
    pending hop's marker (``?``, ``? (tried n)``, ``? see <doc-id> page <p>`` or ``unknown``)."""
    for hop in objective.hops:
        if hop.subject is None:
            return
        match = fact_pattern(RELATIONS[hop.relation], hop.subject).search(body)
        if match:
            objective.set_value(hop, match.group("o").strip())
            continue
        pending = _PENDING_RE.search(body)
        if pending is not None:
            if pending.group("unknown"):
                objective.set_value(hop, UNKNOWN)
            elif pending.group("tried"):
                hop.tried = int(pending.group("tried"))
            elif pending.group("doc"):
                hop.pointer = (pending.group("doc"), int(pending.group("page")))
        return


def check_teacher_options(think: str, think_styles: Sequence[str], lost_line: str, drop_fact_prob: float,
                          answer_template: Optional[str]) -> None:
    """The options every teacher (`mempo.synthetic.oracle.OracleAgent`, `mempo.synthetic.ledger_oracle.LedgerOracle`)
    shares: ValueError naming the first one out of range (`think` not in `think_styles`, `lost_line` not in
    `LOST_LINES`, `drop_fact_prob` outside [0, 1], an `answer_template` `check_answer_template` refuses)."""
    if think not in think_styles:
        raise ValueError(f"think must be one of {tuple(think_styles)}, got {think!r}")
    if lost_line not in LOST_LINES:
        raise ValueError(f"lost_line must be one of {LOST_LINES}, got {lost_line!r}")
    if not 0.0 <= float(drop_fact_prob) <= 1.0:
        raise ValueError(f"drop_fact_prob must be in [0, 1], got {drop_fact_prob!r}")
    if answer_template is not None:
        try:
            check_answer_template(answer_template)
        except ValueError as exc:
            raise ValueError(f"answer_template: {exc}") from None
