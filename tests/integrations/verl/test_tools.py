"""verl's tools as mempo tools (`mempo.integrations.verl.tools`): `BaseTool` subclasses from a real verl tool
YAML and a verl ``@function_tool`` file, loaded by verl's own loaders, called through `mempo.tools.Toolset`
in both action formats; every failure one bounded observation; the loop's tool set and its refusals by name.
The rollouts through verl's worker with these tools are in test_agent_loop.py."""
import asyncio
import time

import pytest

pytest.importorskip("verl", reason="verl is not installed (pip install .[verl])")
pytestmark = pytest.mark.verl

from support import verl_user_tools  # noqa: E402
from support.verl_user_tools import FUNCTION_TOOLS, TOOLS, tool_yaml  # noqa: E402
from verl.tools.tool_registry import initialize_tools_from_config  # noqa: E402

from mempo.config import ConfigError, EnvConfig  # noqa: E402
from mempo.integrations.verl.tools import (TOOL_CONFIG_PATH, VerlTool, load_verl_tools, loop_toolset,  # noqa: E402
                                           tool_loop)
from mempo.protocol.tags import JSON_TAG_SET, tag_set_for  # noqa: E402
from mempo.tools import Toolset  # noqa: E402


@pytest.fixture(scope="module")
def verl_tools(tmp_path_factory):
    """Every tool of support.verl_user_tools, as verl's tool registry builds them from its YAML, by name."""
    path = tool_yaml(tmp_path_factory.mktemp("verl_tools") / "tools.yaml")
    return {t.name: t for t in initialize_tools_from_config(str(path))}


def _toolset(verl_tools, *names, timeout=5.0, max_chars=200):
    return Toolset([VerlTool(verl_tools[n], timeout=timeout) for n in names], timeout=timeout, max_chars=max_chars)


def test_a_verl_tool_is_a_mempo_tool_with_its_schema(verl_tools):
    colour = VerlTool(verl_tools["colour"])
    schema = TOOLS["colour"][2]["function"]
    assert (colour.name, colour.description, colour.parameters) == (schema["name"], schema["description"],
                                                                    schema["parameters"])
    assert colour.schema() == TOOLS["colour"][2]  # the OpenAI form mempo's json system prompt writes
    assert VerlTool(verl_tools["touch"]).parameters == {"type": "object", "properties": {}, "required": []}
    with pytest.raises(ValueError, match="str is not a verl tool"):
        VerlTool("colour")


def test_calls_run_verls_lifecycle_in_either_action_format(verl_tools):
    verl_user_tools.LIFECYCLE.clear()
    tools = _toolset(verl_tools, "colour", "touch")
    tags = tag_set_for("tags", tools.names)
    result = tools.call("colour", " grass ", tags)  # tags format: the one property is the text
    assert result.ok and result.text == "<information>grass is green</information>" and result.kind == "tool_result"
    assert result.metadata["tool"] == "colour" and result.metadata["verl_reward"] == 0.5
    result = tools.call("tool_call", '{"name": "colour", "arguments": {"thing": "snow"}}', JSON_TAG_SET)
    assert result.ok and result.text == "<tool_response>snow is white</tool_response>"
    assert tools.call("tool_call", '{"name": "touch", "arguments": {}}', JSON_TAG_SET).text == (
        "<tool_response>Updated the tool state.</tool_response>")  # verl's own BaseTool
    calls = verl_user_tools.LIFECYCLE
    assert [c[0] for c in calls] == ["create", "execute", "release"] * 2
    assert calls[0][2] == {"create_kwargs": {}} and calls[1][2] == {"thing": "grass"} and calls[0][1] == calls[2][1]
    assert calls[3][1] != calls[0][1]  # one instance per call


def test_a_verl_function_tool_is_called_with_its_arguments():
    [shout] = load_verl_tools(None, str(FUNCTION_TOOLS))  # verl's own loader, by path
    tools = Toolset([VerlTool(shout)])
    assert VerlTool(shout).parameters["required"] == ["text"]
    assert tools.call("tool_call", '{"name": "shout", "arguments": {"text": "hi"}}', JSON_TAG_SET).text == (
        "<tool_response>HI!</tool_response>")
    result = tools.call("tool_call", '{"name": "shout", "arguments": {"txt": "hi"}}', JSON_TAG_SET)
    assert not result.ok and "lacks the required argument(s) 'text'" in result.text


