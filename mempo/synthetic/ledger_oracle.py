"""The ledger task's teacher: `LedgerOracle`, a rule-based policy that answers ledger questions by the
MemPO protocol with JSON tool calls (``rollout.action_format: json``), and `ledger_memory_kinds`, what a
``<mem>`` holds for each account (the demo's report counts them).

It knows the question grammar (`mempo.synthetic.ledger.parse_ledger_question`) and the call form, never
the ledger: every amount comes from a lookup result, and everything it knows travels in its own
``<mem>``, one line per account of the question from the first round on, then the calculation's result::

    <mem>
    1. Tamor3
    2. Belis ?
    </mem>
    <think>
    Look up.
    </think>
    <tool_call>{"name": "lookup", "arguments": {"key": " Belis"}}</tool_call>

A round after the last lookup calls ``calc`` (``{"expression": "3 + 1"}``; none for a one-account
question), the next writes ``Result 4`` under the account lines and answers. Names are written after a
space everywhere (the JSON argument too: ``" Belis"``), so that a byte-level BPE whose words carry their
leading space (GPT-2's, Qwen's) spells a name the same way in the question, the page, the ``<mem>``, the
call and the answer, and a small model copies one id; an amount follows its name without a space, as on
the page (``Tamor3``: `mempo.synthetic.ledger`).

Imperfect where the search demo's teacher is (`mempo.synthetic.oracle.OracleAgent`): with probability
``drop_fact_prob`` an amount a later round needs is closed in the ``<mem>`` without its number (``lost_line``
``"subject"``: ``1. Tamor done``; ``"bare"``: ``1. done``; ``"value"``: ``1. Tamor unknown``); later rounds
read it back as lost, do not look it up again, and the answer is ``unknown``. The draw is a pure function
of (``drop_seed``, the user prompt, the account's position).
"""
from __future__ import annotations

import json
import random
import re
from dataclasses import dataclass
from typing import Mapping, Optional, Sequence, Union

from mempo.env.data import DataError, parse_episode_prompt
from mempo.protocol.grammar import ToolCallError, parse_round, parse_tool_call
from mempo.protocol.tags import JSON_TAG_SET
from mempo.synthetic.ledger import expression_of, parse_ledger_question
from mempo.synthetic.oracle_memory import LOST, UNKNOWN, check_teacher_options

__all__ = ["LedgerOracle", "LEDGER_MEMORY_KINDS", "ledger_memory_kinds", "parse_ledger_memory"]

#: A found amount, pending (None), lost (`LOST`) or not found (`UNKNOWN`).
Value = Union[int, str, None]
_LINE_RE = re.compile(r"^(\d+)\. (.*)$")
_TRAILING_NUMBER_RE = re.compile(r"(-?\d+(?:\.\d+)?)$")
_RESULT_RE = re.compile(r"^Result (.*)$")
_CALC_RESULT_RE = re.compile(r"= (-?\d+(?:\.\d+)?)\s*$")


def _body_value(body: str) -> Value:
    """What a memory line's text after its name holds: an int / decimal text, None (``?``), LOST, UNKNOWN."""
    body = body.strip()
    if body == LOST or body.endswith(" " + LOST):
        return LOST
    if body == UNKNOWN or body.endswith(" " + UNKNOWN):
        return UNKNOWN
    match = _TRAILING_NUMBER_RE.search(body.split(" ")[-1]) if body else None  # "Tamor3", "Result 4"
    if match is None:
        return None
    number = match.group(1)
    return int(number) if number.lstrip("-").isdigit() else number


def parse_ledger_memory(mem: Optional[str], k: int) -> tuple[list[Value], Value]:
    """The per-account values (k of them, in the question's order) and the result a teacher-format ``<mem>``
    holds (`_body_value`; None where a line is missing or pending)."""
    values: list[Value] = [None] * k
    result: Value = None
    for line in (mem or "").splitlines():
        line = line.strip()
        match = _LINE_RE.match(line)
        if match and 1 <= int(match.group(1)) <= k:
            values[int(match.group(1)) - 1] = _body_value(match.group(2))
            continue
        match = _RESULT_RE.match(line)
        if match:
            result = _body_value(match.group(1))
    return values, result


@dataclass(frozen=True)
class _Plan:
    action: str  # "lookup", "calc" or "answer"
    argument: str


