"""``python -m mempo.integrations.verl [--config RUN.yaml] [key=value ...]``: what the verl plugin
registered in this process, and whether a run configuration can train mempo.

    python -m mempo.integrations.verl [--help]

Imports verl (which loads the plugin through its entry point, or ``VERL_USE_EXTERNAL_MODULES``),
then reads verl's own registries: the advantage estimator "mempo", the agent loops "mempo_agent"
and "mempo_agent_eval", the V1 trainer "mempo_sync", the legacy ``compute_advantage`` patch, the
default reward function for mempo rows. Prints one line per component and whether the
``verl.plugins`` entry point is installed. With ``--config`` and/or overrides (the ones given to
``verl.trainer.main_ppo``), it also checks that configuration on verl's defaults
(`mempo.integrations.verl.run_check.check_run_config`: the trainer mode, the estimator, mempo's
outcome reward as verl's reward function, verl's tools, the agent-loop YAML's mempo entries with
their action format and tools) and prints one line per problem. Exits 2 when the configuration
has a problem or an option is unknown (argparse's usage), 1 when a component is missing (with the
reason the plugin recorded) or verl cannot be imported (one line naming the error), 0 otherwise.
"""
from __future__ import annotations

import argparse
import sys
from importlib import metadata
from typing import Optional, Sequence

from mempo.config import ConfigError
from mempo.integrations.verl import AGENTS_YAML, registration_status
from mempo.integrations.verl.version import VERL_VERSION

__all__ = ["build_parser", "check", "check_config", "main"]


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
    try:
        from mempo.integrations.verl.reward import is_installed as reward_installed  # reason: imports verl
        found["default reward function for mempo rows"] = reward_installed()
    except ImportError:
        found["default reward function for mempo rows"] = False
    status = registration_status()
    for name, ok in found.items():
        lines.append(f"{'ok  ' if ok else 'MISSING'} {name}" + ("" if ok else f": {status.get(name, 'not imported')}"))
    lines.append(f"agent-loop YAML: {AGENTS_YAML}")
    return lines, all(found.values())


def check_config(config_file: Optional[str], overrides: Sequence[str]) -> list[str]:
    """The problems of a run configuration (`check_run_config` on `load_run_config`), one line each."""
    # reason: run_check imports verl, whose failure `main` reports in one line
    from mempo.integrations.verl.run_check import check_run_config, load_run_config

    try:
        return check_run_config(load_run_config(config_file, overrides))
    except ConfigError as error:
        return [str(error)]


def build_parser() -> argparse.ArgumentParser:
    """The checker's options: a run configuration to check (``--config``, overrides)."""
    parser = argparse.ArgumentParser(prog="python -m mempo.integrations.verl",
                                     description="what the mempo verl plugin registered; with --config or overrides, "
                                                 "whether that verl run configuration can train mempo")
    parser.add_argument("--config", default=None, help="a YAML of verl config keys (merged on verl's defaults)")
    parser.add_argument("overrides", nargs="*", help="verl.trainer.main_ppo overrides, key=value (hydra style)")
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Parse `argv` (default: sys.argv[1:]), run `check` (and `check_config`), print its lines; the
    exit code (module docstring)."""
    args = build_parser().parse_args(argv)
    try:
        import verl  # noqa: F401  # reason: optional; failing (a missing module it was told to load): one line
    except Exception as error:
        print(f"mempo verl check: cannot import verl: {type(error).__name__}: {' '.join(str(error).split())}",
              file=sys.stderr)
        return 1
    lines, ok = check()
    code = 0 if ok else 1
    if args.config is not None or args.overrides:
        problems = check_config(args.config, args.overrides)
        lines.append("run config: ok" if not problems else f"run config: {len(problems)} problem(s)")
        lines.extend(f"ERROR {problem}" for problem in problems)
        code = 2 if problems else code
    print("\n".join(lines))
    return code


if __name__ == "__main__":
    sys.exit(main())
