"""Named crash points for testing recovery: ``EVALRUN_FAILPOINT=NAME`` makes the driver SIGKILL
itself when it reaches ``NAME`` (no cleanup, no flush: exactly what a power cut or OOM kill does).

Points: ``before-first-part``, ``after-part-K`` (K = 0, 1, ...), ``before-record``; in an engine worker that
writes its own parts, ``worker-after-write-K`` (part K committed, not yet reported to the driver). A test arms a
point in a running worker's process with :func:`arm` (``RayEngineWorker.arm_failpoint``), since a Ray worker's
environment is fixed when its process starts; armed ``once`` with a marker file, a point fires in the first process
of all those armed that reaches it (which of several workers takes a batch is the dispatcher's to decide).
"""

from __future__ import annotations

import os
import signal

ENV = "EVALRUN_FAILPOINT"
_ARMED: dict[str, str | None] = {}  # point -> the marker file that makes it fire once across processes (None: always)


def arm(name: str, once: str | None = None) -> None:
    """Make this process SIGKILL itself when it reaches ``name``; with ``once`` (a file path no process has made),
    only the first process to reach it, of all those armed with the same path."""
    _ARMED[name] = once


def hit(name: str) -> None:
    if os.environ.get(ENV) == name:
        os.kill(os.getpid(), signal.SIGKILL)
    if name not in _ARMED:
        return
    once = _ARMED[name]
    if once is not None:
        try:
            os.close(os.open(once, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        except FileExistsError:
            return  # another process fired it
    os.kill(os.getpid(), signal.SIGKILL)
