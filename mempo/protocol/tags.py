"""The MemPO turn-protocol tags, in one place (the protocol, the scanner and the environment all take
them from here).

A `TagSet` is one protocol's tags. A tag's *code* is its index in ``TagSet.names``; marker code
``2*tag`` is ``<tag>`` and ``2*tag+1`` is ``</tag>`` (the C++ scanner uses the same numbering and takes
the set at run time). Every set has ``mem``, ``think`` and ``answer``; its *actions* finish a round
(a tool call or the answer); its *tool result* tag is what the environment answers a call in (opaque
text: inside it only its own closing marker counts).

Two action formats (``protocol.action_format``, `ACTION_FORMATS`):

* ``"tags"``: each tool is its own tag, ``<search> query </search>``, answered in
  ``<information>...</information>``. With the built-in tools this is `TAG_SET` (``TAGS``), the
  protocol of the paper.
* ``"json"``: a tool call is a JSON object in the Hermes / Qwen form chat templates and verl's
  ``hermes`` tool parser use, ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``, answered in
  ``<tool_response>...</tool_response>`` (`JSON_TAG_SET`).
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Optional, Sequence

__all__ = ["TAGS", "ACTION_TAGS", "INFORMATION_TAG", "ACTION_FORMATS", "MAX_TAGS", "MAX_NAME_CHARS", "TagSet",
           "TAG_SET", "JSON_TAG_SET", "tag_set_for", "marker_strings", "check_tag_name"]

TAGS: tuple[str, ...] = ("mem", "think", "search", "access", "answer", "information")
ACTION_TAGS: tuple[str, ...] = ("search", "access", "answer")
INFORMATION_TAG = TAGS.index("information")
ACTION_FORMATS = ("tags", "json")
#: the C++ scanner's limits (csrc/span_scanner.hpp: kMaxTags, kMaxNameBytes)
MAX_TAGS = 64
MAX_NAME_CHARS = 48
_NAME = re.compile(r"[A-Za-z0-9_.:-]+")
_REQUIRED = ("mem", "think", "answer")


def check_tag_name(name: object, what: str = "tag name") -> str:
    """`name` when it can be a protocol tag: 1 to `MAX_NAME_CHARS` characters of ``[A-Za-z0-9_.:-]`` (so
    a marker holds one ``<`` and one ``>`` and markers never overlap); else ValueError naming `what`."""
    if not isinstance(name, str) or not 1 <= len(name) <= MAX_NAME_CHARS or not _NAME.fullmatch(name):
        raise ValueError(f"{what} {name!r} must be 1 to {MAX_NAME_CHARS} characters of [A-Za-z0-9_.:-]")
    return name


@dataclass(frozen=True)
class TagSet:
    """One protocol's tags.

    names: every tag, code = index. actions: the tags that finish a round (``answer`` and the tool
    calls). tool_result: the tag the environment answers a tool call in (opaque, no action).
    call_tag: the action whose content is a JSON tool call naming its tool (the ``json`` format), or
    None: every action but ``answer`` is a tool of its own name (the ``tags`` format). ValueError
    unless the names are distinct valid tag names (`check_tag_name`), at most `MAX_TAGS`, with
    ``mem``, ``think`` and ``answer`` among them, ``answer`` an action and ``mem`` / ``think`` not.
    """

    names: tuple[str, ...]
    actions: tuple[str, ...]
    tool_result: str
    call_tag: Optional[str] = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "names", tuple(self.names))
        object.__setattr__(self, "actions", tuple(self.actions))
        if not 1 <= len(self.names) <= MAX_TAGS:
            raise ValueError(f"a tag set has 1 to {MAX_TAGS} tags, got {len(self.names)}")
        for name in self.names:
            check_tag_name(name)
        repeated = sorted({n for n in self.names if self.names.count(n) > 1})
        if repeated:
            raise ValueError(f"tag names must be distinct; repeated: {repeated}")
        missing = [n for n in _REQUIRED + (self.tool_result,) + self.actions if n not in self.names]
        if missing:
            raise ValueError(f"tags {missing} are not among the tag set's names {self.names}")
        if "answer" not in self.actions or {"mem", "think", self.tool_result} & set(self.actions):
            raise ValueError(f"the actions must include 'answer' and not 'mem', 'think' or the tool result "
                             f"'{self.tool_result}'; got {self.actions}")
        if self.call_tag is not None and (self.call_tag not in self.actions or self.call_tag == "answer"):
            raise ValueError(f"call_tag {self.call_tag!r} must be an action other than 'answer'")

    def code(self, name: str) -> int:
        """The code of tag `name` (ValueError naming the set's tags for another name)."""
        try:
            return self.names.index(name)
        except ValueError:
            raise ValueError(f"unknown tag {name!r}; tags are {self.names}") from None

    @property
    def action_codes(self) -> tuple[int, ...]:
        return tuple(self.names.index(name) for name in self.actions)

    @property
    def tool_result_code(self) -> int:
        return self.names.index(self.tool_result)

    @property
    def tool_actions(self) -> tuple[str, ...]:
        """The actions that call a tool (every action but ``answer``)."""
        return tuple(a for a in self.actions if a != "answer")

    def marker_strings(self) -> tuple[str, ...]:
        """The ``2 * len(names)`` marker strings in marker-code order."""
        return tuple(m for name in self.names for m in (f"<{name}>", f"</{name}>"))

    def wrap_tool_result(self, body: str) -> str:
        """``<tool_result>body</tool_result>``; a literal closing marker inside `body` (a page quoting the
        protocol) would end the block early for the scanner and the format check, so it is defused as
        ``</ tag>``."""
        close = f"</{self.tool_result}>"
        return f"<{self.tool_result}>" + body.replace(close, f"</ {self.tool_result}>") + close


#: the tags format with the built-in tools (`TAGS`): the paper's protocol
TAG_SET = TagSet(TAGS, ACTION_TAGS, "information")
#: the json format: Hermes / Qwen tool calls
JSON_TAG_SET = TagSet(("mem", "think", "tool_call", "answer", "tool_response"), ("tool_call", "answer"),
                      "tool_response", call_tag="tool_call")


def tag_set_for(action_format: str, tool_names: Sequence[str] = ("search", "access")) -> TagSet:
    """The tag set of ``protocol.action_format`` for tools named `tool_names`: ``"json"``: `JSON_TAG_SET`
    (whatever the tools); ``"tags"``: ``mem``, ``think``, one tag per tool, ``answer``, ``information``
    (`TAG_SET` for the built-in ``search`` / ``access``). ValueError for another format, or a tool name
    that cannot be a tag (`check_tag_name`) or is one of the protocol's own tags."""
    if action_format == "json":
        return JSON_TAG_SET
    if action_format != "tags":
        raise ValueError(f"action format must be one of {ACTION_FORMATS}, got {action_format!r}")
    names = tuple(tool_names)
    for name in names:
        check_tag_name(name, "a tool name in the tags format (its tag)")
        if name in ("mem", "think", "answer", "information"):
            raise ValueError(f"a tool cannot be named {name!r} in the tags format: <{name}> is a protocol tag")
    return TagSet(("mem", "think") + names + ("answer", "information"), names + ("answer",), "information")


def marker_strings() -> tuple[str, ...]:
    """The 12 marker strings of `TAG_SET` in marker-code order (code 2*tag: ``<tag>``, 2*tag+1: ``</tag>``)."""
    return TAG_SET.marker_strings()
