"""Tools: what the agent calls between its rounds. The public interface for your own tools::

    from mempo.tools import tool

    @tool
    def lookup(key: str) -> str:
        \"\"\"The value stored under a key.\"\"\"
        return TABLE.get(key, f"no entry for {key!r}")

A `Tool` has a ``name``, a ``description`` and ``parameters``, the JSON schema of its arguments object
(what the model is told; `Tool.schema` is the OpenAI function form chat templates and verl take), and
``call(**arguments)``, which returns the observation text (a ``str``, or a `ToolOutput` with metadata to
record; ``async def call`` is awaited). Make one with the `tool` decorator (the name, description and
schema come from the function's name, docstring and annotated parameters, or are given) or subclass
`Tool`. A config names tools by import path (``env.tools: ["my_pkg.tools:lookup"]``, `load_tools`): the
object there is a `Tool`, a list of them, or a class or function that returns one (or a list) when
called without arguments. The built-in ``search`` and ``access`` (`mempo.env.tools`) are tools of this
kind. A tool may be called from several threads at once.

How the agent calls a tool (``rollout.action_format``, `mempo.protocol.tags`): ``json``:
``<tool_call>{"name": "lookup", "arguments": {"key": "a"}}</tool_call>``; ``tags``: ``<lookup>a</lookup>``,
whose text becomes the arguments by `Tool.arguments_from_text`. The answer is the tag set's tool-result
block (``<tool_response>...`` / ``<information>...``).

Whatever happens, the agent reads one bounded observation (`Toolset.call`) and the rollout goes on; a
failed call has ``ok=False`` (counted as ``rollout/tool_errors``) and one line of text ``Error: ...``:

* a malformed JSON call (`mempo.protocol.grammar.parse_tool_call`), an unknown tool name, arguments that
  miss a required name or hold one the schema does not list;
* `ToolError` raised by the tool (its message is what the agent reads), or any other exception (its type
  and message, cut to one line);
* no answer within ``timeout`` seconds (``env.tool_timeout``): the call is abandoned (an ``async`` tool is
  cancelled; a sync one keeps its daemon thread until it returns, and its result is dropped);
* a result that is not text (``None``, bytes, a number: the tool must format its own output).

A text result longer than ``max_chars`` (``env.tool_result_chars``) is cut there with a notice saying so
(``ok`` stays True); lone surrogates become U+FFFD.
"""
from __future__ import annotations

import asyncio
import inspect
import json
import threading
import typing
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, Iterable, Mapping, NamedTuple, Optional, Union

from mempo.protocol.grammar import ToolCallError, parse_tool_call
from mempo.protocol.tags import TAG_SET, TagSet, check_tag_name
from mempo.utils.imports import load_object

__all__ = ["RESULT_KINDS", "DEFAULT_TIMEOUT", "DEFAULT_MAX_CHARS", "Tool", "FunctionTool", "ToolError", "ToolOutput",
           "ToolResult", "Toolset", "tool", "check_tool", "load_tools", "as_toolset"]

#: How the memory context shows an older result of the tool (`mempo.protocol.memory`): "tool_result" and
#: "search_results" whole, "webpage" cut to its first characters (`ShortTextPolicy`).
RESULT_KINDS = ("tool_result", "search_results", "webpage")
DEFAULT_TIMEOUT = 30.0
DEFAULT_MAX_CHARS = 65536
_JSON_TYPES = {str: "string", int: "integer", float: "number", bool: "boolean", list: "array", dict: "object"}


class ToolError(Exception):
    """Raised by a tool for a call it cannot answer; ``str(error)`` is what the agent reads after
    ``Error: `` and ``metadata`` is recorded with the result."""

    def __init__(self, message: str, **metadata: Any) -> None:
        super().__init__(message)
        self.metadata = metadata


class ToolOutput(NamedTuple):
    """A tool's observation text with metadata to record (`ToolResult.metadata`), e.g. the ids of the
    documents a search returned."""

    text: str
    metadata: Mapping[str, Any] = {}


@dataclass(frozen=True)
class ToolResult:
    """One answered call as the agent loop records it: `text` is the whole tool-result block
    (``<information>...</information>`` or ``<tool_response>...</tool_response>``); `kind` the tool's
    `Tool.result_kind`; `ok` False for a failed call (then ``metadata["error"]`` holds the detail);
    ``metadata["tool"]`` names the tool called, when there was one."""

    text: str
    kind: str
    ok: bool = True
    metadata: dict[str, Any] = field(default_factory=dict)


