"""Turn protocol on text (`mempo.protocol.grammar`): rounds, access arguments, format rules, answer."""
import random
import re
import sys

import pytest

from mempo.protocol import grammar as protocol, reward
from mempo.protocol.grammar import (
    FORMAT_RULES,
    Round,
    ToolCallError,
    extract_solution,
    find_blocks,
    last_mem,
    parse_access_argument,
    parse_round,
    parse_tool_call,
    split_rounds,
    validate_format,
)
from mempo.protocol.reward import compute_score
from mempo.protocol.tags import JSON_TAG_SET, TAG_SET, tag_set_for
from support.degenerate_tags import degenerate_texts

R1_SEARCH = "<mem></mem>\n<think>need the film</think>\n<search>2010 best picture</search>"
INFO_1 = "\n<information>The Hurt Locker won Best Picture.</information>\n"
R2_ACCESS = ("<mem>Best Picture 2010: The Hurt Locker</mem>\n<think>find the director</think>\n"
             "<access>https://en.wikipedia.org/wiki/The_Hurt_Locker 2</access>")
INFO_2 = "\n<information>Directed by Kathryn Bigelow.</information>\n"
R3_ANSWER = ("<mem>The Hurt Locker (2010 winner) was directed by Kathryn Bigelow</mem>\n"
             "<think>done</think>\n<answer> Kathryn Bigelow </answer>")
THREE_ROUNDS = R1_SEARCH + INFO_1 + R2_ACCESS + INFO_2 + R3_ANSWER

WELL_FORMED = [
    THREE_ROUNDS,
    "<mem>nothing yet</mem><think>easy</think><answer>Paris</answer>",
    "<think>round 1 may omit its memory</think><answer>Paris</answer>",
    "<think>t</think><search>q</search><information>doc</information>"
    "<mem>m</mem><think>t</think><answer>a</answer>",
    "\n  <mem> </mem>\n<think>t</think>\n<answer>a</answer>\n",
]


# ---------------------------------------------------------------------------------------------
# Rounds
# ---------------------------------------------------------------------------------------------


def test_split_rounds_fields_and_information_attached_to_its_round():
    rounds = split_rounds(THREE_ROUNDS)
    assert [r.index for r in rounds] == [0, 1, 2]
    first, second, third = rounds
    assert (first.mem, first.think, first.action, first.argument) == (
        "", "need the film", "search", "2010 best picture")
    assert first.information == "The Hurt Locker won Best Picture."
    assert (first.doc_id, first.page) == (None, None)
    assert second.mem == "Best Picture 2010: The Hurt Locker"
    assert second.action == "access"
    assert second.doc_id == "https://en.wikipedia.org/wiki/The_Hurt_Locker"
    assert second.page == 2
    assert second.information == "Directed by Kathryn Bigelow."
    assert third.action == "answer" and third.argument == "Kathryn Bigelow"
    assert third.information is None


def test_round_texts_concatenate_back_to_the_response():
    rounds = split_rounds(THREE_ROUNDS)
    assert "".join(r.text for r in rounds) == THREE_ROUNDS
    assert rounds[0].text == R1_SEARCH + INFO_1
    assert rounds[1].text == R2_ACCESS + INFO_2
    assert rounds[2].text == R3_ANSWER
    for r in rounds:
        assert THREE_ROUNDS[r.start:r.end] == r.text


def test_empty_and_plain_text():
    assert split_rounds("") == []
    assert split_rounds(" \n ") == []
    (only,) = split_rounds("no tags here")
    assert (only.mem, only.think, only.action, only.argument) == (None, None, None, None)
    empty = parse_round("")
    assert isinstance(empty, Round) and empty.action is None and empty.text == ""


def test_parse_round_reads_the_first_round_only():
    r = parse_round(R2_ACCESS)
    assert r.mem == "Best Picture 2010: The Hurt Locker" and r.think == "find the director"
    assert r.text == R2_ACCESS
    two_actions = "<mem>m</mem><think>t</think><search>a</search><search>b</search>"
    assert parse_round(two_actions).argument == "a"


