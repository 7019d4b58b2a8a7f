"""A user's tools and outcome rewards, written outside the mempo package as a user's own module would
be, and named in configs by import path (``"support.user_tools:lookup"``, ``tests/`` is on the path):
the tests of `mempo.tools`, of the outcome reward, of `mempo train` / `eval` / `serve` and the no-gold
test use them. The bad ones misbehave in every way a tool or a reward can."""
from __future__ import annotations

import asyncio
import threading

from mempo.tools import Tool, ToolError, tool

#: the table `lookup` reads (lower-case keys)
TABLE = {"apple": "red", "sky": "blue", "grass": "green"}
#: every `lookup` call's key, in call order (the tests read which calls reached the tool)
LOOKUPS: list[str] = []
#: every `overlap_reward` call's (answer, example)
REWARD_CALLS: list[tuple] = []
#: what the hanging tool waits for (set it to let its thread end)
RELEASE = threading.Event()


@tool
def lookup(key: str) -> str:
    """The colour stored under a key of a small table."""
    LOOKUPS.append(key)
    value = TABLE.get(key.strip().lower())
    return f"{key.strip()} is {value}" if value else f"no entry for {key.strip()!r}; the keys are {', '.join(TABLE)}"


@tool(name="alookup", description="The colour under a key, from an async service.")
async def async_lookup(key: str) -> str:
    await asyncio.sleep(0)
    return TABLE.get(key.strip().lower(), "unknown")


class Calculator(Tool):
    """A tool written as a subclass."""

    name = "calc"
    description = "Add two integers."
    parameters = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                  "required": ["a", "b"]}

    def call(self, a: int, b: int) -> str:
        if not isinstance(a, int) or not isinstance(b, int):
            raise ToolError(f"calc adds integers; got {a!r} and {b!r}")
        return str(a + b)


def calc_tools() -> list[Tool]:
    """A factory naming several tools at once."""
    return [Calculator(), async_lookup]


# -- bad tools ---------------------------------------------------------------------------------------

@tool
def raises(x: str = "") -> str:
    raise RuntimeError("the backend exploded\nwith a second line")


@tool
def hangs(x: str = "") -> str:
    RELEASE.wait(600)
    return "late"


@tool
async def hangs_async(x: str = "") -> str:
    await asyncio.sleep(600)
    return "late"


@tool
def megabytes(x: str = "") -> str:
    return "x" * (8 << 20)


@tool
def returns_int(x: str = "") -> str:
    return 42  # type: ignore[return-value]


@tool
def returns_bytes(x: str = "") -> str:
    return b"raw bytes"  # type: ignore[return-value]


@tool
def returns_none(x: str = "") -> str:
    return None  # type: ignore[return-value]


@tool
def exits(x: str = "") -> str:
    raise SystemExit(3)


@tool
def surrogate(x: str = "") -> str:
    return "half a pair: \ud800 end"


NOT_A_TOOL = 42
EMPTY: list = []


def broken_factory() -> Tool:
    raise ImportError("needs a package that is not installed")


# -- rewards -----------------------------------------------------------------------------------------

def overlap_reward(answer, example) -> float:
    """The share of the example's questions whose gold (any alias) the answer holds, case-insensitively."""
    REWARD_CALLS.append((answer, example))
    golds = example["golds"]
    text = (answer or "").lower()
    return sum(any(alias.lower() in text for alias in aliases) for aliases in golds) / len(golds)


def answered_reward(answer, example) -> float:
    """A reward that needs no reference answer: 1 for a non-empty answer."""
    REWARD_CALLS.append((answer, example))
    return 1.0 if answer and answer.strip() else 0.0


def nan_reward(answer, example) -> float:
    return float("nan")


def string_reward(answer, example) -> float:
    return "1.0"  # type: ignore[return-value]


def raising_reward(answer, example) -> float:
    return example["no such field"]