def test_every_failure_of_a_verl_tool_is_one_bounded_line(verl_tools):
    verl_user_tools.LIFECYCLE.clear()
    tools = _toolset(verl_tools, "explode", "sleep", "flood", "picture", "silent", "colour", timeout=0.5)

    def call(name, arguments="{}"):
        return tools.call("tool_call", f'{{"name": "{name}", "arguments": {arguments}}}', JSON_TAG_SET)

    exploded = call("explode")
    assert not exploded.ok and exploded.text == (
        "<tool_response>Error: the explode tool failed (RuntimeError: the sandbox is down second line); try again or "
        "answer with what you know.</tool_response>")
    assert [c[0] for c in verl_user_tools.LIFECYCLE] == ["create", "release"]  # released after the raise
    began = time.perf_counter()
    slept = call("sleep")
    assert time.perf_counter() - began < 5 and not slept.ok and slept.metadata["timed_out"]
    assert "the sleep tool did not answer within 0.5 s" in slept.text
    time.sleep(0.2)  # the hung call was cancelled on the tools' loop, not left running

    async def pending():
        return [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]

    assert asyncio.run_coroutine_threadsafe(pending(), tool_loop()).result(5) == []
    flooded = call("flood")
    assert flooded.ok and flooded.metadata["truncated"] == 1 << 20
    assert flooded.text == "<tool_response>" + "y" * 200 + "\n[... cut: the first 200 of 1048576 characters]" \
                           "</tool_response>"
    picture = call("picture")
    assert not picture.ok and "the picture tool returned an image or a video; the mempo loops read text only" in \
        picture.text
    assert call("silent").text == "<tool_response></tool_response>"  # verl's empty response: empty text
    malformed = tools.call("tool_call", '{"name": "colour", "arguments": {"thing": ', JSON_TAG_SET)
    assert not malformed.ok and malformed.text.startswith("<tool_response>Error: the tool call is not valid JSON")
    unknown = call("weather")
    assert unknown.text == ("<tool_response>Error: no tool named 'weather'; the tools are: explode, sleep, flood, "
                            "picture, silent, colour</tool_response>")
    for result in (exploded, slept, picture, malformed, unknown):
        assert "\n" not in result.text


def _env(**values):
    return EnvConfig(**{"tools": ["support.user_tools:lookup"], **values})


def test_the_loops_tools_are_env_tools_then_verls_with_the_env_limits(verl_tools):
    toolset = loop_toolset(_env(tool_timeout=2.0, tool_result_chars=50), "json",
                           [verl_tools["colour"], verl_tools["flood"]], entry="mempo_agent")
    assert toolset.names == ("lookup", "colour", "flood") and (toolset.timeout, toolset.max_chars) == (2.0, 50)
    assert toolset["colour"].timeout == 2.0
    assert "[... cut: the first 50 of" in toolset.call("tool_call", '{"name": "flood", "arguments": {}}',
                                                       JSON_TAG_SET).text
    prompt = toolset.system_prompt("sys")
    assert prompt.index('"name": "lookup"') < prompt.index('"name": "colour"') < prompt.index('"name": "flood"')


def test_the_loops_tools_are_refused_by_name(verl_tools, tmp_path):
    from verl.tools.schemas import OpenAIFunctionToolSchema

    from support.verl_user_tools import ColourBook

    def named(name):
        schema = dict(TOOLS["colour"][2], function=dict(TOOLS["colour"][2]["function"], name=name))
        return ColourBook({"type": "native", "table": {}}, OpenAIFunctionToolSchema.model_validate(schema))

    with pytest.raises(ConfigError, match=r"^mempo_agent\.env\.tools: tool\(s\) \['lookup'\] are both in env\.tools "
                                          r"and among verl's tools"):
        loop_toolset(_env(), "json", [named("lookup")], entry="mempo_agent")
    with pytest.raises(ConfigError, match=r"^mempo_agent_eval\.env\.tools: a tool cannot be named 'answer' in the "
                                          r"tags format"):
        loop_toolset(_env(), "tags", [named("answer")], entry="mempo_agent_eval")
    assert loop_toolset(_env(), "json", [named("answer")], entry="e").names == ("lookup", "answer")  # a JSON name
    with pytest.raises(ConfigError, match=rf"^{TOOL_CONFIG_PATH}: verl tool ColourBook: tool name 'my tool' must be"):
        loop_toolset(_env(), "json", [named("my tool")], entry="e")
    with pytest.raises(ConfigError, match=r"^mempo_agent\.env\.tools\[0\]: 'support\.user_tools:nothing'"):
        loop_toolset(EnvConfig(tools=["support.user_tools:nothing"]), "json", [], entry="mempo_agent")
    with pytest.raises(ConfigError, match=rf"^{TOOL_CONFIG_PATH}: cannot load the verl tools of .*missing\.yaml"):
        load_verl_tools(str(tmp_path / "missing.yaml"), None)
    bad = tmp_path / "bad.yaml"
    bad.write_text("tools:\n  - class_name: support.verl_user_tools.NoSuchTool\n    config: {type: native}\n")
    with pytest.raises(ConfigError, match=r"cannot load the verl tools of .*bad\.yaml \(AttributeError: .*NoSuchTool"):
        load_verl_tools(str(bad), None)