class LedgerOracle:
    """A rule-based policy on chat messages: `respond(messages)` returns one assistant round (module docstring).

    It reads only the question (the first user message), the ``<mem>`` and the call of the last assistant
    message and the tool result right after it, so under the memory context it works as under the full one.
    Policy: look up the first account still pending; with every amount found, calculate (`expression_of`)
    and answer the result (``larger``: the first account when the difference is positive, else the second);
    a lost or not found amount makes the answer ``unknown``.

    Args:
        think: ``"minimal"`` (``Look up.``), ``"short"`` (``Look up Tamor.``) or ``"full"`` (a sentence).
        drop_fact_prob, drop_seed, lost_line: the deliberately imperfect memory (module docstring).
        answer_template: the answer round's text after ``</mem>`` with ``{answer}`` once (None:
            ``"\\n<think>\\n<think text>\\n</think>\\n<answer> <answer> </answer>"``); the teacher-scoring
            template makes the answer round exactly what teacher scoring puts after a ``<mem>``.
    """

    THINK_STYLES = ("full", "short", "minimal")

    def __init__(self, *, think: str = "minimal", drop_fact_prob: float = 0.0, drop_seed: int = 0,
                 lost_line: str = "subject", answer_template: Optional[str] = None) -> None:
        check_teacher_options(think, self.THINK_STYLES, lost_line, drop_fact_prob, answer_template)
        self.think, self.drop_fact_prob, self.drop_seed = think, float(drop_fact_prob), int(drop_seed)
        self.lost_line, self.answer_template = lost_line, answer_template

    def respond(self, messages: Sequence[Mapping[str, str]]) -> str:
        """The next assistant round for a prompt of chat messages (system, user question, ...)."""
        prompt = next(m for m in messages if m["role"] == "user")["content"]
        try:
            parsed = parse_ledger_question(parse_episode_prompt(prompt)[0])
        except DataError:
            parsed = None
        if parsed is None:  # outside the grammar: nothing to look up
            return self._round([], None, "", _Plan("answer", UNKNOWN))
        kind, accounts = parsed
        last = max((i for i, m in enumerate(messages) if m["role"] == "assistant"), default=None)
        values: list[Value] = [None] * len(accounts)
        result: Value = None
        found: list[int] = []
        if last is not None:
            previous = parse_round(messages[last]["content"], JSON_TAG_SET)
            values, result = parse_ledger_memory(previous.mem, len(accounts))
            tool_text = messages[last + 1]["content"] if last + 1 < len(messages) \
                and messages[last + 1]["role"] == "user" else None
            call = _call_of(previous.argument) if previous.action == "tool_call" else None
            if tool_text is not None and call is not None:
                found, result = self._observe(call, tool_text, accounts, values, result)
        plan = self._plan(kind, accounts, values, result)
        if plan.action != "answer" and self.drop_fact_prob > 0:  # a later round needs what this one found
            for i in found:
                if self._drops(prompt, i):
                    values[i] = LOST
            plan = self._plan(kind, accounts, values, result)
        return self._round(accounts, (values, result), kind, plan)

    # -- steps ---------------------------------------------------------------------------------

    @staticmethod
    def _observe(call: tuple[str, dict], tool_text: str, accounts: Sequence[str], values: list[Value],
                 result: Value) -> tuple[list[int], Value]:
        """Read a tool result into `values` / the result; returns the positions of newly found amounts and the
        result. A lookup that does not show the account it asked for marks it `UNKNOWN`."""
        name, arguments = call
        found = []
        if name == "lookup":
            for i, account in enumerate(accounts):
                if values[i] is not None:
                    continue
                match = re.search(rf"(?<!\w){re.escape(account)}(\d+)(?!\d)", tool_text)
                if match:
                    values[i] = int(match.group(1))
                    found.append(i)
            asked = str(arguments.get("key", "")).strip()
            if asked in accounts and values[accounts.index(asked)] is None:
                values[accounts.index(asked)] = UNKNOWN
        elif name == "calc":
            match = _CALC_RESULT_RE.search(tool_text.replace("</tool_response>", ""))
            value = match.group(1) if match else UNKNOWN
            result = int(value) if value.lstrip("-").isdigit() else value
        return found, result

    @staticmethod
    def _plan(kind: str, accounts: Sequence[str], values: Sequence[Value], result: Value) -> _Plan:
        pending = next((i for i, v in enumerate(values) if v is None), None)
        if pending is not None:
            return _Plan("lookup", accounts[pending])
        if any(v in (LOST, UNKNOWN) or not isinstance(v, int) for v in values):
            return _Plan("answer", UNKNOWN)
        if kind == "balance":
            return _Plan("answer", str(values[0]))
        if result is None:
            return _Plan("calc", expression_of(kind, values))
        if result in (LOST, UNKNOWN):
            return _Plan("answer", UNKNOWN)
        if kind == "larger":
            larger_first = not str(result).startswith("-") and str(result) != "0"
            return _Plan("answer", accounts[0] if larger_first else accounts[1])
        return _Plan("answer", str(result))

    def _drops(self, prompt: str, position: int) -> bool:
        draw = random.Random(f"mempo-ledger-oracle/drop/{self.drop_seed}/{position}/{prompt}").random()
        return draw < self.drop_fact_prob

    # -- text ----------------------------------------------------------------------------------

    def _line(self, position: int, account: str, value: Value) -> str:
        if value == LOST:
            body = {"bare": LOST, "subject": f"{account} {LOST}", "value": f"{account} {UNKNOWN}"}[self.lost_line]
        elif value is None or value == UNKNOWN:
            body = f"{account} {'?' if value is None else UNKNOWN}"
        else:
            body = f"{account}{value}"  # the amount right after the name, as the page writes it
        return f"{position}. {body}"

    def _round(self, accounts: Sequence[str], state: Optional[tuple[list[Value], Value]], kind: str,
               plan: _Plan) -> str:
        lines = []
        if state is not None:
            values, result = state
            lines = [self._line(i, a, v) for i, (a, v) in enumerate(zip(accounts, values), 1)]
            if result is not None:
                lines.append(f"Result {LOST if result == LOST else result}")
        mem = "<mem>\n" + "\n".join(lines) + "\n</mem>" if lines else "<mem>\n</mem>"
        if plan.action == "answer" and self.answer_template is not None:
            return mem + self.answer_template.replace("{answer}", plan.argument)
        think = self._think(plan, kind)
        if plan.action == "answer":
            return mem + f"\n<think>\n{think}\n</think>\n<answer> {plan.argument} </answer>"
        arguments = {"key": " " + plan.argument} if plan.action == "lookup" else {"expression": plan.argument}
        call = json.dumps({"name": plan.action, "arguments": arguments}, ensure_ascii=False)
        return mem + f"\n<think>\n{think}\n</think>\n<tool_call>{call}</tool_call>"

    def _think(self, plan: _Plan, kind: str) -> str:
        verb = {"lookup": "Look up", "calc": "Calculate", "answer": "Answer"}[plan.action]
        if self.think == "minimal":
            return f"{verb}."
        if self.think == "short":
            return f"{verb} {plan.argument}."
        if plan.action == "lookup":
            return f"I need the balance of {plan.argument}, so I look it up."
        if plan.action == "calc":
            return f"I have every balance the question needs, so I calculate {plan.argument}."
        return f"The {kind or 'question'} is {plan.argument}, so I answer."