class Tool:
    """A tool: subclass it (class attributes ``name``, ``description``, ``parameters``, ``result_kind``;
    a ``call`` method) or use the `tool` decorator.

    Attributes:
        name: what the agent calls it (1 to 48 characters of ``[A-Za-z0-9_.:-]``, so that it can be a tag).
        description: what it does, for the model.
        parameters: JSON schema of the arguments object (``{"type": "object", "properties": {...},
            "required": [...]}``).
        result_kind: one of `RESULT_KINDS` (how the memory context shows an older result).
    """

    name: str = ""
    description: str = ""
    parameters: Mapping[str, Any] = {"type": "object", "properties": {}}
    result_kind: str = "tool_result"

    def call(self, **arguments: Any) -> Union[str, ToolOutput, Awaitable[Union[str, ToolOutput]]]:
        """The observation of a call with these arguments (raise `ToolError` for a call it cannot answer)."""
        raise NotImplementedError(f"tool {self.name!r} defines no call()")

    def arguments_from_text(self, text: str) -> dict[str, Any]:
        """The arguments of a tags-format call ``<name>text</name>``: with one property in the schema,
        ``{that property: the stripped text}``; otherwise the text must be a JSON object (`ToolError`
        if it is not)."""
        properties = list(self.parameters.get("properties", {}))
        if len(properties) == 1:
            return {properties[0]: text.strip()}
        try:
            arguments = json.loads(text) if text.strip() else {}
        except (ValueError, RecursionError):
            arguments = None
        if not isinstance(arguments, dict):
            example = ", ".join(f'"{p}": ...' for p in properties[:2])
            raise ToolError(f"write the {self.name} arguments as a JSON object, e.g. <{self.name}>{{{example}}}"
                            f"</{self.name}>")
        return arguments

    def run(self, text: str, *, timeout: float = DEFAULT_TIMEOUT, max_chars: int = DEFAULT_MAX_CHARS) -> "ToolResult":
        """The `ToolResult` of one tags-format call ``<name>text</name>`` of this tool alone, answered in
        ``<information>`` (`Toolset.call`: never raises)."""
        return Toolset([self], timeout=timeout, max_chars=max_chars).call(self.name, text, TAG_SET)

    def schema(self) -> dict[str, Any]:
        """The OpenAI function schema: ``{"type": "function", "function": {"name", "description",
        "parameters"}}`` (what ``tools=`` of a chat template and verl's tool config take)."""
        return {"type": "function", "function": {"name": self.name, "description": self.description,
                                                 "parameters": dict(self.parameters)}}

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r})"


class FunctionTool(Tool):
    """A function as a `Tool` (what `tool` makes): ``call(**arguments)`` is ``function(**arguments)``."""

    def __init__(self, function: Callable[..., Any], *, name: Optional[str] = None,
                 description: Optional[str] = None, parameters: Optional[Mapping[str, Any]] = None,
                 result_kind: str = "tool_result") -> None:
        if not callable(function):
            raise TypeError(f"tool() takes a function, got {type(function).__name__}")
        self.function = function
        self.name = name if name is not None else function.__name__
        doc = inspect.getdoc(function) or ""
        self.description = description if description is not None else doc.split("\n\n")[0].replace("\n", " ")
        self.parameters = dict(parameters) if parameters is not None else _schema_of(function)
        self.result_kind = result_kind
        check_tool(self)

    def call(self, **arguments: Any) -> Any:
        return self.function(**arguments)


def _schema_of(function: Callable[..., Any]) -> dict[str, Any]:
    """The arguments schema of a function's parameters: each a property, typed from its annotation
    (str, int, float, bool, list, dict; others untyped), required when it has no default."""
    hints = typing.get_type_hints(function)
    properties: dict[str, Any] = {}
    required = []
    for parameter in inspect.signature(function).parameters.values():
        if parameter.kind in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD, parameter.POSITIONAL_ONLY):
            raise ValueError(f"tool {function.__name__!r}: parameter {parameter.name!r} cannot be given as a "
                             "keyword; give parameters= explicitly")
        annotation = hints.get(parameter.name)
        origin = typing.get_origin(annotation) or annotation
        properties[parameter.name] = {"type": _JSON_TYPES[origin]} if origin in _JSON_TYPES else {}
        if parameter.default is parameter.empty:
            required.append(parameter.name)
    return {"type": "object", "properties": properties, "required": required}


def tool(function: Optional[Callable[..., Any]] = None, *, name: Optional[str] = None,
         description: Optional[str] = None, parameters: Optional[Mapping[str, Any]] = None,
         result_kind: str = "tool_result") -> Any:
    """Decorator making a `FunctionTool` of a function (sync or ``async``), used bare (``@tool``) or with
    any of the `Tool` attributes given (``@tool(name="calc", parameters={...})``)."""
    def make(fn: Callable[..., Any]) -> FunctionTool:
        return FunctionTool(fn, name=name, description=description, parameters=parameters, result_kind=result_kind)

    return make(function) if function is not None else make


