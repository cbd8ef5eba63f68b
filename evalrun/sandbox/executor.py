"""The sandbox's one way of running a program (:class:`Sandbox`): written to a private directory, run by the
interpreter under ``prlimit``'s limits inside the chosen isolation, its output read to a bound, its end classified
(:func:`outcome_of`)."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from evalrun.errors import BadInput
from evalrun.records.canonical import sha256_hex
from evalrun.sandbox import (
    ENVIRONMENT,
    SANDBOX_FORMAT,
    WORKDIR,
    Execution,
    Isolation,
    Limits,
    Outcome,
    isolation_named,
)

PROGRAM = "program.py"
# what a program's last words say when a limit stopped it from inside (the exception Python raised)
LIMIT_ERRORS: tuple[tuple[str, Outcome], ...] = (
    ("MemoryError", "memory_limit"),
    ("[Errno 11] Resource temporarily unavailable", "process_limit"),  # fork refused: the process limit
    ("[Errno 24] Too many open files", "open_files_limit"),
    ("[Errno 27] File too large", "file_size_limit"),
    ("[Errno 28] No space left on device", "file_size_limit"),  # the private directory is full
)
CPU_SIGNALS = (signal.SIGXCPU, signal.SIGKILL)  # the soft CPU limit's signal, and the hard limit's


def default_interpreter() -> str:
    """The interpreter programs run under: the system's ``/usr/bin/python3`` when there is one (readable by the
    unprivileged user a root evalrun runs programs as), else the one evalrun runs on."""
    system = Path("/usr/bin/python3")
    return str(system.resolve()) if system.exists() else str(Path(sys.executable).resolve())


@dataclass(frozen=True)
class Sandbox:
    """Programs run one at a time, each in a fresh process, under ``limits`` inside ``isolation``."""

    isolation: Isolation
    limits: Limits
    interpreter: str
    python: str  # the interpreter's version, as it reports it inside the sandbox

    @classmethod
    def open(cls, isolation: str = "bwrap", limits: Limits | None = None, interpreter: str | None = None) -> Sandbox:
        """A sandbox checked to run here: the isolation available, the interpreter found and asked its version
        inside it (a BadInput naming the setting otherwise), before any program runs."""
        chosen = isolation_named(isolation)
        limits = limits or Limits()
        limits.check()
        path = interpreter or default_interpreter()
        if not Path(path).is_file():
            raise BadInput("sandbox.interpreter", f"a Python interpreter's path, got {path!r} (no such file)")
        probe = cls(chosen, limits, path, "")
        done = probe.run("import sys\nprint(sys.version.split()[0])\n", "")
        if done.outcome != "passed":
            raise BadInput("sandbox.isolation", f"{isolation} did not run {path} ({done.outcome}, exit "
                                                f"{done.exit_code}): {done.stderr.strip()[-300:]}")  # fmt: skip
        return cls(chosen, limits, path, done.stdout.strip())

    def identity(self) -> dict[str, Any]:
        """What the run records of the sandbox: how programs were isolated, under which interpreter and limits."""
        return {"format": SANDBOX_FORMAT, "isolation": self.isolation.name, "interpreter": self.interpreter,
                "python": self.python, "limits": asdict(self.limits), "environment": dict(ENVIRONMENT)}  # fmt: skip

    def run(self, program: str, tests: str) -> Execution:
        """Run ``program`` followed by ``tests`` (one source: the tests call what the program defines) and say how
        it ended. Nothing of it outlives the call: its directory is removed, every process it started killed."""
        source = program + ("\n\n" + tests if tests else "")
        directory = Path(tempfile.mkdtemp(prefix="evalrun-sandbox-"))
        try:
            directory.chmod(0o755)  # the unprivileged user a root evalrun runs programs as reads it
            (directory / PROGRAM).write_text(source, encoding="utf-8")
            (directory / PROGRAM).chmod(0o644)
            command = ["prlimit", f"--cpu={self.limits.cpu_seconds}:{self.limits.cpu_seconds + 1}",
                       f"--as={self.limits.memory_bytes}", f"--nproc={self.limits.processes}",
                       f"--nofile={self.limits.open_files}", f"--fsize={self.limits.file_bytes}", "--",
                       self.interpreter, "-I", "-S", f"{WORKDIR}/{PROGRAM}"]  # fmt: skip
            argv = self.isolation.wrap(command, directory, self.limits)
            code, stdout, stderr, stopped = _run_bounded(argv, directory, self.limits)
        finally:
            shutil.rmtree(directory, ignore_errors=True)
        outcome = outcome_of(code, stderr, stopped)
        cap = self.limits.output_bytes
        return Execution(sha256_hex(program), sha256_hex(tests), outcome, code,
                         stdout[:cap].decode("utf-8", "replace"), stderr[:cap].decode("utf-8", "replace"),
                         truncated=len(stdout) > cap or len(stderr) > cap)  # fmt: skip


def outcome_of(code: int, stderr: bytes, stopped: Outcome | None) -> Outcome:
    """How a program ended: ``stopped`` when the sandbox stopped it (its wall-clock backstop, its output); else a
    CPU-limit signal (a negative code, or a shell's 128 + signal); else the limit its last error names; else
    passed (exit 0) or failed."""
    if stopped is not None:
        return stopped
    killed_by = -code if code < 0 else code - 128 if code > 128 else 0
    if killed_by in CPU_SIGNALS:
        return "cpu_limit"
    if code == 0:
        return "passed"
    last = stderr[-2000:].decode("utf-8", "replace")
    for words, limit in LIMIT_ERRORS:
        if words in last:
            return limit
    return "failed"


def _run_bounded(argv: list[str], directory: Path, limits: Limits) -> tuple[int, bytes, bytes, Outcome | None]:
    """Run ``argv`` in a session of its own; read stdout and stderr to one byte past the limit (then stop it) and
    stop it at the wall-clock backstop. The exit code, what was read, and why the sandbox stopped it (or None)."""
    process = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               cwd=directory, env=dict(ENVIRONMENT), start_new_session=True)  # fmt: skip
    streams: dict[str, bytearray] = {"stdout": bytearray(), "stderr": bytearray()}
    over = threading.Event()

    def read(name: str, pipe: Any) -> None:
        kept = streams[name]
        while chunk := pipe.read1(65536):
            if len(kept) <= limits.output_bytes:
                kept.extend(chunk[: limits.output_bytes + 1 - len(kept)])
            if len(kept) > limits.output_bytes:
                over.set()

    readers = [threading.Thread(target=read, args=(n, getattr(process, n)), daemon=True) for n in streams]
    for reader in readers:
        reader.start()
    deadline = time.monotonic() + limits.backstop
    stopped: Outcome | None = None
    while process.poll() is None:
        if over.is_set():
            stopped = "output_limit"
        elif time.monotonic() > deadline:
            stopped = "wall_limit"
        if stopped is not None:
            _kill(process)
            break
        over.wait(0.05)
    process.wait()
    for reader in readers:
        reader.join(timeout=5)
    return process.returncode, bytes(streams["stdout"]), bytes(streams["stderr"]), stopped


def _kill(process: subprocess.Popen[bytes]) -> None:
    """Kill the program's session (under bubblewrap, its PID namespace dies with it)."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
