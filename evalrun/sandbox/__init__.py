"""Model-written code run apart from evalrun: the contract of a sandbox and its registry.

A :class:`Sandbox` runs one program (the model's code and the task's tests, one Python source) in a fresh process
that sees none of evalrun's files, credentials or network, with an empty environment but for a fixed
``PYTHONHASHSEED``, ``TZ=UTC`` and ``LANG``, a private temporary directory as its only writable place, and
resource limits (:class:`Limits`). Its timeout is in CPU seconds, not wall-clock time, so a verdict does not depend
on how loaded the machine is; a wall-clock backstop (a multiple of it) stops only a program that waits without
computing (a sleep). Each run gives an :class:`Execution`: what was run (by hashes), how it ended
(:data:`Outcome`: passed, failed, or the limit it hit) and its output cut to a bound, a record an episode's chain
can hold, so that verify covers it and replay serves it without running anything again.

How a program is kept apart is an :class:`Isolation`, one module each, registered by name (``@isolation("bwrap")``):
``bwrap`` (bubblewrap: new user, network, PID, IPC and mount namespaces), and ``none``, which a user must ask for by
name, for a machine without namespaces (limits only: the program sees the network and the files the user can).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal, Protocol

from evalrun.config.registry import Registry
from evalrun.errors import BadInput

SANDBOX_FORMAT = "evalrun.sandbox/1"
# how a program ended: it ran to exit 0, it exited otherwise, or the limit that stopped it
Outcome = Literal["passed", "failed", "cpu_limit", "wall_limit", "memory_limit", "process_limit", "open_files_limit",
                  "file_size_limit", "output_limit"]  # fmt: skip
ENVIRONMENT = {"PYTHONHASHSEED": "0", "TZ": "UTC", "LANG": "C.UTF-8", "PATH": "/usr/bin:/bin", "HOME": "/work"}
WORKDIR = "/work"  # the program's private directory, as the program sees it (where it runs, its only writable place)


@dataclass(frozen=True)
class Limits:
    """What one program may use. ``cpu_seconds`` is its timeout (CPU time: the same verdict on an idle and a loaded
    machine); ``wall_seconds`` a backstop for a program that does not compute (None: ten times the CPU limit, and at
    least 10 s)."""

    cpu_seconds: int = 10
    memory_bytes: int = 1 << 30  # address space
    processes: int = 32
    open_files: int = 64
    file_bytes: int = 16 << 20  # the largest file it may write, and the size of its directory
    output_bytes: int = 64 << 10  # stdout and stderr each, kept and read; past it the program is stopped
    wall_seconds: float | None = None

    @property
    def backstop(self) -> float:
        return self.wall_seconds if self.wall_seconds is not None else max(10.0 * self.cpu_seconds, 10.0)

    def check(self) -> None:
        for name, value in asdict(self).items():
            if value is not None and (not isinstance(value, int | float) or isinstance(value, bool) or value <= 0):
                raise BadInput(f"sandbox.{name}", f"a positive number, got {value!r}")


@dataclass(frozen=True)
class Execution:
    """One program's run, as an episode records it: the program and its tests by their sha256, how it ended, its
    exit code (or the signal that ended it, negative), and stdout and stderr cut to the limit (``truncated``)."""

    program_sha256: str
    tests_sha256: str
    outcome: Outcome
    exit_code: int
    stdout: str
    stderr: str
    truncated: bool = False

    @property
    def passed(self) -> bool:
        return self.outcome == "passed"

    def as_record(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_record(cls, record: dict[str, Any]) -> Execution:
        return cls(**record)


class Isolation(Protocol):
    """How a program is kept apart from evalrun: the command that runs ``command`` (a program in ``directory``,
    seen by it as :data:`WORKDIR`) isolated, or why it cannot be here."""

    name: str

    def unavailable(self) -> str | None:
        """Why this isolation cannot run here (None: it can)."""
        ...

    def wrap(self, command: Sequence[str], directory: Path, limits: Limits) -> list[str]:
        """The argv that runs ``command`` isolated, its working directory ``directory`` (seen as WORKDIR)."""
        ...


ISOLATIONS: Registry[Callable[[], Isolation]] = Registry("isolation", field="sandbox.isolation")
ISOLATIONS.declare("bwrap", "evalrun.sandbox.bwrap")
ISOLATIONS.declare("none", "evalrun.sandbox.unisolated")


def isolation(name: str) -> Callable[[Callable[[], Isolation]], Callable[[], Isolation]]:
    """Register an isolation (a class whose instances keep programs apart) as ``name``."""
    return ISOLATIONS.register(name)


def isolation_named(name: str) -> Isolation:
    """The registered isolation ``name``; a BadInput naming ``sandbox.isolation`` when there is none, or when it
    cannot run here (with the way out)."""
    chosen = ISOLATIONS.get(name)()
    why = chosen.unavailable()
    if why is not None:
        raise BadInput("sandbox.isolation", f"{name} cannot isolate model-written code here: {why}. Install it, or "
                                            "run the code unisolated (it sees the network and your files) with "
                                            "sandbox.isolation=none")  # fmt: skip
    return chosen