def _call_of(content: Optional[str]) -> Optional[tuple[str, dict]]:
    try:
        return parse_tool_call(content or "")
    except ToolCallError:
        return None


#: What a ``<mem>`` holds for one account (`ledger_memory_kinds`).
LEDGER_MEMORY_KINDS = ("kept", "dropped", "other", "pending")


def ledger_memory_kinds(mem: Optional[str], amounts: Sequence[int]) -> list[str]:
    """For each account of a question (line ``<i>.`` of a teacher-format ``<mem>``): ``"kept"`` (the line ends
    in its amount, ``Tamor3``), ``"dropped"`` (`LOST` or `UNKNOWN`: closed without its number), ``"pending"`` (no
    line, or ``?``) or ``"other"`` (any other text: another number, a garbled copy). ``mem`` None: all pending."""
    bodies: dict[int, str] = {}
    for line in (mem or "").splitlines():
        match = _LINE_RE.match(line.strip())
        if match:
            bodies.setdefault(int(match.group(1)), match.group(2).strip())
    kinds = []
    for position, amount in enumerate(amounts, 1):
        body = bodies.get(position)
        value = _body_value(body) if body is not None else None
        if body is not None and value == amount:
            kinds.append("kept")
        elif value in (LOST, UNKNOWN):
            kinds.append("dropped")
        elif body is None or value is None and body.endswith("?"):
            kinds.append("pending")
        else:
            kinds.append("other")
    return kinds
