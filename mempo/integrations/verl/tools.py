"""The tools of a mempo agent loop inside verl: yours from verl's tool machinery and from mempo.

A mempo loop runs mempo's own agent loop (`mempo.rollout.loop.RolloutEngine`), whose tool calls go
through `mempo.tools.Toolset.call` (the tags or the json action format; malformed calls, unknown tools,
raises, timeouts, non-text and oversized results become one bounded observation). So the adapter goes
from verl to mempo: `VerlTool` makes a verl tool a `mempo.tools.Tool`, and a loop's tools are, in order,

* ``env.tools`` of its agent-loop entry: the built-in ``search`` / ``access`` and mempo `Tool` s named by
  import path (``"my_pkg.tools:lookup"``, `mempo.tools.load_tools`; no adapter needed);
* the tools verl hands every agent loop (``tools=ToolListWrap``): `BaseTool` subclasses from verl's tool
  YAML (``actor_rollout_ref.rollout.multi_turn.tool_config_path``: ``class_name`` + ``config`` +
  ``tool_schema``) and ``@function_tool`` functions (``multi_turn.function_tool_path``), each a `VerlTool`.

A verl user's existing `BaseTool` classes therefore work unchanged through verl's own YAML, and a mempo
user's `Tool` s through ``env.tools``. A `BaseTool` call is verl's lifecycle, as verl's
``ToolAgentLoop`` runs it: ``create(create_kwargs={})``, ``execute(instance_id, arguments)``,
``release(instance_id)`` (release also after a raise). Its `ToolResponse` text is the observation
(None: empty), an image or video is an error line (the mempo loops read text), and the step reward and
metrics it returns are not used (the outcome and the memory reward are the training signal).

verl tools run on one event loop per process that runs only their calls (`tool_loop`): what a tool
binds to its loop (an HTTP session, a lock) stays valid from call to call, a slow tool never holds up
the worker's generation and scoring requests, and a call past ``env.tool_timeout`` is cancelled there
(a tool that blocks that loop, e.g. with a synchronous call inside ``async def``, holds up the other
verl tools' calls, as in verl it holds up the worker).

The per-sample ``tools_kwargs`` (``create_kwargs``) and ``extra_info.tool_selection`` of verl's
datasets are refused by the loops (`mempo.integrations.verl.agent_loop`): ``create_kwargs`` can carry
a sample's gold answer into a tool, and so into an observation.
"""
from __future__ import annotations

import asyncio
import contextlib
import io
import threading
from typing import Any, Optional, Sequence

from verl.tools.function_tool import FunctionTool as VerlFunctionTool
from verl.tools.function_tool import load_function_tools_from_path, normalize_function_tool_return
from verl.tools.schemas import ToolResponse
from verl.tools.tool_registry import initialize_tools_from_config
from verl.utils.import_utils import resolve_config_path

from mempo.config import ConfigError, EnvConfig, MempoConfig, RolloutConfig
from mempo.env.build import build_tools
from mempo.env.closed_book import ClosedBookRetriever
from mempo.protocol.tags import tag_set_for
from mempo.tools import DEFAULT_TIMEOUT, Tool, ToolError, ToolOutput, Toolset, check_tool

__all__ = ["TOOL_CONFIG_PATH", "FUNCTION_TOOL_PATH", "VerlTool", "load_verl_tools", "loop_toolset", "tool_loop"]

TOOL_CONFIG_PATH = "actor_rollout_ref.rollout.multi_turn.tool_config_path"
FUNCTION_TOOL_PATH = "actor_rollout_ref.rollout.multi_turn.function_tool_path"
_LOOP: list[asyncio.AbstractEventLoop] = []
_LOOP_LOCK = threading.Lock()


def tool_loop() -> asyncio.AbstractEventLoop:
    """This process's event loop for the verl tools' calls (started on first use, on a daemon thread)."""
    with _LOOP_LOCK:
        if not _LOOP:
            loop = asyncio.new_event_loop()
            threading.Thread(target=loop.run_forever, name="mempo-verl-tools", daemon=True).start()
            _LOOP.append(loop)
        return _LOOP[0]