def check_tool(candidate: Any, where: str = "") -> Tool:
    """`candidate` when it is a well-formed `Tool`, else ValueError naming `where` and what is wrong."""
    label = f"{where}: " if where else ""
    if not isinstance(candidate, Tool):
        raise ValueError(f"{label}expected a mempo.tools.Tool, got {type(candidate).__name__}")
    check_tag_name(candidate.name, f"{label}tool name")
    if not isinstance(candidate.description, str):
        raise ValueError(f"{label}tool {candidate.name!r}: description must be a string")
    schema = candidate.parameters
    if not isinstance(schema, Mapping) or schema.get("type") != "object" \
            or not isinstance(schema.get("properties", {}), Mapping):
        raise ValueError(f"{label}tool {candidate.name!r}: parameters must be a JSON schema "
                         '{"type": "object", "properties": {...}}')
    required = schema.get("required", [])
    if not isinstance(required, (list, tuple)) or not all(r in schema.get("properties", {}) for r in required):
        raise ValueError(f"{label}tool {candidate.name!r}: parameters 'required' must list names of its properties")
    if candidate.result_kind not in RESULT_KINDS:
        raise ValueError(f"{label}tool {candidate.name!r}: result_kind must be one of {RESULT_KINDS}, "
                         f"got {candidate.result_kind!r}")
    return candidate


def load_tools(path: str) -> list[Tool]:
    """The tools an import path names (``"package.module:name"``): a `Tool`, a list or tuple of them, or a
    class or function that returns either when called without arguments. ValueError naming the path
    for anything else, or for a factory that raises."""
    target = load_object(path)
    if isinstance(target, type) and issubclass(target, Tool) or (callable(target) and not isinstance(target, Tool)):
        try:
            target = target()
        except Exception as error:  # reason: a user's factory failing is reported as one line
            detail = " ".join(f"{type(error).__name__}: {error}".split())[:300]
            raise ValueError(f"{path!r}: making the tool failed ({detail})") from None
    found = list(target) if isinstance(target, (list, tuple)) else [target]
    if not found:
        raise ValueError(f"{path!r} names no tool (an empty list)")
    return [check_tool(item, repr(path)) for item in found]


def _one_line(text: str, limit: int = 300) -> str:
    return " ".join(str(text).split())[:limit]


class _TimedOut(Exception):
    pass


async def _bounded(awaitable: Awaitable[Any], timeout: float) -> Any:
    return await asyncio.wait_for(awaitable, timeout)


def _invoke(tool_: Tool, arguments: dict[str, Any], timeout: float) -> Any:
    """``tool_.call(**arguments)`` (awaited when it returns an awaitable) on a daemon thread of its own,
    waited for `timeout` seconds (`_TimedOut` then); the tool's exception is re-raised here."""
    outcome: dict[str, Any] = {}
    finished = threading.Event()

    def target() -> None:
        try:
            value = tool_.call(**arguments)
            if inspect.isawaitable(value):
                value = asyncio.run(_bounded(value, timeout))
            outcome["value"] = value
        except BaseException as error:  # reason: SystemExit / KeyboardInterrupt of a tool end only its call
            outcome["error"] = error
        finally:
            finished.set()

    threading.Thread(target=target, name=f"mempo-tool-{tool_.name}", daemon=True).start()
    if not finished.wait(timeout) or isinstance(outcome.get("error"), asyncio.TimeoutError):
        raise _TimedOut
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]


