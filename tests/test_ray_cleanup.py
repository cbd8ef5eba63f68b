"""A local Ray instance left behind by a SIGKILLed driver is stopped by the next local start."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from evalrun.pipeline.raylocal import MARKER, clean_orphans, orphaned_sessions, processes_using

pytestmark = pytest.mark.e2e  # starts Ray

DRIVER = """
import sys, time
from evalrun.pipeline.raylocal import start_local
start_local(include_dashboard=False, log_to_driver=False, num_cpus=1, _temp_dir=sys.argv[1])
print("started", flush=True)
time.sleep(600)
"""


def test_a_killed_drivers_ray_processes_are_stopped_by_the_next_start(tmp_path: Path) -> None:
    temp = Path("/tmp") / f"evalrun-ray-{os.getpid()}"  # Ray's socket paths must stay short
    env = {**os.environ, "RAY_TMPDIR": str(temp.parent)}
    driver = subprocess.Popen([sys.executable, "-c", DRIVER, str(temp)], stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert driver.stdout is not None and driver.stdout.readline().strip() == "started"
        assert list(temp.glob(f"session_*/{MARKER}")), "the session evalrun started is marked"
        assert orphaned_sessions(temp) == []  # its driver is alive: never touched
        driver.send_signal(signal.SIGKILL)
        driver.wait(timeout=30)
        time.sleep(5)  # the raylet and GCS notice the driver's death and exit; the agents stay
        left = processes_using(temp)
        assert left, "Ray's agents outlive a SIGKILLed driver (what this cleanup is for)"
        stopped = clean_orphans(temp)
        assert set(left) <= set(stopped)
        time.sleep(0.5)
        assert processes_using(temp) == []
        assert orphaned_sessions(temp) == []
    finally:
        if driver.poll() is None:
            driver.kill()
        subprocess.run(["rm", "-rf", str(temp)], check=False)
