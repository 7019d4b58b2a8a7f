"""The ledger task's tools, written as a user's tools are (`mempo.tools`: a `Tool` subclass and an ``@tool``
function; the agent loop knows nothing of them): `LedgerLookup` (an account -> its entry and the page listing
it; a page id -> the page) and `calc` (an arithmetic expression -> its value). `ledger_tools` makes both over a
`mempo.synthetic.ledger.Ledger`; over no ledger (`ledger_tools(None)`) the lookup finds nothing, the
closed-book evaluation's tools.

``calc`` reads a tiny grammar with its own parser (no ``eval``)::

    expr   := term (("+" | "-") term)*
    term   := factor (("*" | "/") factor)*
    factor := ("+" | "-") factor | number | "(" expr ")"
    number := digits ["." digits]

computed exactly (`fractions.Fraction`); bounded: at most `MAX_EXPRESSION_CHARS` characters,
`MAX_NUMBER_DIGITS` digits a number, `MAX_DEPTH` nested parentheses and signs, a result below
`MAX_RESULT` in magnitude. Whatever is wrong (an unknown character, a missing operand, division by zero,
a bound) is a `ToolError`, which the agent reads as one ``Error: ...`` line.
"""
from __future__ import annotations

import re
from fractions import Fraction
from typing import Any, Optional

from mempo.synthetic.ledger import Ledger
from mempo.tools import Tool, ToolError, tool

__all__ = ["LedgerLookup", "calc", "evaluate_expression", "format_value", "ledger_tools", "MAX_EXPRESSION_CHARS",
           "MAX_NUMBER_DIGITS", "MAX_DEPTH", "MAX_RESULT", "MAX_KEY_CHARS"]

MAX_EXPRESSION_CHARS = 200
MAX_NUMBER_DIGITS = 18
MAX_DEPTH = 32
MAX_RESULT = 10 ** 18
MAX_KEY_CHARS = 64
#: decimals shown of a value that is not a whole number
_DECIMALS = 6
_TOKEN_RE = re.compile(r"\s*(?:(?P<number>\d+(?:\.\d+)?)|(?P<op>[-+*/()]))")


class LedgerLookup(Tool):
    """``lookup``: an account's entry and the ledger page listing it (by its exact name: ``Found Tamor3 on L0042:
    Kodan7, Tamor3.``) or a page by its id (``L0042: Kodan7, Tamor3.``); a key that finds nothing is answered
    ``No account or page named
    'X'.`` (a result the agent reads, like a search without hits); a key that is not one line of at most
    `MAX_KEY_CHARS` characters is a `ToolError`. ledger: the book (None: an empty one, the closed book)."""

    name = "lookup"
    description = "An account's entry and the ledger page listing it, or a page by its id."
    parameters = {"type": "object", "properties": {"key": {"type": "string",
                                                           "description": "an account name or a page id"}},
                  "required": ["key"]}

    def __init__(self, ledger: Optional[Ledger] = None) -> None:
        self.ledger = ledger

    def call(self, key: Any = "") -> str:
        if not isinstance(key, str) or not key.strip():
            raise ToolError(f"lookup needs an account name or a page id, got {str(key)[:60]!r}")
        key = key.strip()
        if len(key) > MAX_KEY_CHARS or "\n" in key:
            raise ToolError(f"a lookup key is one account name or page id (at most {MAX_KEY_CHARS} characters), "
                            f"got {len(key)} characters")
        pages = self.ledger.lookup(key) if self.ledger is not None else []
        return "\n".join(pages) if pages else f"No account or page named {key!r}."


def format_value(value: Fraction) -> str:
    """An exact value as the agent reads it: a whole number in digits (``-23``), else a decimal rounded to 6
    places without trailing zeros (``3.5``, ``0.333333``)."""
    if value.denominator == 1:
        return str(value.numerator)
    text = f"{float(round(value, _DECIMALS)):.{_DECIMALS}f}".rstrip("0").rstrip(".")
    return "0" if text in ("-0", "") else text


class _Parser:
    """Recursive descent over the tokens of one expression (module docstring)."""

    def __init__(self, text: str) -> None:
        self.tokens: list[tuple[str, str]] = []
        position = 0
        stripped = text.rstrip()
        while position < len(stripped):
            match = _TOKEN_RE.match(stripped, position)
            if match is None:
                bad = stripped[position:].lstrip()[:1]
                raise ToolError(f"calc reads numbers, + - * / and parentheses; {bad!r} is not one of them")
            if match.group("number") is not None:
                digits = match.group("number").replace(".", "")
                if len(digits) > MAX_NUMBER_DIGITS:
                    raise ToolError(f"a number has at most {MAX_NUMBER_DIGITS} digits, got {len(digits)}")
                self.tokens.append(("number", match.group("number")))
            else:
                self.tokens.append(("op", match.group("op")))
            position = match.end()
        self.index = 0
        self.depth = 0

    def peek(self) -> Optional[str]:
        return self.tokens[self.index][1] if self.index < len(self.tokens) else None

    def take(self) -> tuple[str, str]:
        if self.index >= len(self.tokens):
            raise ToolError("the expression ends where a number was expected")
        token = self.tokens[self.index]
        self.index += 1
        return token

    def expression(self) -> Fraction:
        value = self.term()
        while self.peek() in ("+", "-"):
            op = self.take()[1]
            value = value + self.term() if op == "+" else value - self.term()
        return value

    def term(self) -> Fraction:
        value = self.factor()
        while self.peek() in ("*", "/"):
            op = self.take()[1]
            right = self.factor()
            if op == "/" and right == 0:
                raise ToolError("division by zero")
            value = value * right if op == "*" else value / right
        return value

    def factor(self) -> Fraction:
        kind, text = self.take()
        if kind == "number":
            return Fraction(text)
        if text in ("+", "-", "("):
            self.depth += 1
            if self.depth > MAX_DEPTH:
                raise ToolError(f"the expression nests deeper than {MAX_DEPTH} parentheses and signs")
            if text == "(":
                value = self.expression()
                if self.peek() != ")":
                    raise ToolError("a '(' is not closed")
                self.take()
            else:
                value = self.factor() if text == "+" else -self.factor()
            self.depth -= 1
            return value
        raise ToolError(f"{text!r} where a number was expected")


def evaluate_expression(expression: Any) -> Fraction:
    """The exact value of an arithmetic expression (module docstring); ToolError with a one-line reason
    for anything else."""
    if not isinstance(expression, str) or not expression.strip():
        raise ToolError("calc needs an arithmetic expression such as '35 + 12'")
    if len(expression) > MAX_EXPRESSION_CHARS:
        raise ToolError(f"the expression is {len(expression)} characters long; the limit is {MAX_EXPRESSION_CHARS}")
    parser = _Parser(expression)
    value = parser.expression()
    if parser.index < len(parser.tokens):
        raise ToolError(f"unexpected {parser.tokens[parser.index][1]!r} after a complete expression")
    if abs(value) >= MAX_RESULT:
        raise ToolError(f"the result is too large (at least 10^{len(str(MAX_RESULT)) - 1} in magnitude)")
    return value


@tool
def calc(expression: str) -> str:
    """The value of an arithmetic expression of numbers, + - * / and parentheses."""
    value = evaluate_expression(expression)
    return f"{' '.join(expression.split())} = {format_value(value)}"


def ledger_tools(ledger: Optional[Ledger]) -> list[Tool]:
    """The ledger task's tools: ``lookup`` over `ledger` (None: the closed book, it finds nothing) and ``calc``."""
    return [LedgerLookup(ledger), calc]
