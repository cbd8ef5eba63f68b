"""Named crash points for testing recovery: ``EVALRUN_FAILPOINT=NAME`` makes the driver SIGKILL
itself when it reaches ``NAME`` (no cleanup, no flush: exactly what a power cut or OOM kill does).

Points: ``before-first-part``, ``after-part-K`` (K = 0, 1, ...), ``before-record``.
"""

from __future__ import annotations

import os
import signal

ENV = "EVALRUN_FAILPOINT"


def hit(name: str) -> None:
    if os.environ.get(ENV) == name:
        os.kill(os.getpid(), signal.SIGKILL)
