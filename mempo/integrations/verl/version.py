"""The verl version the integration was built against, and the check that refuses any other.

verl's agent-loop, trainer and plugin APIs changed in every release of 2026 (the V1 trainer became
the default in 0.9.0; ``apply_chat_template`` left the agent loop in 0.9.1); the integration uses a
few private names (``PPOTrainer._compute_advantage``, ``ray_trainer.compute_advantage``, the
``prompt_logprobs`` row layout), so it runs only on the version it was tested with.
"""
from __future__ import annotations

from importlib import metadata

from mempo.errors import MempoError

__all__ = ["VERL_VERSION", "VerlVersionError", "check_verl_version", "installed_verl_version"]

VERL_VERSION = "0.9.1"


class VerlVersionError(MempoError, ImportError):
    """verl is missing, or is not the version this integration was built against."""


def installed_verl_version() -> str:
    """The installed verl distribution's version (VerlVersionError when verl is not installed)."""
    try:
        return metadata.version("verl")
    except metadata.PackageNotFoundError:
        raise VerlVersionError(f"verl is not installed; mempo's verl integration needs verl=={VERL_VERSION} "
                               "(pip install 'mempo[verl]')") from None


def check_verl_version(installed: str | None = None) -> str:
    """Return the installed verl version; VerlVersionError naming both versions unless it is
    `VERL_VERSION` (``installed``: check this string instead of the installed distribution)."""
    found = installed_verl_version() if installed is None else installed
    if found != VERL_VERSION:
        raise VerlVersionError(f"mempo's verl integration was built against verl {VERL_VERSION} and refuses verl "
                               f"{found} (its agent-loop and trainer APIs differ between releases); install "
                               f"verl=={VERL_VERSION} (pip install 'mempo[verl]')")
    return found
