"""Errors that map onto the exit codes every evalrun command shares (docs/design.md "Exit codes")."""

from __future__ import annotations

EXIT_OK = 0
EXIT_CHECK_FAILED = 1
EXIT_BAD_INPUT = 2


class BadInput(Exception):
    """Bad input or usage (exit 2). ``where`` names the file, field or line; ``message`` what was expected."""

    def __init__(self, where: str, message: str) -> None:
        super().__init__(f"{where}: {message}")
        self.where = where
        self.message = message


class CheckFailed(Exception):
    """A check failed (exit 1): verification, replay divergence, blocked gate."""
