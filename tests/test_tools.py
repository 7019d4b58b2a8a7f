"""The public tool interface (`mempo.tools`): tools written by a user (tests/support/user_tools.py, outside
the package), named by import path, called in both action formats; every way a call or a tool can go
wrong gives one bounded observation line (``ok=False``), never an exception or a hung call."""
import time

import pytest

from mempo.protocol.tags import JSON_TAG_SET, TAG_SET, tag_set_for
from mempo.tools import FunctionTool, Tool, ToolError, ToolOutput, Toolset, load_tools, tool
from support import user_tools

ALL = load_tools("support.user_tools:lookup") + load_tools("support.user_tools:calc_tools") + [
    user_tools.raises, user_tools.hangs, user_tools.hangs_async, user_tools.megabytes, user_tools.returns_int,
    user_tools.returns_bytes, user_tools.returns_none, user_tools.exits, user_tools.surrogate]


@pytest.fixture(scope="module")
def tools():
    yield Toolset(ALL, timeout=0.5, max_chars=1000)
    user_tools.RELEASE.set()  # lets the abandoned hanging call's thread end


def json_call(tools, content):
    return tools.call("tool_call", content, JSON_TAG_SET)


def body(result):
    """The observation inside the tool-result block."""
    return result.text.split(">", 1)[1].rsplit("</", 1)[0]


def test_a_decorated_function_a_subclass_and_a_factory_are_tools():
    lookup = user_tools.lookup
    assert isinstance(lookup, FunctionTool) and lookup.name == "lookup"
    assert lookup.description == "The colour stored under a key of a small table."
    assert lookup.schema() == {"type": "function", "function": {
        "name": "lookup", "description": lookup.description,
        "parameters": {"type": "object", "properties": {"key": {"type": "string"}}, "required": ["key"]}}}
    assert [t.name for t in load_tools("support.user_tools:calc_tools")] == ["calc", "alookup"]
    assert [t.name for t in load_tools("support.user_tools:Calculator")] == ["calc"]  # a class is made

    @tool(parameters={"type": "object", "properties": {"n": {"type": "integer"}, "flag": {}}})
    def counted(n: int, flag=None) -> str:
        return str(n)
    assert counted.parameters["properties"] == {"n": {"type": "integer"}, "flag": {}}
    assert tool(lambda *args: "x", name="star", parameters={"type": "object"}).name == "star"
    with pytest.raises(ValueError, match="cannot be given as a keyword"):
        tool(lambda *args: "x", name="star")
    with pytest.raises(ValueError, match="tool name '<lambda>' must be 1 to 48 characters"):
        tool(lambda: "x")


def test_calls_in_both_formats(tools):
    ok = json_call(tools, '{"name": "lookup", "arguments": {"key": "Sky"}}')
    assert ok.ok and ok.text == "<tool_response>Sky is blue</tool_response>" and ok.metadata == {"tool": "lookup"}
    assert (json_call(tools, '{"name": "calc", "arguments": {"a": 2, "b": 40}}').text
            == "<tool_response>42</tool_response>")
    assert json_call(tools, '{"name": "alookup", "arguments": "{\\"key\\": \\"grass\\"}"}').text.count("green") == 1
    tags = tag_set_for("tags", tools.names)
    assert tools.call("lookup", " apple ", tags).text == "<information>apple is red</information>"
    assert tools.call("calc", '{"a": 1, "b": 2}', tags).text == "<information>3</information>"
    assert user_tools.lookup.run("grass").text == "<information>grass is green</information>"
    assert "calc" in tools.system_prompt("sys") and tools.system_prompt("sys").startswith("sys\n\n# Tools")
    assert Toolset([]).system_prompt("sys") == "sys"


