"""The one error type a user can cause, and its few refinements.

Every message is a single line that names the file, key or value at fault and
the fix. Entry points print ``str(error)`` and exit with ``error.exit_code``;
no traceback is shown.
"""

from __future__ import annotations


class WheelhouseError(Exception):
    """A problem the user can fix; ``str()`` is the whole message."""

    exit_code = 1

    def __init__(self, message: str) -> None:
        # One line, always: a multi-line message would break CI log annotations.
        super().__init__(" ".join(message.split("\n")))


class ConfigError(WheelhouseError):
    """versions.yaml (or another input file) is malformed."""

    exit_code = 2


class UsageError(WheelhouseError):
    """A command-line value or file argument is malformed (exit status 2, like an argument error)."""

    exit_code = 2


class CheckFailed(WheelhouseError):
    """A wheel check found a defect; the wheel must not be published."""

    exit_code = 1


class RemoteError(WheelhouseError):
    """The release store (GitHub or local) refused or failed an operation."""

    exit_code = 1
