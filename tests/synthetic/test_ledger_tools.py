"""The ledger's tools (mempo.synthetic.ledger_tools), called as the agent calls them: JSON tool calls through
`mempo.tools.Toolset.call`. Whatever the input, the agent reads one line; the tools are user-style tools
(a `Tool` subclass, an ``@tool`` function) that load by import path like a user's."""

from fractions import Fraction

import pytest

from mempo.protocol.tags import JSON_TAG_SET
from mempo.synthetic.ledger import Ledger
from mempo.synthetic.ledger_tools import (
    MAX_DEPTH, MAX_EXPRESSION_CHARS, MAX_KEY_CHARS, LedgerLookup, calc, evaluate_expression, format_value, ledger_tools,
)
from mempo.tools import FunctionTool, Tool, Toolset, load_tools


@pytest.fixture(scope="module")
def ledger():
    return Ledger.generate(seed=0, num_accounts=80)


@pytest.fixture(scope="module")
def toolset(ledger):
    return Toolset(ledger_tools(ledger))


def call(toolset, name, **arguments):
    import json

    return toolset.call("tool_call", json.dumps({"name": name, "arguments": arguments}), JSON_TAG_SET)


def body(result):
    assert result.text.startswith("<tool_response>") and result.text.endswith("</tool_response>")
    return result.text[len("<tool_response>"):-len("</tool_response>")]


def test_they_are_user_style_tools_that_load_by_import_path():
    assert isinstance(calc, FunctionTool) and issubclass(LedgerLookup, Tool)
    loaded = load_tools("mempo.synthetic.ledger_tools:calc") + load_tools("mempo.synthetic.ledger_tools:LedgerLookup")
    assert [t.name for t in loaded] == ["calc", "lookup"]
    assert loaded[1].ledger is None  # made without a ledger: the closed book
    assert body(call(Toolset(loaded), "lookup", key="Tamor")) == "No account or page named 'Tamor'."
    assert calc.parameters == {"type": "object", "properties": {"expression": {"type": "string"}},
                               "required": ["expression"]}


def test_lookup_shows_an_accounts_entry_and_page_or_a_page_by_id(toolset, ledger):
    account = ledger.entities[5]
    page = ledger.page_text(account.doc_id)
    entry = f"Found {account.name}{ledger.amounts[5]} on {page}"
    for key, shown in ((account.name, entry), (f" {account.name} ", entry), (account.doc_id, page)):
        result = call(toolset, "lookup", key=key)
        assert result.ok and body(result) == shown
    # three other accounts beside it
    assert f" {account.name}{ledger.amounts[5]}" in f" {page}" and page.count(",") == 3


@pytest.mark.parametrize("arguments, ok, expected", [
    # an unknown account: a result, like a search without hits
    ({"key": "Nobody"}, True, "No account or page named 'Nobody'."),
    ({"key": "L9999"}, True, "No account or page named 'L9999'."),
    ({"key": ""}, False, "Error: lookup needs an account name or a page id, got ''"),
    ({"key": 17}, False, "Error: lookup needs an account name or a page id, got '17'"),
    ({"key": "x" * (MAX_KEY_CHARS + 1)}, False, f"at most {MAX_KEY_CHARS} characters"),
    ({"key": "Tamor\nBelis"}, False, "Error: a lookup key is one account name or page id"),
    ({}, False, "Error: the lookup call lacks the required argument(s) 'key'"),
    ({"key": "a", "page": 2}, False, "Error: the lookup call has unknown argument(s) 'page'"),
])
def test_bad_lookups_are_one_line(toolset, arguments, ok, expected):
    result = call(toolset, "lookup", **arguments)
    assert result.ok is ok and expected in body(result) and "\n" not in body(result)


@pytest.mark.parametrize("expression, value", [
    ("35 + 12", "35 + 12 = 47"), ("35 - 12 - 30", "35 - 12 - 30 = -7"), ("2 + 3 * 4", "2 + 3 * 4 = 14"),
    ("(2 + 3) * 4", "(2 + 3) * 4 = 20"), ("-(-3)", "-(-3) = 3"), ("7 / 2", "7 / 2 = 3.5"), ("1/3", "1/3 = 0.333333"),
    ("  10   +5 ", "10 +5 = 15"), ("0.1 + 0.2", "0.1 + 0.2 = 0.3"), ("+4", "+4 = 4"), ("2/3 - 2/3", "2/3 - 2/3 = 0"),
])
def test_calc_computes_exactly(toolset, expression, value):
    result = call(toolset, "calc", expression=expression)
    assert result.ok and body(result) == value


@pytest.mark.parametrize("expression, reason", [
    ("2 ** 3", "'*' where a number was expected"),
    ("1 +", "the expression ends where a number was expected"),
    ("(1 + 2", "a '(' is not closed"),
    ("1 + 2)", "unexpected ')' after a complete expression"),
    ("__import__('os')", "calc reads numbers, + - * / and parentheses; '_' is not one of them"),
    ("1 / (2 - 2)", "division by zero"),
    ("", "calc needs an arithmetic expression"),
    ("9" * 19, "a number has at most 18 digits, got 19"),
    ("1" + " + 1" * 60, f"the limit is {MAX_EXPRESSION_CHARS}"),         # a huge expression
    ("(" * (MAX_DEPTH + 1) + "1" + ")" * (MAX_DEPTH + 1), f"deeper than {MAX_DEPTH}"),
    ("-" * (MAX_DEPTH + 1) + "1", f"deeper than {MAX_DEPTH}"),
    ("999999999999999999 * 999999999999999999", "the result is too large"),
    ("1 2", "unexpected '2' after a complete expression"),
])
def test_malformed_or_huge_expressions_are_one_line(toolset, expression, reason):
    result = call(toolset, "calc", expression=expression)
    assert not result.ok and body(result).startswith("Error: ") and reason in body(result)
    assert "\n" not in body(result)


def test_calc_refuses_what_is_not_an_expression(toolset):
    for value in (12, None, ["1 + 1"]):
        result = call(toolset, "calc", expression=value)
        assert not result.ok and "calc needs an arithmetic expression" in body(result)
    assert evaluate_expression("3 * (4 - 1)") == Fraction(9)
    assert format_value(Fraction(-1, 3)) == "-0.333333" and format_value(Fraction(1, 10**9)) == "0"


def test_closed_book_lookup_finds_nothing_and_calc_still_calculates():
    closed = Toolset(ledger_tools(None))
    assert body(call(closed, "lookup", key="L0001")) == "No account or page named 'L0001'."
    assert body(call(closed, "calc", expression="1 + 1")) == "1 + 1 = 2"
