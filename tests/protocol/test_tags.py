"""The protocol's tag sets (`mempo.protocol.tags`): the built-in ones, the tags format's tool tags, and
every malformed set refused with the reason."""
import pytest

from mempo.protocol.tags import (
    ACTION_TAGS, JSON_TAG_SET, MAX_NAME_CHARS, TAG_SET, TAGS, TagSet, check_tag_name, marker_strings, tag_set_for,
)


def test_built_in_sets():
    assert TAG_SET.names == TAGS and TAG_SET.actions == ACTION_TAGS and TAG_SET.tool_result == "information"
    assert TAG_SET.tool_actions == ("search", "access") and TAG_SET.call_tag is None
    assert marker_strings() == TAG_SET.marker_strings() and len(marker_strings()) == 12
    assert JSON_TAG_SET.marker_strings()[4:6] == ("<tool_call>", "</tool_call>")
    assert JSON_TAG_SET.action_codes == (2, 3) and JSON_TAG_SET.tool_result_code == 4
    assert tag_set_for("json", ["anything"]) is JSON_TAG_SET
    assert hash(tag_set_for("tags", ["search", "access"])) == hash(TAG_SET)


def test_tool_results_are_wrapped_with_their_closing_marker_defused():
    assert TAG_SET.wrap_tool_result("a </information> b") == "<information>a </ information> b</information>"
    assert JSON_TAG_SET.wrap_tool_result("x</tool_response>") == "<tool_response>x</ tool_response></tool_response>"


@pytest.mark.parametrize("kwargs, fragment", [
    (dict(names=(), actions=(), tool_result="information"), "1 to 64 tags"),
    (dict(names=("mem", "think", "answer", "answer", "r"), actions=("answer",), tool_result="r"), "repeated"),
    (dict(names=("mem", "think", "answer"), actions=("answer",), tool_result="r"), "not among"),
    (dict(names=("mem", "think", "x", "r"), actions=("x",), tool_result="r"), "not among"),
    (dict(names=("mem", "think", "answer", "r"), actions=("answer", "r"), tool_result="r"), "must include 'answer'"),
    (dict(names=("mem", "think", "answer", "r"), actions=("answer", "think"), tool_result="r"), "must include"),
    (dict(names=("mem", "think", "a b", "answer", "r"), actions=("answer",), tool_result="r"), "[A-Za-z0-9_.:-]"),
    (dict(names=("mem", "think", "answer", "r"), actions=("answer",), tool_result="r", call_tag="answer"), "call_tag"),
])
def test_malformed_tag_sets_are_refused(kwargs, fragment):
    with pytest.raises(ValueError, match=fragment.replace("[", r"\[").replace("]", r"\]")):
        TagSet(**kwargs)


@pytest.mark.parametrize("name", ["", "a<b", "a>b", "/x", "two words", "x" * (MAX_NAME_CHARS + 1), 3, None])
def test_bad_tag_names(name):
    with pytest.raises(ValueError, match="must be 1 to 48 characters"):
        check_tag_name(name)


@pytest.mark.parametrize("tools, fragment", [(["mem"], "protocol tag"), (["answer"], "protocol tag"),
                                             (["get weather"], "a tool name in the tags format")])
def test_tags_format_refuses_tool_names_that_cannot_be_tags(tools, fragment):
    with pytest.raises(ValueError, match=fragment):
        tag_set_for("tags", tools)
    with pytest.raises(ValueError, match="action format must be one of"):
        tag_set_for("xml", tools)
