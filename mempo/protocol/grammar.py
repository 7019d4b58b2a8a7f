"""The MemPO turn protocol on text: parse rounds, validate the format, extract the final answer.

One assistant round is ``<mem>...</mem><think>...</think>`` followed by exactly one action:
``<search>query</search>``, ``<access>url-or-doc-id [page]</access>`` or ``<answer>...</answer>``;
the environment answers ``<search>``/``<access>`` with ``<information>...</information>`` (tool
text). A *response* is the rounds and information blocks, without the prompt. Offsets are
character offsets; round indices are 0-based in data (prose says "round 1" for index 0). Every
function runs in time linear in the text's length, whatever the markers
(tests/protocol/test_grammar.py bounds the work).

Every function takes the protocol's tags (``tags``, a `mempo.protocol.tags.TagSet`; default `TAG_SET`,
the tags above): with `JSON_TAG_SET` a tool call is ``<tool_call>{"name": ..., "arguments": {...}}
</tool_call>`` (`parse_tool_call` reads it) answered in ``<tool_response>...</tool_response>``; below,
"information" and the actions mean the set's tool-result tag and actions.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Iterable, NamedTuple, Optional

from mempo.protocol.tags import TAG_SET, TagSet

__all__ = [
    "DEFAULT_ANSWER_TEMPLATE",
    "SPACED_ANSWER_TEMPLATE",
    "ANSWER_TEMPLATES",
    "answer_template_text",
    "check_answer_template",
    "FORMAT_RULES",
    "Block",
    "Round",
    "FormatReport",
    "find_blocks",
    "parse_round",
    "last_mem",
    "split_rounds",
    "validate_format",
    "extract_solution",
    "parse_access_argument",
    "ToolCallError",
    "parse_tool_call",
]

INFORMATION = "information"

_MARKER_RES: dict[TagSet, "re.Pattern[str]"] = {}


def _marker_re(tags: TagSet) -> "re.Pattern[str]":
    """The regex of the set's markers (built once per tag set)."""
    found = _MARKER_RES.get(tags)
    if found is None:
        found = _MARKER_RES[tags] = re.compile("<(/?)(" + "|".join(re.escape(t) for t in tags.names) + ")>")
    return found


_PAGE_RE = re.compile(r"([0-9]+)|\[([0-9]+)\]")  # ASCII digits only

FORMAT_RULES: dict[str, str] = {
    "well_formed_tags": "every opening marker is closed by its own closing marker; no closing "
    "marker is stray",
    "no_nested_tags": "no block opens inside another block (markers inside <information> are "
    "tool text and not parsed)",
    "tag_order": "before its action a round has <mem> (may be absent in round 1), then exactly one "
    "<think>, in this order",
    "one_action_per_round": "every round has exactly one action (<search>, <access> or <answer>); "
    "two actions with no <information> between them are two actions in one round",
    "information_answers_tool_call": "an <information> block (the tool result) comes only after a "
    "round's tool call (<search>/<access>, or <tool_call>), at most one per round, and every tool-call "
    "round but the last is answered by one",
    "mem_required_after_first_round": "from round 2 on every round has a non-empty <mem> block "
    "(round 1 may leave it empty or omit it)",
    "answer_last_and_nonempty": "<answer> is only the trajectory's last action, and its content is "
    "not empty",
    "no_text_outside_tags": "nothing but white space outside the blocks (not checked with "
    "allow_text_outside_tags=True)",
    "ends_with_answer": "the trajectory's last action is a closed <answer> block (not checked with "
    "require_answer=False)",
}


@dataclass(frozen=True)
class Block:
    """One ``<tag>...</tag>`` block under the span grammar.

    ``start``/``end`` are character offsets into the scanned text: ``start`` at the opening marker,
    ``end`` one past the closing marker (``closed``) or where the block was cut off (the next
    marker, or the end of the text). ``content`` is the raw text between the markers.
    """

    tag: str
    start: int
    end: int
    content: str
    closed: bool
    round: int


