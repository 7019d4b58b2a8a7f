"""``python -m mempo.integrations.verl``: what the verl plugin registered in this process.

Imports verl (which loads the plugin through its entry point, or ``VERL_USE_EXTERNAL_MODULES``),
then reads verl's own registries: the advantage estimator "mempo", the agent loops "mempo_agent"
and "mempo_agent_eval", the V1 trainer "mempo_sync", the legacy ``compute_advantage`` patch. Prints
one line per component and whether the ``verl.plugins`` entry point is installed; exits 1 when any
component is missing (with the reason the plugin recorded), 0 otherwise.
"""
from __future__ import annotations

import sys
from importlib import metadata

import verl  # loads the plugin the way every verl process does

from mempo.integrations.verl import AGENTS_YAML, registration_status
from mempo.integrations.verl.version import VERL_VERSION

__all__ = ["check", "main"]


def check() -> tuple[list[str], bool]:
    """(report lines, every component registered)."""
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


def main() -> int:
    lines, ok = check()
    print("\n".join(lines))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
