"""The one base class of errors a user can cause and fix. This module imports nothing."""

__all__ = ["MempoError"]


class MempoError(Exception):
    """An error the user can fix: bad input, a bad configuration value, a missing or damaged file,
    an unreachable service.

    ``str(error)`` is one line naming what was wrong (the file, the field, the URL) and what would be
    accepted. `mempo.apps.cli.main` prints it as ``mempo <command>: <message>`` and exits with code
    2; library callers catch it like any exception. Bugs (an invariant broken inside mempo) are not
    MempoErrors and keep their traceback.
    """
