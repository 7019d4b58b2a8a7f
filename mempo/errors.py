"""The one base class of errors a user can cause and fix.

`MempoError`: bad input, a bad configuration value, a missing or damaged file, an unreachable
service. Its message is one line that names what was wrong (the file, the field, the URL) and what
would be accepted. The command line (`mempo.apps.cli.main`) prints it as ``mempo <command>: <message>``
and exits with code 2; library callers catch it like any exception. Errors that are bugs (an
invariant broken inside mempo) are not MempoErrors and keep their traceback.

This module imports nothing.
"""

__all__ = ["MempoError"]


class MempoError(Exception):
    """An error the user can fix (module docstring); ``str(error)`` is the one-line message."""