@pytest.mark.parametrize("argument, expected", [
    ("https://x.org/page", ("https://x.org/page", None)),
    ("https://x.org/page 3", ("https://x.org/page", 3)),
    ("  doc-17   [2] ", ("doc-17", 2)),
    ("The Hurt Locker 1", ("The Hurt Locker", 1)),
    ("42", ("42", None)),
    ("doc-17 page2", ("doc-17 page2", None)),
    ("doc-17 -1", ("doc-17 -1", None)),
    ("doc-17 [3", ("doc-17 [3", None)),
])
def test_parse_access_argument(argument, expected):
    assert parse_access_argument(argument) == expected
    r = parse_round(f"<mem>m</mem><think>t</think><access>{argument}</access>")
    assert (r.doc_id, r.page) == expected


def test_blocks_match_the_token_scanner_grammar():
    """Same blocks and round numbers as the reference of the C++ scanner, on malformed text too."""
    reference = pytest.importorskip("mempo.ops.reference.spans")
    from mempo.ops.spans import TAGS

    texts = WELL_FORMED + [
        "<mem>a<think>b</think></mem><search>q</search>",
        "</mem><mem>m</mem><think>t</think><answer>x",
        "<search>a</search><search>b</search><information><answer>no</answer><mem></information>",
        "<think>t</think><mem>m</mem><answer>a</answer><information>late</information><think>",
        "text <mem>m</mem> more <think>t</think><access>d 1</access>tail",
    ]
    for text in texts:
        assert text.isascii()
        ours = [(TAGS.index(b.tag), b.start, b.end, b.round, b.closed) for b in find_blocks(text)]
        assert ours == reference.blocks_of_text_reference(text.encode()), text
        rounds = split_rounds(text)
        assert [b for r in rounds for b in r.blocks] == find_blocks(text)
        assert "".join(r.text for r in rounds) == text


# ---------------------------------------------------------------------------------------------
# Format rules
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("text", WELL_FORMED)
def test_well_formed_examples_pass_every_rule(text):
    report = validate_format(text)
    assert report.ok, report.messages
    assert report.failed_rules == () and report.messages == ()


def test_rules_are_named_and_documented():
    assert list(FORMAT_RULES) == [
        "well_formed_tags", "no_nested_tags", "tag_order", "one_action_per_round",
        "information_answers_tool_call", "mem_required_after_first_round",
        "answer_last_and_nonempty", "no_text_outside_tags", "ends_with_answer",
    ]
    assert all(isinstance(text, str) and text for text in FORMAT_RULES.values())


# A minimal example per rule that breaks that rule and no other.
FAILING = [
    ("well_formed_tags", "<mem>m</mem></mem><think>t</think><answer>a</answer>"),
    ("well_formed_tags", "<mem>m</mem><think>t<answer>a</answer>"),
    ("no_nested_tags", "<mem>m</mem><think>t <answer>a</answer></think>"),
    ("tag_order", "<think>t</think><mem>m</mem><answer>a</answer>"),
    ("tag_order", "<mem>m</mem><answer>a</answer>"),
    ("tag_order", "<mem>m</mem><think>t</think><think>u</think><answer>a</answer>"),
    ("one_action_per_round",
     "<mem>m</mem><think>t</think><search>q</search><search>r</search>"
     "<information>i</information><mem>m</mem><think>t</think><answer>a</answer>"),
    ("information_answers_tool_call",
     "<mem>m</mem><think>t</think><search>q</search>"
     "<mem>m</mem><think>t</think><answer>a</answer>"),
    ("information_answers_tool_call",
     "<mem>m</mem><think>t</think><answer>a</answer><information>late</information>"),
    ("information_answers_tool_call",
     "<information>early</information><mem>m</mem><think>t</think><answer>a</answer>"),
    ("mem_required_after_first_round",
     "<mem></mem><think>t</think><search>q</search><information>i</information>"
     "<think>t</think><answer>a</answer>"),
    ("mem_required_after_first_round",
     "<mem></mem><think>t</think><search>q</search><information>i</information>"
     "<mem> \n </mem><think>t</think><answer>a</answer>"),
    ("answer_last_and_nonempty", "<mem>m</mem><think>t</think><answer> </answer>"),
    ("answer_last_and_nonempty",
     "<mem>m</mem><think>t</think><answer>a</answer>"
     "<mem>m</mem><think>t</think><answer>b</answer>"),
    ("no_text_outside_tags", "Sure! <mem>m</mem><think>t</think><answer>a</answer>"),
    ("no_text_outside_tags", "<mem>m</mem><think>t</think><answer>a</answer> Done."),
    ("ends_with_answer",
     "<mem>m</mem><think>t</think><search>q</search><information>i</information>"),
]


