"""`mempo.env.build`: the tools of ``env.tools`` (built-in names and a user's import paths, bounded by the
``env`` section), every way that list can be wrong as one ConfigError naming its entry, the retriever only
when a built-in tool needs one, and the QA prompt style that matches the tools."""
import pytest

from mempo.config import ConfigError, load_config
from mempo.env.build import build_retriever, build_tools, needs_retriever, qa_prompt_style
from mempo.env.closed_book import ClosedBookRetriever
from mempo.env.data import TOOLS_INSTRUCTIONS, make_episode_prompt, parse_episode_prompt
from mempo.tools import Tool


def test_built_in_and_user_tools_in_order_with_the_env_bounds(bm25):
    cfg = load_config(None, ["env.tools=[search, 'support.user_tools:calc_tools', 'support.user_tools:lookup']",
                             "env.tool_timeout=2", "env.tool_result_chars=100", "env.topk=2"])
    tools = build_tools(cfg, bm25)
    assert (tools.names == ("search", "calc", "alookup", "lookup")
            and all(isinstance(t, Tool) for t in tools.tools.values()))
    assert (tools.timeout, tools.max_chars, tools["search"].topk) == (2.0, 100, 2)
    assert needs_retriever(cfg) and qa_prompt_style(cfg) == "tools"


@pytest.mark.parametrize("tools, field, fragment", [
    ("['support.user_tools:nope']", "env.tools[0]", "has no attribute 'nope'"),
    ("[search, 'support.user_tools:broken_factory']", "env.tools[1]", "making the tool failed (ImportError"),
    ("['support.user_tools:lookup', 'support.user_tools:calc_tools', 'support.user_tools:async_lookup']",
     "env.tools", "two tools are named 'alookup'"),
])
def test_a_wrong_tool_list_is_one_error_naming_its_entry(bm25, tools, field, fragment):
    with pytest.raises(ConfigError) as caught:
        build_tools(load_config(None, [f"env.tools={tools}"]), bm25)
    assert caught.value.field == field and fragment in str(caught.value)


def test_the_tags_format_needs_tool_names_that_can_be_tags(bm25, monkeypatch):
    from support import user_tools

    monkeypatch.setattr(user_tools.lookup, "name", "answer")  # a name the protocol already uses
    cfg = load_config(None, ["env.tools=['support.user_tools:lookup']"])
    with pytest.raises(ConfigError, match="env.tools: a tool cannot be named 'answer' in the tags format"):
        build_tools(cfg, bm25)
    assert build_tools(load_config(None, ["env.tools=['support.user_tools:lookup']", "rollout.action_format=json"]),
                       bm25).names == ("answer",)  # a JSON call names it in its arguments: no clash


def test_no_retriever_without_a_built_in_tool(tmp_path):
    cfg = load_config(None, ["data.source=files", "env.tools=['support.user_tools:lookup']",
                             f"env.corpus_path={tmp_path / 'missing.jsonl'}"])  # never read
    assert not needs_retriever(cfg) and isinstance(build_retriever(cfg), ClosedBookRetriever)
    with pytest.raises(ConfigError, match="env.corpus_path"):
        build_retriever(load_config(None, ["data.source=files"]))  # the built-ins still need one


def test_qa_prompts_name_no_tool_unless_the_tools_are_the_built_ins():
    assert qa_prompt_style(load_config(None, [])) == "numbered"
    assert qa_prompt_style(load_config(None, ["rollout.action_format=json"])) == "tools"
    prompt = make_episode_prompt(["What colour is the sky?"], "tools")
    assert prompt.startswith(TOOLS_INSTRUCTIONS) and "<search>" not in prompt
    assert parse_episode_prompt(prompt) == ["What colour is the sky?"]