@dataclass(frozen=True)
class Round:
    """One round of a response.

    ``index`` is 0-based. ``text`` runs from the round's first marker (the response start for the
    first round) to the start of the next round, so the round texts concatenate back to the
    response. Block contents are stripped of surrounding white space; ``None`` means the round has
    no such block, ``""`` an empty one; with several blocks of one tag (a malformed round) the
    fields show the first and `validate_format` reports the defect. ``action`` is the action's tag
    name (``"search"``, ``"access"`` or ``"answer"``) and ``argument`` its stripped content. For an
    ``access`` action, ``doc_id`` and ``page`` come from :func:`parse_access_argument`; both are
    ``None`` for the other actions. ``information`` is the stripped content of the ``<information>``
    block answering this round's action.
    """

    mem: Optional[str]
    think: Optional[str]
    action: Optional[str]
    argument: Optional[str]
    text: str
    doc_id: Optional[str] = None
    page: Optional[int] = None
    information: Optional[str] = None
    index: int = 0
    start: int = 0
    end: int = 0
    blocks: tuple[Block, ...] = ()


class FormatReport(NamedTuple):
    """Result of :func:`validate_format`.

    ``failed_rules`` lists the failing rule names in :data:`FORMAT_RULES` order; ``messages[i]``
    explains ``failed_rules[i]`` (its first offence, with a count when there are more).
    """

    ok: bool
    failed_rules: tuple[str, ...]
    messages: tuple[str, ...]


# ---------------------------------------------------------------------------------------------
# Scanning
# ---------------------------------------------------------------------------------------------


def _scan(text: str, tags: TagSet = TAG_SET) -> tuple[list[Block], list[int]]:
    """Blocks of ``text`` under the span grammar, and the start offset of every round.

    The grammar of `mempo.ops.spans.find_spans` (the C++ token scanner), applied to characters
    instead of bytes; the markers are ASCII, so for the same text both find the same blocks with
    the same round numbers:
    - markers are the exact strings ``<name>`` / ``</name>`` (case-sensitive, no attributes);
    - at most one block is open; an opening marker while a block is open ends that block
      *unclosed* and opens the new one; inside ``<information>`` only ``</information>`` is a marker
      (tool output is opaque); a closing marker for another tag, or with no open block, is stray and
      ignored; a block still open at the end of the text is unclosed;
    - a round is finished once an action block opened in it; the next opening marker of a tag other
      than ``information`` starts the next round; an ``<information>`` block belongs to the round
      whose action it answers.
    """
    information, actions = tags.tool_result, frozenset(tags.actions)
    blocks: list[Block] = []
    round_starts = [0]
    open_tag: Optional[str] = None
    open_start = open_content_start = open_round = 0
    round_index = 0
    round_has_action = False

    def finish(end: int, content_end: int, closed: bool) -> None:
        blocks.append(Block(open_tag, open_start, end, text[open_content_start:content_end], closed,
                            open_round))

    for match in _marker_re(tags).finditer(text):
        closing = match.group(1) == "/"
        name = match.group(2)
        begin, end = match.span()
        if open_tag == information:
            if closing and name == information:
                finish(end, begin, True)
                open_tag = None
            continue
        if closing:
            if open_tag == name:
                finish(end, begin, True)
                open_tag = None
            continue
        if open_tag is not None:
            finish(begin, begin, False)
        if name != information:
            if round_has_action:
                round_index += 1
                round_has_action = False
                round_starts.append(begin)
            if name in actions:
                round_has_action = True
        open_tag, open_start, open_content_start, open_round = name, begin, end, round_index
    if open_tag is not None:
        finish(len(text), len(text), False)
    return blocks, round_starts


def find_blocks(text: str, tags: TagSet = TAG_SET) -> list[Block]:
    """All blocks of ``text``, in order of start, under the span grammar (`_scan`) of `tags`."""
    return _scan(text, tags)[0]