class VerlTool(Tool):
    """A verl tool as a mempo `Tool`: a `BaseTool` instance (verl's tool YAML) or a verl
    ``FunctionTool`` (``@function_tool``). name, description and parameters are its
    ``tool_schema``'s; ``call(**arguments)`` runs it (module docstring) on `tool_loop`, cancelled
    there after `timeout` seconds. ValueError naming the tool for one that has no OpenAI function
    schema or whose name or schema mempo cannot use (`mempo.tools.check_tool`)."""

    result_kind = "tool_result"

    def __init__(self, verl_tool: Any, *, timeout: float = DEFAULT_TIMEOUT) -> None:
        schema = getattr(verl_tool, "tool_schema", None)
        function = getattr(schema, "function", None)
        if function is None or not hasattr(function, "model_dump"):
            raise ValueError(f"{type(verl_tool).__name__} is not a verl tool (a BaseTool or a @function_tool, with "
                             "an OpenAI function tool_schema)")
        dumped = function.model_dump(exclude_none=True)
        self.verl_tool, self.timeout = verl_tool, float(timeout)
        self.name = str(dumped.get("name", ""))
        self.description = str(dumped.get("description", ""))
        self.parameters = dumped.get("parameters") or {"type": "object", "properties": {}}
        check_tool(self, f"verl tool {type(verl_tool).__name__}")

    def call(self, **arguments: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(self._bounded(arguments), tool_loop()).result()

    async def _bounded(self, arguments: dict[str, Any]) -> Any:
        return await asyncio.wait_for(self._execute(arguments), self.timeout)

    async def _execute(self, arguments: dict[str, Any]) -> ToolOutput:
        tool = self.verl_tool
        if isinstance(tool, VerlFunctionTool):
            response, reward, metrics = normalize_function_tool_return(await tool.call(arguments))
        else:
            instance_id, _ = await tool.create(create_kwargs={})
            try:
                response, reward, metrics = await tool.execute(instance_id, arguments)
            finally:
                await tool.release(instance_id)
        if not isinstance(response, ToolResponse):
            return response  # not text: the Toolset makes it an error line naming the type
        if response.image or response.video:
            raise ToolError(f"the {self.name} tool returned an image or a video; the mempo loops read text only")
        return ToolOutput(response.text or "", {"verl_reward": reward, "verl_metrics": metrics})


def load_verl_tools(tool_config_path: Optional[str], function_tool_path: Optional[str]) -> list[Any]:
    """verl's tools of a run, loaded as verl's agent-loop worker loads them (``load_all_tools``; a
    `BaseTool`'s constructor prints its schema: silenced here). ConfigError naming the setting whose
    file cannot be loaded."""
    tools: list[Any] = []
    for setting, path, load in ((TOOL_CONFIG_PATH, tool_config_path, initialize_tools_from_config),
                                (FUNCTION_TOOL_PATH, function_tool_path, load_function_tools_from_path)):
        if not path:
            continue
        try:
            with contextlib.redirect_stdout(io.StringIO()):
                tools.extend(load(resolve_config_path(str(path))))
        except Exception as error:  # reason: whatever a tool file or class raises is one line naming the setting
            detail = " ".join(f"{type(error).__name__}: {error}".split())[:300]
            raise ConfigError(setting, f"cannot load the verl tools of {path} ({detail})") from None
    return tools


def loop_toolset(env: EnvConfig, action_format: str, verl_tools: Sequence[Any], retriever: Any = None, *,
                 entry: str) -> Toolset:
    """The tools of one mempo loop (module docstring): ``env.tools`` over `retriever` (None: a retriever
    that finds nothing, for checking names and schemas only), then `verl_tools` as unbound `VerlTool`
    s; calls bounded by ``env.tool_timeout`` and ``env.tool_result_chars``. ConfigError naming
    ``<entry>.env.tools[i]`` (a path that does not import or names no tool), `TOOL_CONFIG_PATH` (a
    verl tool mempo cannot use), or ``<entry>.env.tools`` (two tools of one name; in the tags format, a
    name that cannot be a tag)."""
    cfg = MempoConfig(env=env, rollout=RolloutConfig(action_format=action_format))
    try:
        own = build_tools(cfg, retriever if retriever is not None else ClosedBookRetriever())
    except ConfigError as error:
        raise error.under(entry) from None
    adapted = []
    for item in verl_tools:
        try:
            adapted.append(VerlTool(item, timeout=env.tool_timeout))
        except ValueError as error:
            raise ConfigError(TOOL_CONFIG_PATH, f"{error} (or {FUNCTION_TOOL_PATH})") from None
    both = sorted(set(own.names) & {t.name for t in adapted})
    if both:
        raise ConfigError(f"{entry}.env.tools", f"tool(s) {both} are both in env.tools and among verl's tools "
                                                f"({TOOL_CONFIG_PATH} / {FUNCTION_TOOL_PATH}); drop or rename one")
    try:
        toolset = Toolset([*own.tools.values(), *adapted], timeout=env.tool_timeout, max_chars=env.tool_result_chars)
        tag_set_for(action_format, toolset.names)
    except ValueError as error:
        raise ConfigError(f"{entry}.env.tools", str(error)) from None
    return toolset

