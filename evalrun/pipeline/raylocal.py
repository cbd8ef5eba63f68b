"""The local Ray instance evalrun starts (``cluster=local``), and what a killed driver leaves of one.

``ray.shutdown()`` stops every process of a local instance when the driver exits normally, on an
error or on Ctrl-C. A driver killed outright (SIGKILL, OOM) cannot: Ray's raylet and GCS notice and
exit, but two agents the raylet started (``ray::DashboardAgent``, ``ray::RuntimeEnvAgent``) are
reparented to init and stay. So evalrun marks each local session it starts with its driver's pid,
and the next local start stops the processes of every marked session whose driver is gone.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import time
from pathlib import Path
from typing import Any

MARKER = "evalrun-driver.json"


def mark_session(session_dir: Path) -> None:
    """Record that this process, an evalrun driver, owns the local Ray session in ``session_dir``."""
    with contextlib.suppress(OSError):
        (session_dir / MARKER).write_text(json.dumps({"pid": os.getpid()}), encoding="utf-8")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def processes_using(session_dir: Path) -> list[int]:
    """Pids of the processes that hold a file of ``session_dir`` open (their logs, sockets)."""
    prefix = str(session_dir)
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        with contextlib.suppress(OSError):
            if any(os.readlink(fd).startswith(prefix) for fd in (entry / "fd").iterdir()):
                found.append(int(entry.name))
    return found


def orphaned_sessions(ray_temp: Path) -> list[Path]:
    """Sessions evalrun started whose driver is no longer running."""
    orphans = []
    for marker in sorted(ray_temp.glob(f"session_*/{MARKER}")):
        try:
            pid = int(json.loads(marker.read_text(encoding="utf-8"))["pid"])
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if not _alive(pid):
            orphans.append(marker.parent)
    return orphans


def clean_orphans(ray_temp: Path, grace_s: float = 2.0) -> list[int]:
    """Stop every process left by a killed evalrun driver's local Ray session; returns their pids."""
    stopped: list[int] = []
    for session in orphaned_sessions(ray_temp):
        pids = processes_using(session)
        for pid in pids:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        while any(_alive(p) for p in pids) and time.monotonic() < deadline:
            time.sleep(0.05)
        for pid in pids:
            if _alive(pid):
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(OSError):
            (session / MARKER).unlink()
        stopped.extend(pids)
    return stopped


def default_temp_dir() -> Path:
    """Where a local Ray instance keeps its sessions (Ray's default, or ``RAY_TMPDIR``)."""
    return Path(os.environ.get("RAY_TMPDIR", "/tmp")) / "ray"


AUTH_NOTICE_LOGGER = "ray._private.authentication.authentication_token_setup"


def start_local(**init_kwargs: Any) -> None:
    """``ray.init`` for a local instance: first stop what killed drivers left, then mark the new session."""
    import ray  # heavy: only a Ray dispatcher needs it

    clean_orphans(default_temp_dir())
    # Ray turns token authentication on for a new local instance and warns on the terminal each time that it did
    # (RAY_AUTH_MODE unset): its default, not a problem of the run, so that notice is kept off the terminal
    notice = logging.getLogger(AUTH_NOTICE_LOGGER)
    level = notice.level
    notice.setLevel(logging.ERROR)
    try:
        ray.init(**init_kwargs)
    finally:
        notice.setLevel(level)
    node = ray._private.worker._global_node  # the session this driver started (Ray has no public accessor)
    if node is not None:
        mark_session(Path(node.get_session_dir_path()))