def parse_access_argument(argument: str) -> tuple[str, Optional[int]]:
    """Split an ``<access>`` argument ``"url-or-doc-id [page]"`` into ``(doc_id, page)``.

    The stripped argument is split at its last run of white space. When the part after it is a
    non-negative ASCII decimal integer, bare or in square brackets (``"3"`` or ``"[3]"``), that integer
    is the page (as written, no re-basing) and the stripped part before it is the doc id.
    Otherwise the whole argument is the doc id and the page is ``None``. A lone integer
    (``<access>42</access>``) is a doc id, never a page.
    """
    argument = argument.strip()
    parts = argument.rsplit(None, 1)
    if len(parts) == 2:
        head, tail = parts
        page_match = _PAGE_RE.fullmatch(tail)
        if page_match is not None and head.strip():
            return head.strip(), int(page_match.group(1) or page_match.group(2))
    return argument, None


def _round_from_blocks(text: str, index: int, start: int, end: int,
                       blocks: tuple[Block, ...], tags: TagSet = TAG_SET) -> Round:
    def first(tag: str) -> Optional[str]:
        for block in blocks:
            if block.tag == tag:
                return block.content.strip()
        return None

    action_block = next((b for b in blocks if b.tag in tags.actions), None)
    action = argument = doc_id = None
    page = None
    if action_block is not None:
        action = action_block.tag
        argument = action_block.content.strip()
        if action == "access":
            doc_id, page = parse_access_argument(argument)
    return Round(
        mem=first("mem"),
        think=first("think"),
        action=action,
        argument=argument,
        text=text[start:end],
        doc_id=doc_id,
        page=page,
        information=first(tags.tool_result),
        index=index,
        start=start,
        end=end,
        blocks=blocks,
    )


def split_rounds(response_text: str, tags: TagSet = TAG_SET) -> list[Round]:
    """The rounds of a response, in order, each with the ``<information>`` block that answers it.

    Round boundaries follow the span grammar (`_scan`), so ``Round.index`` equals the
    ``round`` the token scanner gives the same blocks. A response that is empty or only white space
    has no rounds; text with no markers is one round whose fields are all ``None``.
    """
    if not response_text.strip():
        return []
    blocks, round_starts = _scan(response_text, tags)
    bounds = round_starts + [len(response_text)]
    per_round: list[list[Block]] = [[] for _ in round_starts]
    for block in blocks:
        per_round[block.round].append(block)
    return [
        _round_from_blocks(response_text, index, bounds[index], bounds[index + 1],
                           tuple(per_round[index]), tags)
        for index in range(len(round_starts))
    ]


def parse_round(text: str, tags: TagSet = TAG_SET) -> Round:
    """Parse the text of one round (``<mem>..</mem><think>..</think><action>..</action>``).

    Returns the first round of ``split_rounds(text)``; text after it (a second action that opens
    a new round, say) is not part of the result — use :func:`split_rounds` or
    :func:`validate_format` to see or check it. Empty text gives a round whose fields are all
    ``None``. For an ``access`` action, ``doc_id``/``page`` are split as
    :func:`parse_access_argument` says.
    """
    rounds = split_rounds(text, tags)
    if not rounds:
        return Round(mem=None, think=None, action=None, argument=None, text=text, end=len(text))
    return rounds[0]


def last_mem(turns: Iterable[str], tags: TagSet = TAG_SET) -> Optional[str]:
    """The ``<mem>`` content of the last turn (assistant texts, in order) that has one, or ``None``
    (an answered episode: its answer round's)."""
    return next((mem for mem in (parse_round(text, tags).mem for text in reversed(list(turns)))
                 if mem is not None), None)


class ToolCallError(ValueError):
    """A ``<tool_call>`` whose content is not a JSON tool call; the message is what the agent is told."""


