"""Named crash points for testing recovery: ``EVALRUN_FAILPOINT=NAME`` makes the driver SIGKILL
itself when it reaches ``NAME`` (no cleanup, no flush: exactly what a power cut or OOM kill does).

Points: ``before-first-part``, ``after-part-K`` (K = 0, 1, ...), ``before-record``; in an engine worker that
writes its own parts, ``worker-after-write-K`` (part K committed, not yet reported to the driver). A test arms a
point in a running worker's process with :func:`arm` (``EngineWorker.arm_failpoint``), since a Ray worker's
environment is fixed when its process starts.
"""

from __future__ import annotations

import os
import signal

ENV = "EVALRUN_FAILPOINT"
_ARMED: set[str] = set()


def arm(name: str) -> None:
    """Make this process SIGKILL itself when it reaches ``name``."""
    _ARMED.add(name)


def hit(name: str) -> None:
    if os.environ.get(ENV) == name or name in _ARMED:
        os.kill(os.getpid(), signal.SIGKILL)
