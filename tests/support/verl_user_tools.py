"""A verl user's tools, written as a verl user writes them: `BaseTool` subclasses that verl's tool YAML
names by ``class_name`` (``actor_rollout_ref.rollout.multi_turn.tool_config_path``; `tool_yaml` writes
one with these and verl's own `BaseTool`), and ``@function_tool`` functions in
``support/verl_function_tools.py`` (``multi_turn.function_tool_path``: verl loads that file by path).
The bad ones misbehave as a tool can: raise, hang, flood, answer with an image. Imports verl."""
from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from verl.tools.base_tool import BaseTool
from verl.tools.schemas import ToolResponse

#: ``multi_turn.function_tool_path`` of the ``shout`` function tool (one path per process: verl's
#: registry refuses a second function of the same name from another file)
FUNCTION_TOOLS = Path(__file__).with_name("verl_function_tools.py")
#: every lifecycle call of the `ColourBook` tools: ("create" | "execute" | "release", instance id, ...)
LIFECYCLE: list[tuple] = []


class ColourBook(BaseTool):
    """A stateful tool: ``create`` opens an instance, ``execute`` looks the thing up in
    ``config["table"]`` (and counts the instance's calls), ``release`` closes it."""

    def __init__(self, config: dict, tool_schema: Any) -> None:
        super().__init__(config, tool_schema)
        self.open: dict[str, int] = {}

    async def create(self, instance_id=None, **kwargs):
        instance_id, response = await super().create(instance_id, **kwargs)
        self.open[instance_id] = 0
        LIFECYCLE.append(("create", instance_id, kwargs))
        return instance_id, response

    async def execute(self, instance_id, parameters, **kwargs):
        self.open[instance_id] += 1
        LIFECYCLE.append(("execute", instance_id, dict(parameters)))
        thing = str(parameters.get("thing", "")).strip().lower()
        value = self.config["table"].get(thing)
        text = f"{thing} is {value}" if value else f"no colour for {thing!r}"
        return ToolResponse(text=text), 0.5, {"calls": self.open[instance_id]}

    async def release(self, instance_id, **kwargs):
        LIFECYCLE.append(("release", instance_id))
        del self.open[instance_id]


class Exploding(ColourBook):
    async def execute(self, instance_id, parameters, **kwargs):
        raise RuntimeError("the sandbox is down\nsecond line")


class Sleeping(BaseTool):
    async def execute(self, instance_id, parameters, **kwargs):
        await asyncio.sleep(600)
        return ToolResponse(text="late"), 0.0, {}


class Flooding(BaseTool):
    async def execute(self, instance_id, parameters, **kwargs):
        return ToolResponse(text="y" * (1 << 20)), 0.0, {}


class Picture(BaseTool):
    async def execute(self, instance_id, parameters, **kwargs):
        return ToolResponse(image=["<an image>"]), 0.0, {}


class Silent(BaseTool):
    async def execute(self, instance_id, parameters, **kwargs):
        return ToolResponse(), 0.0, {}


def _schema(name: str, description: str, properties: dict, required: list) -> dict:
    return {"type": "function", "function": {"name": name, "description": description,
                                             "parameters": {"type": "object", "properties": properties,
                                                            "required": required}}}


THING = {"thing": {"type": "string", "description": "what to look up"}}
#: verl's tool YAML entries by tool name: (class_name, config, tool_schema)
TOOLS = {
    "touch": ("verl.tools.base_tool.BaseTool", {"type": "native"}, _schema("touch", "Update the tool state.", {}, [])),
    "colour": ("support.verl_user_tools.ColourBook", {"type": "native", "table": {"grass": "green", "snow": "white"}},
               _schema("colour", "The colour of a thing, from a colour book.", THING, ["thing"])),
    "explode": ("support.verl_user_tools.Exploding", {"type": "native", "table": {}},
                _schema("explode", "A tool whose backend fails.", {}, [])),
    "sleep": ("support.verl_user_tools.Sleeping", {"type": "native"}, _schema("sleep", "A tool that hangs.", {}, [])),
    "flood": ("support.verl_user_tools.Flooding", {"type": "native"}, _schema("flood", "A megabyte of text.", {}, [])),
    "picture": ("support.verl_user_tools.Picture", {"type": "native"}, _schema("picture", "An image.", {}, [])),
    "silent": ("support.verl_user_tools.Silent", {"type": "native"}, _schema("silent", "No text at all.", {}, [])),
}


def tool_yaml(path: Path, names=tuple(TOOLS)) -> Path:
    """verl's tool YAML (``tools: [{class_name, config, tool_schema}]``) of the `TOOLS` named."""
    import yaml

    entries = [{"class_name": TOOLS[n][0], "config": TOOLS[n][1], "tool_schema": TOOLS[n][2]} for n in names]
    path.write_text(yaml.safe_dump({"tools": entries}, sort_keys=False))
    return path
