"""``sandbox.isolation=none``: no namespaces, for a machine without them, only ever by the user's explicit choice.
The program still runs in a fresh process, in its own directory, with an empty environment and the limits; but it
sees the network and every file the user running evalrun can read and write."""

from __future__ import annotations

import shutil
from collections.abc import Sequence
from pathlib import Path

from evalrun.sandbox import WORKDIR, Limits, isolation


@isolation("none")
class Unisolated:
    name = "none"

    def unavailable(self) -> str | None:
        return None if shutil.which("prlimit") else "prlimit not found (Debian: apt-get install util-linux)"

    def wrap(self, command: Sequence[str], directory: Path, limits: Limits) -> list[str]:
        # the program's path as it is here, not as an isolation would show it
        return [str(directory / Path(c).name) if c.startswith(f"{WORKDIR}/") else c for c in command]