@pytest.mark.parametrize("rule, text", FAILING)
def test_each_rule_has_a_minimal_failing_example(rule, text):
    report = validate_format(text)
    assert not report.ok
    assert report.failed_rules == (rule,), report.messages
    assert len(report.messages) == 1 and report.messages[0].startswith(rule + ": ")


def test_every_rule_is_exercised():
    assert {rule for rule, _ in FAILING} == set(FORMAT_RULES)


def test_flags_switch_their_rules_off():
    outside = "Sure! <mem>m</mem><think>t</think><answer>a</answer>"
    assert validate_format(outside, allow_text_outside_tags=True).ok
    cut_at_turn_limit = ("<mem>m</mem><think>t</think><search>q</search>"
                         "<information>i</information>")
    assert validate_format(cut_at_turn_limit, require_answer=False).ok
    truncated = "<mem>m</mem><think>t</think>"
    assert validate_format(truncated, require_answer=False).failed_rules == (
        "one_action_per_round",)


def test_truncated_answer_and_several_failures_in_rule_order():
    report = validate_format("<mem>m</mem><think>t</think><answer>a")
    assert report.failed_rules == ("well_formed_tags", "ends_with_answer")
    messy = "hello <search>q</search><search>r</search>"
    report = validate_format(messy)
    assert report.failed_rules == ("tag_order", "one_action_per_round", "no_text_outside_tags",
                                   "ends_with_answer")
    assert [m.split(":")[0] for m in report.messages] == list(report.failed_rules)
    assert not validate_format("").ok and validate_format("").failed_rules == ("ends_with_answer",)


def test_markers_inside_information_are_tool_text():
    text = ("<mem>m</mem><think>t</think><search>q</search>"
            "<information>a page with </mem> and <answer>wrong</answer> in it</information>"
            "<mem>m</mem><think>t</think><answer>right</answer>")
    assert validate_format(text).ok
    assert extract_solution(text) == "right"


# ---------------------------------------------------------------------------------------------
# Final answer
# ---------------------------------------------------------------------------------------------


def test_extract_solution():
    assert extract_solution(THREE_ROUNDS) == "Kathryn Bigelow"
    assert extract_solution(R1_SEARCH + INFO_1) is None
    assert extract_solution("<answer>first</answer> <answer>\n last \n</answer>") == "last"
    assert extract_solution("<answer>done</answer><answer>cut off") == "done"
    assert extract_solution("<answer>cut off") is None
    assert extract_solution("<answer> </answer>") == ""
    retrieved_only = "<search>q</search><information><answer>from a document</answer></information>"
    assert extract_solution(retrieved_only) is None


# ---------------------------------------------------------------------------------------------
# Linear time on degenerate output (issue 10, case 5)
# ---------------------------------------------------------------------------------------------


def _parse_everything(text: str) -> None:
    compute_score(text, ["x"])  # validate_format (split_rounds, the stack parse) and extract_solution


def _line_events(text: str) -> int:
    """Python lines executed inside mempo.protocol.grammar and mempo.protocol.reward while parsing `text` (exact)."""
    watched = {protocol.__file__, reward.__file__}
    count = 0

    def tracer(frame, event, arg):
        nonlocal count
        if frame.f_code.co_filename not in watched:
            return None
        if event == "line":
            count += 1
        return tracer

    sys.settrace(tracer)
    try:
        _parse_everything(text)
    finally:
        sys.settrace(None)
    return count


