"""Errors that map onto the exit codes every evalrun command shares (docs/design.md "Exit codes")."""

from __future__ import annotations

import errno
from pathlib import Path
from typing import Any

EXIT_OK = 0
EXIT_CHECK_FAILED = 1
EXIT_BAD_INPUT = 2
EXIT_INTERRUPTED = 130


class KeepsFields:
    """An exception that pickles with its fields, so that it crosses a process boundary intact: raised in a Ray
    worker, it reaches the driver (and the CLI's one line and exit code) as it was raised. Python pickles an
    exception as ``cls(*args)``, which fails for one whose ``__init__`` takes other arguments than its message
    (``BadInput(where, message)``): Ray then hands over an ``UnserializableException`` and the CLI a traceback.
    Its traceback and ``__cause__`` stay behind, as with every pickled exception; a Ray worker's traceback comes as
    ``remote_traceback`` (set by the dispatcher, printed by ``evalrun --debug``)."""

    def __reduce__(self) -> tuple[Any, ...]:
        return (_restore, (type(self), self.args, dict(self.__dict__)))  # type: ignore[attr-defined]


def _restore(cls: type[BaseException], args: tuple[Any, ...], fields: dict[str, Any]) -> BaseException:
    exc = cls.__new__(cls, *args)
    exc.args = args
    exc.__dict__.update(fields)
    return exc


class BadInput(KeepsFields, Exception):
    """Bad input or usage (exit 2). ``where`` names the file, field or line; ``message`` what was expected."""

    def __init__(self, where: str, message: str) -> None:
        super().__init__(f"{where}: {message}")
        self.where = where
        self.message = message


class CheckFailed(KeepsFields, Exception):
    """A check failed (exit 1): verification, replay divergence, blocked gate."""


class WriteFailed(BadInput):
    """A file could not be written (disk full, read-only or missing directory): exit 2, naming the file."""


def write_failed(path: Path | str, exc: OSError) -> WriteFailed:
    """The WriteFailed for ``exc``, saying what the user can do about it."""
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        advice = "no space left on the device; free some space"
    elif exc.errno in (errno.EROFS, errno.EACCES, errno.EPERM):
        advice = "not writable (a read-only file system or no permission); make it writable"
    elif exc.errno in (errno.ENOENT, errno.ENOTDIR):
        advice = "its directory is missing (removed while evalrun wrote to it?)"
    else:
        advice = f"cannot be written ({exc.strerror or exc})"
    return WriteFailed(str(path), advice)


class Interrupted(KeepsFields, KeyboardInterrupt):
    """Ctrl-C during a run (exit 130); ``run`` is the run directory it leaves incomplete, to resume."""

    def __init__(self, run: Path) -> None:
        super().__init__(str(run))
        self.run = run


def first_line(exc: BaseException) -> str:
    """An exception as one line, its type first (for a record that names why something was not done)."""
    return (f"{type(exc).__name__}: {exc}".splitlines() or [type(exc).__name__])[0]
