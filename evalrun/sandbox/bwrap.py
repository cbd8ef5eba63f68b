"""``sandbox.isolation=bwrap``: each program in bubblewrap's new user, network, PID, IPC, UTS and cgroup namespaces,
the system's ``/usr`` (and the interpreter's installation) read-only, a size-bounded tmpfs as its directory and
``/tmp``, an empty environment, every capability dropped, and killed with its whole PID namespace when it is
stopped. Run by root, evalrun runs programs as ``nobody`` (the kernel does not hold root to a process limit)."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path

from evalrun.sandbox import ENVIRONMENT, WORKDIR, Limits, isolation

NOBODY = 65534


@isolation("bwrap")
class Bubblewrap:
    name = "bwrap"

    def unavailable(self) -> str | None:
        tools = [t for t in ("bwrap", "prlimit") + (("setpriv",) if os.geteuid() == 0 else ()) if not shutil.which(t)]
        if tools:
            return f"{', '.join(tools)} not found (Debian: apt-get install bubblewrap util-linux)"
        try:
            probe = subprocess.run([*self._prefix(), "--unshare-all", "--ro-bind", "/", "/", "true"],
                                   capture_output=True, text=True, timeout=30)  # fmt: skip
        except (OSError, subprocess.TimeoutExpired) as error:
            return f"bwrap did not start ({error})"
        if probe.returncode != 0:
            return f"bwrap cannot make namespaces ({probe.stderr.strip()[-200:]}; are user namespaces enabled?)"
        return None

    def wrap(self, command: Sequence[str], directory: Path, limits: Limits) -> list[str]:
        argv = [*self._prefix(), "--unshare-all", "--die-with-parent", "--new-session", "--cap-drop", "ALL",
                "--ro-bind", "/usr", "/usr"]  # fmt: skip
        for top in ("bin", "sbin", "lib", "lib32", "lib64"):  # Debian's merged /usr: links; else the directories
            path = Path("/") / top
            if path.is_symlink():
                argv += ["--symlink", os.readlink(path), str(path)]
            elif path.is_dir():
                argv += ["--ro-bind", str(path), str(path)]
        installed = Path(command[command.index("--") + 1]).resolve().parents[1]  # the interpreter's prefix
        if not installed.is_relative_to("/usr"):
            argv += ["--ro-bind", str(installed), str(installed)]
        size = str(limits.file_bytes)
        argv += ["--proc", "/proc", "--dev", "/dev", "--size", size, "--tmpfs", "/tmp", "--size", size, "--tmpfs",
                 WORKDIR, "--ro-bind", str(directory / "program.py"), f"{WORKDIR}/program.py", "--chdir", WORKDIR,
                 "--clearenv"]  # fmt: skip
        for key, value in ENVIRONMENT.items():
            argv += ["--setenv", key, value]
        return [*argv, "--", *command]

    @staticmethod
    def _prefix() -> list[str]:
        if os.geteuid() != 0:
            return ["bwrap"]
        return ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", "bwrap"]