def parse_tool_call(content: str) -> tuple[str, dict[str, Any]]:
    """(name, arguments) of a JSON tool call, the content of a ``<tool_call>`` block.

    The Hermes / Qwen form verl's ``hermes`` tool parser reads (``json.loads`` of the content, then
    its ``"name"`` and ``"arguments"``): a JSON object with a string ``"name"`` and an ``"arguments"``
    object; a JSON string holding an object (how some models and the OpenAI API write arguments) is
    accepted, and a missing ``"arguments"`` is ``{}``. Anything else raises `ToolCallError` with a
    one-line message for the agent (no JSON, not an object, no name, arguments no object).
    """
    example = 'write <tool_call>{"name": "<tool name>", "arguments": {...}}</tool_call>'
    try:
        call = json.loads(content)
    except (ValueError, RecursionError) as error:
        detail = str(error).splitlines()[0][:120] if str(error) else type(error).__name__
        raise ToolCallError(f"the tool call is not valid JSON ({detail}); {example}") from None
    if not isinstance(call, dict):
        raise ToolCallError(f"the tool call is a JSON {type(call).__name__}, not an object; {example}")
    name = call.get("name")
    if not isinstance(name, str) or not name.strip():
        raise ToolCallError(f'the tool call has no "name" string; {example}')
    arguments = call.get("arguments", {})
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except (ValueError, RecursionError):
            raise ToolCallError(f'the "arguments" of the {name.strip()[:60]!r} call are a string that is not '
                                f"a JSON object; {example}") from None
    if not isinstance(arguments, dict):
        raise ToolCallError(f'the "arguments" of the {name.strip()[:60]!r} call must be a JSON object, got '
                            f"{type(arguments).__name__}; {example}")
    return name.strip(), arguments


def extract_solution(response_text: str, tags: TagSet = TAG_SET) -> Optional[str]:
    """The stripped content of the response's final closed ``<answer>`` block, or ``None``.

    Pass the response text only, never the prompt: prompts often hold example answers (MEM1's
    extractor works around that by skipping the first match; this one does not need to). Blocks
    follow the span grammar, so an ``<answer>`` inside an ``<information>`` block (retrieved text)
    does not count, and an unclosed (truncated) answer is no answer. An empty answer gives ``""``.
    """
    for block in reversed(find_blocks(response_text, tags)):
        if block.tag == "answer" and block.closed:
            return block.content.strip()
    return None


# ---------------------------------------------------------------------------------------------
# Validation
# ---------------------------------------------------------------------------------------------


class _Structure(NamedTuple):
    unclosed: list[tuple[str, int]]  # (tag, offset of its opening marker)
    stray: list[tuple[str, int]]  # (tag, offset of the stray closing marker)
    nested: list[tuple[str, str, int]]  # (outer tag, inner tag, offset of the outer block)
    outside: list[tuple[int, str]]  # (offset, text) of non-white text outside every block


def _structure(text: str, tags: TagSet = TAG_SET) -> _Structure:
    """Stack parse of the markers (the nesting view; ``<information>`` content stays opaque).

    Linear time: a closing marker for a tag with no open block is stray at once (a count per tag,
    not a stack search), and the downward search for an open one only passes entries it removes.
    """
    unclosed: list[tuple[str, int]] = []
    stray: list[tuple[str, int]] = []
    nested: list[tuple[str, str, int]] = []
    outside: list[tuple[int, str]] = []
    stack: list[tuple[str, int, list[str]]] = []  # (tag, offset, tags opened directly inside)
    open_count = dict.fromkeys(tags.names, 0)  # blocks of each tag on the stack
    information = tags.tool_result
    last_end = 0

    def note_outside(begin: int, end: int) -> None:
        if text[begin:end].strip():
            outside.append((begin, text[begin:end]))

    for match in _marker_re(tags).finditer(text):
        closing = match.group(1) == "/"
        name = match.group(2)
        if stack and stack[-1][0] == information and not (closing and name == information):
            continue
        if not stack:
            note_outside(last_end, match.start())
        last_end = match.end()
        if not closing:
            if stack:
                stack[-1][2].append(name)
            stack.append((name, match.start(), []))
            open_count[name] += 1
            continue
        if not open_count[name]:
            stray.append((name, match.start()))
            continue
        depth = len(stack) - 1
        while stack[depth][0] != name:
            depth -= 1
        for tag, offset, _ in stack[depth + 1:]:
            unclosed.append((tag, offset))
            open_count[tag] -= 1
        tag, offset, inner = stack[depth]
        open_count[tag] -= 1
        if inner:
            nested.append((tag, inner[0], offset))
        del stack[depth:]
    if stack:
        unclosed.extend((tag, offset) for tag, offset, _ in stack)
    else:
        note_outside(last_end, len(text))
    unclosed.sort(key=lambda item: item[1])
    return _Structure(unclosed, stray, nested, outside)