class Toolset:
    """The tools of a run, by name, and how a round's action reaches one (`call`).

    Args:
        tools: `Tool` s (a sequence, or a mapping whose keys are their names).
        timeout: seconds a call may take (`DEFAULT_TIMEOUT`).
        max_chars: the longest observation text kept (`DEFAULT_MAX_CHARS`).
    ValueError for something that is not a `Tool`, two tools of one name, or a key that is not its
    tool's name.
    """

    def __init__(self, tools: Union[Iterable[Tool], Mapping[str, Tool]] = (), *, timeout: float = DEFAULT_TIMEOUT,
                 max_chars: int = DEFAULT_MAX_CHARS) -> None:
        if not timeout > 0 or max_chars < 1:
            raise ValueError(f"timeout must be > 0 and max_chars >= 1, got {timeout} and {max_chars}")
        self.timeout, self.max_chars = float(timeout), int(max_chars)
        items = list(tools.items()) if isinstance(tools, Mapping) else [(None, t) for t in tools]
        self.tools: dict[str, Tool] = {}
        for key, item in items:
            check_tool(item)
            if key is not None and key != item.name:
                raise ValueError(f"the tool under key {key!r} is named {item.name!r}")
            if item.name in self.tools:
                raise ValueError(f"two tools are named {item.name!r}")
            self.tools[item.name] = item

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(self.tools)

    def schemas(self) -> list[dict[str, Any]]:
        """`Tool.schema` of every tool, in order."""
        return [t.schema() for t in self.tools.values()]

    def __len__(self) -> int:
        return len(self.tools)

    def __getitem__(self, name: str) -> Tool:
        return self.tools[name]

    def __contains__(self, name: object) -> bool:
        return name in self.tools

    def system_prompt(self, system: str) -> str:
        """`system` followed by the json format's tools block: the layout Qwen2.5's chat template writes
        for ``tools=`` (the tools' `Tool.schema` inside ``<tools></tools>``, then how to call one), with
        one call per turn. `system` alone when there are no tools."""
        if not self.tools:
            return system
        schemas = "\n".join(json.dumps(schema, ensure_ascii=False) for schema in self.schemas())
        return (f"{system}\n\n# Tools\n\nYou may call one function per turn to assist with the user query.\n\n"
                f"You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n{schemas}\n"
                "</tools>\n\nFor a function call, return a json object with function name and arguments within "
                "<tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": "
                "<args-json-object>}\n</tool_call>")

    def error(self, message: str, tags: TagSet = TAG_SET, kind: str = "tool_result", **metadata: Any) -> ToolResult:
        """A failed call's result: ``Error: <message>`` (one line) in the tool-result block."""
        message = _one_line(message, 500)
        metadata.setdefault("error", message)
        return ToolResult(tags.wrap_tool_result(f"Error: {message}"), kind, ok=False, metadata=metadata)

    def call(self, action: str, content: str, tags: TagSet = TAG_SET) -> ToolResult:
        """The `ToolResult` of a round whose action block is ``<action>content</action>``: the JSON call
        of ``tags.call_tag`` (`parse_tool_call`), else a call of the tool named `action` with
        `Tool.arguments_from_text` (see the module docstring). Never raises for anything the model
        wrote or the tool did."""
        arguments: Optional[dict[str, Any]] = None
        name = action
        if tags.call_tag is not None and action == tags.call_tag:
            try:
                name, arguments = parse_tool_call(content)
            except ToolCallError as error:
                return self.error(str(error), tags)
        found = self.tools.get(name)
        if found is None:
            known = ", ".join(self.tools) or "none"
            return self.error(f"no tool named {name[:60]!r}; the tools are: {known}", tags, tool=name[:60])
        if arguments is None:
            try:
                arguments = found.arguments_from_text(content)
            except ToolError as error:
                return self.error(str(error), tags, found.result_kind, tool=name, **error.metadata)
        name, kind = found.name, found.result_kind
        properties = found.parameters.get("properties", {})
        missing = [r for r in found.parameters.get("required", []) if r not in arguments]
        unknown = [a for a in arguments if properties and a not in properties
                   and found.parameters.get("additionalProperties") is not True]
        if missing or unknown:
            what = (f"lacks the required argument(s) {', '.join(map(repr, missing))}" if missing
                    else f"has unknown argument(s) {', '.join(repr(a[:40]) for a in unknown)}")
            return self.error(f"the {name} call {what}; its arguments are: {', '.join(properties) or 'none'}",
                              tags, kind, tool=name)
        try:
            value = _invoke(found, arguments, self.timeout)
        except _TimedOut:
            return self.error(f"the {name} tool did not answer within {self.timeout:g} s; try again or answer "
                              "with what you know.", tags, kind, tool=name, timed_out=True)
        except ToolError as error:
            return self.error(str(error), tags, kind, tool=name, **error.metadata)
        except BaseException as error:  # reason: whatever a tool raises, the rollout goes on
            detail = _one_line(f"{type(error).__name__}: {error}")
            return self.error(f"the {name} tool failed ({detail}); try again or answer with what you know.",
                              tags, kind, tool=name, error=detail)
        metadata: dict[str, Any] = {"tool": name}
        if isinstance(value, ToolOutput):
            metadata.update(value.metadata)
            value = value.text
        if not isinstance(value, str):
            return self.error(f"the {name} tool returned {type(value).__name__}, not text.", tags, kind, tool=name)
        if not value.isascii():  # a lone surrogate cannot be encoded for the tokenizer: U+FFFD instead
            value = value.encode("utf-8", "surrogatepass").decode("utf-8", "replace")
        text = value
        if len(text) > self.max_chars:
            metadata["truncated"] = len(text)
            text = text[:self.max_chars] + f"\n[... cut: the first {self.max_chars} of {len(text)} characters]"
        return ToolResult(tags.wrap_tool_result(text), kind, ok=True, metadata=metadata)


def as_toolset(tools: Union[Toolset, Iterable[Tool], Mapping[str, Tool]]) -> Toolset:
    """`tools` as a `Toolset` (a given one as it is; others with the default timeout and length)."""
    return tools if isinstance(tools, Toolset) else Toolset(tools)