def test_parsing_work_grows_linearly_with_repeated_tags():
    """A bound on work, not a timed test: 16x the text may cost at most 24x the executed lines
    (linear work predicts 16x; the old parser did 100x-250x on these shapes)."""
    small, large = degenerate_texts(4_000), degenerate_texts(64_000)
    for name in small:
        ratio = _line_events(large[name]) / _line_events(small[name])
        assert ratio < 24, f"{name}: {ratio:.0f}x the work for 16x the text"


def _structure_by_stack_search(text, tags=TAG_SET):
    """The parser's nesting view as first written (a stack search per closing marker): the spec."""
    unclosed, stray, nested, outside, stack, last_end = [], [], [], [], [], 0
    opaque = tags.tool_result

    def note_outside(begin, end):
        if text[begin:end].strip():
            outside.append((begin, text[begin:end]))

    for match in re.finditer("<(/?)(" + "|".join(tags.names) + ")>", text):
        closing, name = match.group(1) == "/", match.group(2)
        if stack and stack[-1][0] == opaque and not (closing and name == opaque):
            continue
        if not stack:
            note_outside(last_end, match.start())
        last_end = match.end()
        if not closing:
            if stack:
                stack[-1][2].append(name)
            stack.append((name, match.start(), []))
            continue
        depth = next((d for d in range(len(stack) - 1, -1, -1) if stack[d][0] == name), None)
        if depth is None:
            stray.append((name, match.start()))
            continue
        unclosed.extend((tag, offset) for tag, offset, _ in stack[depth + 1:])
        tag, offset, inner = stack[depth]
        if inner:
            nested.append((tag, inner[0], offset))
        del stack[depth:]
    if stack:
        unclosed.extend((tag, offset) for tag, offset, _ in stack)
    else:
        note_outside(last_end, len(text))
    unclosed.sort(key=lambda item: item[1])
    return unclosed, stray, nested, outside


def _turns_by_rescan(rounds, tags=TAG_SET):
    """Model turns as first written (rescanning the last turn for <information>): the spec."""
    turns = []
    for round_ in rounds:
        starts_with_action = bool(round_.blocks) and round_.blocks[0].tag in tags.actions
        if turns and starts_with_action and not any(b.tag == tags.tool_result for b in turns[-1]):
            turns[-1].extend(round_.blocks)
        else:
            turns.append(list(round_.blocks))
    return turns


@pytest.mark.parametrize("tags", [TAG_SET, JSON_TAG_SET], ids=["tags", "json"])
def test_linear_parser_matches_the_first_parser_on_random_markers(tags):
    rng = random.Random(1)
    markers = tags.marker_strings()
    for _ in range(3000):
        text = "".join(rng.choice(markers) + rng.choice(["", "", "x", " "]) for _ in range(rng.randint(0, 30)))
        assert tuple(protocol._structure(text, tags)) == _structure_by_stack_search(text, tags), text
        rounds = split_rounds(text, tags)
        assert protocol._turns(rounds, tags) == _turns_by_rescan(rounds, tags), text


def test_last_mem_is_the_mem_of_the_last_turn_that_has_one():
    turns = ["<mem>a</mem><search> q </search>", "<mem>b</mem><search> q </search>", "<answer>x</answer>"]
    assert last_mem(turns).strip() == "b"
    assert last_mem(iter(turns[:1])).strip() == "a"
    assert last_mem(["<answer>x</answer>"]) is None and last_mem([]) is None


def test_answer_templates_are_checked():
    from mempo.protocol.grammar import ANSWER_TEMPLATES, check_answer_template

    for template in ANSWER_TEMPLATES.values():
        check_answer_template(template)
        assert parse_round("<mem>m</mem>" + template.replace("{answer}", "Minu; Lidar")).argument == "Minu; Lidar"
    for bad in ("{answer}", "<answer>{answer}</answer>{answer}", "\n<think>\nx\n</think>\n<search> {answer} </search>",
                3):
        with pytest.raises(ValueError, match="answer template"):
            check_answer_template(bad)