def _turns(rounds: list[Round], tags: TagSet = TAG_SET) -> list[list[Block]]:
    """Rounds merged into model turns: a round opening with an action joins the previous round
    when that round got no ``<information>`` (both actions were written in one turn)."""
    turns: list[list[Block]] = []
    answered = False  # the last turn holds an <information> block (tracked: a turn can be long)
    for round_ in rounds:
        starts_with_action = bool(round_.blocks) and round_.blocks[0].tag in tags.actions
        has_information = any(b.tag == tags.tool_result for b in round_.blocks)
        if turns and starts_with_action and not answered:
            turns[-1].extend(round_.blocks)
            answered = has_information
        else:
            turns.append(list(round_.blocks))
            answered = has_information
    return turns


def _describe(problems: list[str]) -> str:
    more = len(problems) - 1
    return problems[0] + (f" (and {more} more)" if more else "")


def validate_format(response_text: str, *, allow_text_outside_tags: bool = False,
                    require_answer: bool = True, tags: TagSet = TAG_SET) -> FormatReport:
    """Check a response against the protocol rules of :data:`FORMAT_RULES`.

    ``allow_text_outside_tags=True`` skips ``no_text_outside_tags``; ``require_answer=False``
    skips ``ends_with_answer`` (for trajectories cut at the turn limit). Every other rule is always
    checked; the report lists each failing rule once, in :data:`FORMAT_RULES` order, with a message
    on its first offence.

    Nesting, closing and outside-text checks use a stack parse of the markers (`_structure`: so
    ``<mem><think>x</think></mem>`` is one *nested* defect, not an unclosed block plus a stray
    marker); the per-round rules use `split_rounds`, with one merge (`_turns`): a round that starts
    directly with an action while the previous round got no ``<information>`` is the same model
    turn (two actions in one turn), checked as part of the previous round. "Round k" in the
    messages is 1-based and counts model turns. ``tags``: the protocol's tag set (the content of a
    ``<tool_call>`` is not checked here: a malformed call is answered by an error result).
    """
    actions, information = tags.actions, tags.tool_result
    problems: dict[str, list[str]] = {name: [] for name in FORMAT_RULES}
    structure = _structure(response_text, tags)
    for tag, offset in structure.unclosed:
        problems["well_formed_tags"].append(f"<{tag}> at character {offset} is never closed")
    for tag, offset in structure.stray:
        problems["well_formed_tags"].append(f"stray </{tag}> at character {offset}")
    for outer, inner, offset in structure.nested:
        problems["no_nested_tags"].append(
            f"<{inner}> opens inside <{outer}> (the <{outer}> at character {offset})")
    if not allow_text_outside_tags:
        for offset, snippet in structure.outside:
            shown = snippet.strip()
            shown = shown if len(shown) <= 40 else shown[:37] + "..."
            problems["no_text_outside_tags"].append(
                f"text outside tags at character {offset}: {shown!r}")

    turns = _turns(split_rounds(response_text, tags), tags)
    all_actions = [b for turn in turns for b in turn if b.tag in actions]
    last_action = all_actions[-1] if all_actions else None
    for number, turn in enumerate(turns, start=1):
        turn_actions = [b for b in turn if b.tag in actions]
        informations = [b for b in turn if b.tag == information]
        first_action = turn_actions[0] if turn_actions else None
        before_action = [b for b in turn if b.tag not in actions and b.tag != information
                         and (first_action is None or b.start < first_action.start)]
        order = [b.tag for b in before_action]
        if first_action is not None:
            order_ok = order in (["think"], ["mem", "think"])
        else:
            order_ok = order in ([], ["mem"], ["think"], ["mem", "think"])
        if not order_ok:
            shown = " ".join(f"<{tag}>" for tag in order) or "nothing"
            problems["tag_order"].append(
                f"round {number}: {shown} before the action (expected <mem> <think>)")

        if len(turn_actions) != 1:
            problems["one_action_per_round"].append(
                f"round {number} has {len(turn_actions)} actions"
                + (": " + " ".join(f"<{b.tag}>" for b in turn_actions) if turn_actions else ""))

        if informations:
            if first_action is None or first_action.tag == "answer":
                what = "no action" if first_action is None else "an <answer>"
                problems["information_answers_tool_call"].append(
                    f"round {number}: <{information}> answers {what}")
            elif informations[0].start < first_action.start:
                problems["information_answers_tool_call"].append(
                    f"round {number}: <{information}> comes before the action")
            if len(informations) > 1:
                problems["information_answers_tool_call"].append(
                    f"round {number} has {len(informations)} <{information}> blocks")
        elif (first_action is not None and first_action.tag != "answer"
              and number < len(turns)):
            problems["information_answers_tool_call"].append(
                f"round {number}: <{first_action.tag}> is not answered by <{information}>")

        if number >= 2:
            mems = [b for b in before_action if b.tag == "mem"]
            if not mems:
                problems["mem_required_after_first_round"].append(f"round {number} has no <mem>")
            elif not mems[0].content.strip():
                problems["mem_required_after_first_round"].append(
                    f"round {number} has an empty <mem>")

        for block in turn_actions:
            if block.tag != "answer":
                continue
            if block is not last_action or number != len(turns):
                problems["answer_last_and_nonempty"].append(
                    f"round {number}: <answer> at character {block.start} is not the last action")
            elif not block.content.strip():
                problems["answer_last_and_nonempty"].append(f"round {number}: empty <answer>")

    if require_answer and (last_action is None or last_action.tag != "answer"
                           or not last_action.closed):
        if last_action is None:
            problems["ends_with_answer"].append("the response has no action")
        elif last_action.tag != "answer":
            problems["ends_with_answer"].append(f"the last action is <{last_action.tag}>")
        else:
            problems["ends_with_answer"].append("the final <answer> is not closed")

    failed = tuple(name for name in FORMAT_RULES if problems[name])
    messages = tuple(f"{name}: {_describe(problems[name])}" for name in failed)
    return FormatReport(ok=not failed, failed_rules=failed, messages=messages)


