"""``python -m mempo.integrations.verl``: what the verl plugin registered in this process.

    python -m mempo.integrations.verl [--help]

Imports verl (which loads the plugin through its entry point, or ``VERL_USE_EXTERNAL_MODULES``),
then reads verl's own registries: the advantage estimator "mempo", the agent loops "mempo_agent"
and "mempo_agent_eval", the V1 trainer "mempo_sync", the legacy ``compute_advantage`` patch. Prints
one line per component and whether the ``verl.plugins`` entry point is installed; exits 1 when any
component is missing (with the reason the plugin recorded) or verl cannot be imported (one line
naming the error), 2 for an unknown option (argparse's usage), 0 otherwise.
"""
from __future__ import annotations

import argparse
import sys
from importlib import metadata
from typing import Optional, Sequence

from mempo.integrations.verl import AGENTS_YAML, registration_status
from mempo.integrations.verl.version import VERL_VERSION

__all__ = ["build_parser", "check", "main"]


def check() -> tuple[list[str], bool]:
    """(report lines, every component registered). Imports verl, which loads the plugin the way
    every verl process does (what that import raises propagates: `main` reports it)."""
    import verl  # reason: optional dependency; its import loads the plugin (entry point or environment)

    lines = [f"verl {verl.__version__} (built against {VERL_VERSION})"]
    points = [e for e in metadata.entry_points(group="verl.plugins") if e.value.startswith("mempo.integrations")]
    lines.append("entry point: " + (", ".join(f"{e.name} = {e.value}" for e in points) if points else
                                    "none installed (use VERL_USE_EXTERNAL_MODULES=mempo.integrations.verl)"))
    found = {}
    # reason (each import below): verl's registries, imported one by one so that a part of verl that
    # fails to import marks only its component missing
    try:
        from verl.trainer.ppo.core_algos import ADV_ESTIMATOR_REGISTRY  # reason: see above
        found["estimator 'mempo'"] = "mempo" in ADV_ESTIMATOR_REGISTRY
    except ImportError:
        found["estimator 'mempo'"] = False
    try:
        from verl.experimental.agent_loop.agent_loop import _agent_loop_registry  # reason: see above
        found["agent loops 'mempo_agent', 'mempo_agent_eval'"] = all(
            name in _agent_loop_registry for name in ("mempo_agent", "mempo_agent_eval"))
    except ImportError:
        found["agent loops 'mempo_agent', 'mempo_agent_eval'"] = False
    try:
        from verl.trainer.ppo.v1.trainer_base import TRAINER_REGISTRY  # reason: see above
        found["V1 trainer 'mempo_sync'"] = "mempo_sync" in TRAINER_REGISTRY
    except ImportError:
        found["V1 trainer 'mempo_sync'"] = False
    try:
        from verl.trainer.ppo import ray_trainer  # reason: see above
        found["legacy compute_advantage patch"] = hasattr(ray_trainer, "_verl_compute_advantage")
    except ImportError:
        found["legacy compute_advantage patch"] = False
    status = registration_status()
    for name, ok in found.items():
        lines.append(f"{'ok  ' if ok else 'MISSING'} {name}" + ("" if ok else f": {status.get(name, 'not imported')}"))
    lines.append(f"agent-loop YAML: {AGENTS_YAML}")
    return lines, all(found.values())


def build_parser() -> argparse.ArgumentParser:
    """The checker's options (none yet besides ``--help``)."""
    return argparse.ArgumentParser(prog="python -m mempo.integrations.verl",
                                   description="check what the mempo verl plugin registered in verl")


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Parse `argv` (default: sys.argv[1:]), run `check`, print its lines; the exit code (module
    docstring)."""
    build_parser().parse_args(argv)
    try:
        import verl  # noqa: F401  # reason: optional; failing (a missing module it was told to load): one line
    except Exception as error:
        print(f"mempo verl check: cannot import verl: {type(error).__name__}: {' '.join(str(error).split())}",
              file=sys.stderr)
        return 1
    lines, ok = check()
    print("\n".join(lines))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