@pytest.mark.parametrize("content, fragment", [
    ('{"name": "lookup", "arguments": {"key": ', "the tool call is not valid JSON"),  # malformed JSON
    ('["lookup"]', "not an object"),
    ('{"name": "weather", "arguments": {}}', "no tool named 'weather'; the tools are: lookup, calc, alookup"),
    ('{"name": "lookup", "arguments": {}}', "the lookup call lacks the required argument(s) 'key'"),
    ('{"name": "lookup", "arguments": {"key": "a", "colour": 1}}', "has unknown argument(s) 'colour'"),
    ('{"name": "calc", "arguments": {"a": "1", "b": 2}}', "calc adds integers; got '1' and 2"),  # ToolError
    ('{"name": "raises", "arguments": {}}', "the raises tool failed (RuntimeError: the backend exploded with a "
                                            "second line); try again"),
    ('{"name": "exits", "arguments": {}}', "the exits tool failed (SystemExit: 3)"),
    ('{"name": "returns_int", "arguments": {}}', "the returns_int tool returned int, not text."),
    ('{"name": "returns_bytes", "arguments": {}}', "the returns_bytes tool returned bytes, not text."),
    ('{"name": "returns_none", "arguments": {}}', "the returns_none tool returned NoneType, not text."),
])
def test_every_bad_call_is_one_error_line(tools, content, fragment):
    result = json_call(tools, content)
    assert not result.ok and result.text.startswith("<tool_response>Error: ")
    assert fragment in body(result) and "\n" not in body(result), body(result)
    assert result.metadata["error"]


@pytest.mark.parametrize("name", ["hangs", "hangs_async"])
def test_a_hanging_tool_times_out(tools, name):
    began = time.monotonic()
    result = json_call(tools, '{"name": "%s", "arguments": {}}' % name)
    assert time.monotonic() - began < 5
    assert not result.ok and f"the {name} tool did not answer within 0.5 s" in body(result)
    assert result.metadata["timed_out"] is True


def test_megabytes_are_cut_and_surrogates_replaced(tools):
    big = json_call(tools, '{"name": "megabytes", "arguments": {}}')
    assert big.ok and len(big.text) < 1200 and big.metadata["truncated"] == 8 << 20
    assert body(big).endswith(f"[... cut: the first 1000 of {8 << 20} characters]")
    odd = json_call(tools, '{"name": "surrogate", "arguments": {}}')
    assert odd.ok and "\ud800" not in odd.text and "\ufffd" in odd.text
    odd.text.encode("utf-8")


def test_tags_format_argument_errors_and_tool_errors():
    calc = user_tools.Calculator()
    assert not calc.run("1 + 2").ok and "write the calc arguments as a JSON object" in calc.run("1 + 2").text
    assert calc.run('{"a": 1, "b": 2}').text == "<information>3</information>"

    class Fussy(Tool):
        name = "fussy"

        def call(self):
            raise ToolError("not today", reason="closed")
    result = Fussy().run("")
    assert result.text == "<information>Error: not today</information>" and result.metadata["reason"] == "closed"
    assert Fussy().run("").kind == "tool_result"


def test_tool_output_carries_metadata():
    @tool
    def found(q: str) -> str:
        return ToolOutput("hit", {"ids": [1]})
    assert found.run("x").metadata == {"tool": "found", "ids": [1]}


@pytest.mark.parametrize("path, fragment", [
    ("support.user_tools", "not an import path of the form 'package.module:name'"),
    ("support.no_such_module:lookup", "cannot import 'support.no_such_module' (ModuleNotFoundError"),
    ("support.user_tools:nope", "has no attribute 'nope'"),
    ("support.user_tools:NOT_A_TOOL", "expected a mempo.tools.Tool, got int"),
    ("support.user_tools:EMPTY", "names no tool (an empty list)"),
    ("support.user_tools:broken_factory", "making the tool failed (ImportError: needs a package"),
])
def test_bad_import_paths_are_one_clear_error(path, fragment):
    with pytest.raises(ValueError) as caught:
        load_tools(path)
    assert fragment in str(caught.value) and "\n" not in str(caught.value)


def test_toolset_refuses_ambiguous_tools():
    with pytest.raises(ValueError, match="two tools are named 'lookup'"):
        Toolset([user_tools.lookup, user_tools.lookup])
    with pytest.raises(ValueError, match="the tool under key 'search' is named 'lookup'"):
        Toolset({"search": user_tools.lookup})
    with pytest.raises(ValueError, match="expected a mempo.tools.Tool, got function"):
        Toolset([lambda q: q])
    bad = Tool()
    bad.name, bad.parameters = "x", {"type": "array"}
    with pytest.raises(ValueError, match="parameters must be a JSON schema"):
        Toolset([bad])
    with pytest.raises(ValueError, match="timeout must be > 0"):
        Toolset([], timeout=0)
    assert TAG_SET.tool_result == "information"  # the default tags a lone run() answers in