# ---------------------------------------------------------------------------------------------
# The json action format (Hermes / Qwen tool calls) and tool tags of the tags format
# ---------------------------------------------------------------------------------------------

J1_CALL = ('<mem></mem>\n<think>look it up</think>\n'
           '<tool_call>\n{"name": "lookup", "arguments": {"key": "a<b"}}\n</tool_call>')
J_RESPONSE = "\n<tool_response>\nvalue 7 <answer>quoted</answer>\n</tool_response>\n"
J2_ANSWER = "<mem>a<b is 7</mem>\n<think>done</think>\n<answer> 7 </answer>"


def test_json_format_rounds_answer_and_format():
    text = J1_CALL + J_RESPONSE + J2_ANSWER
    rounds = split_rounds(text, JSON_TAG_SET)
    assert [r.action for r in rounds] == ["tool_call", "answer"]
    assert parse_tool_call(rounds[0].argument) == ("lookup", {"key": "a<b"})
    assert rounds[0].information == "value 7 <answer>quoted</answer>"  # opaque: its markers are text
    assert rounds[1].mem == "a<b is 7"
    assert extract_solution(text, JSON_TAG_SET) == "7"
    assert validate_format(text, tags=JSON_TAG_SET).ok
    # under the tags format the same text is not a protocol response, and vice versa
    assert not validate_format(text).ok
    assert not validate_format(THREE_ROUNDS, tags=JSON_TAG_SET).ok
    # an unanswered call before the answer, and an answer inside the tool response
    report = validate_format(J1_CALL + J2_ANSWER, tags=JSON_TAG_SET)
    assert report.failed_rules == ("information_answers_tool_call",)
    assert "<tool_call> is not answered by <tool_response>" in report.messages[0]
    assert extract_solution(J1_CALL + J_RESPONSE, JSON_TAG_SET) is None


def test_tags_format_with_user_tool_tags():
    tags = tag_set_for("tags", ["lookup", "calc"])
    assert tags.names == ("mem", "think", "lookup", "calc", "answer", "information")
    assert tag_set_for("tags", ["search", "access"]) == TAG_SET
    text = ("<mem></mem><think>t</think><lookup>a</lookup><information>7</information>"
            "<mem>a=7</mem><think>t</think><answer>7</answer>")
    assert [r.action for r in split_rounds(text, tags)] == ["lookup", "answer"]
    assert validate_format(text, tags=tags).ok and not validate_format(text).ok


@pytest.mark.parametrize("content, name, arguments", [
    ('{"name": "lookup", "arguments": {"key": "k"}}', "lookup", {"key": "k"}),
    (' {"name": " calc ", "arguments": "{\\"x\\": 1}"} ', "calc", {"x": 1}),  # arguments as a JSON string
    ('{"name": "now"}', "now", {}),
])
def test_parse_tool_call_reads_the_hermes_form(content, name, arguments):
    assert parse_tool_call(content) == (name, arguments)


@pytest.mark.parametrize("content, fragment", [
    ('{"name": "lookup", "arguments": {"key": }', "not valid JSON"),
    ("", "not valid JSON"),
    ('["lookup"]', "JSON list, not an object"),
    ('{"arguments": {}}', 'no "name" string'),
    ('{"name": 3}', 'no "name" string'),
    ('{"name": "f", "arguments": [1]}', "must be a JSON object, got list"),
    ('{"name": "f", "arguments": "{oops"}', "a string that is not a JSON object"),
    ("[" * 100_000, "not valid JSON"),
])
def test_parse_tool_call_errors_are_one_line_for_the_agent(content, fragment):
    with pytest.raises(ToolCallError, match=re.escape(fragment)) as caught:
        parse_tool_call(content)
    assert "\n" not in str(caught.value) and "<tool_call>" in str(caught.value)