#: The answer round teacher scoring appends after a context (the reference's: the gold on a line of its own).
DEFAULT_ANSWER_TEMPLATE = "\n<think>\nI have the answer.\n</think>\n<answer>\n{answer}\n</answer>"
#: The same with the answer after a space: with a byte-level BPE whose words carry their leading space
#: (GPT-2, Qwen), the first answer is then the token a `<mem>` line or a search result writes
#: (`` Minu``), not a line-initial spelling (``Min`` + ``u``) a small model cannot copy
#: (docs/experiments/T14-first-question.md).
SPACED_ANSWER_TEMPLATE = "\n<think>\nI have the answer.\n</think>\n<answer> {answer} </answer>"


#: Answer templates by name (``scoring.answer_template``).
ANSWER_TEMPLATES = {"line": DEFAULT_ANSWER_TEMPLATE, "spaced": SPACED_ANSWER_TEMPLATE}


def answer_template_text(spec: str) -> str:
    """The template a ``scoring.answer_template`` value names: a key of `ANSWER_TEMPLATES`, or else the
    template text itself (checked by `check_answer_template` where it is configured)."""
    return ANSWER_TEMPLATES.get(spec, spec)


def check_answer_template(template: str) -> None:
    """ValueError unless `template` holds ``{answer}`` exactly once, inside an ``<answer>`` block after a
    ``<think>`` block (what an answer round after ``</mem>`` must be)."""
    if not isinstance(template, str) or template.count("{answer}") != 1:
        raise ValueError(f"an answer template must hold '{{answer}}' exactly once, got {template!r}")
    probe = parse_round("<mem>x</mem>" + template.replace("{answer}", "a; b"))
    if probe.action != "answer" or probe.argument != "a; b":
        raise ValueError("an answer template must hold '{answer}' inside an <answer> block after a <think> block; "
                         f"got {template!r}")
