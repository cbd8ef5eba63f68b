"""Ctrl-C during `evalrun run` on the real engine and local Ray: exit 130 with one line naming the run
and the resume command, no traceback, no Ray process left behind; `evalrun resume` then finishes it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from evalrun.audit.verify import verify_run
from evalrun.pipeline.raylocal import processes_using

pytestmark = pytest.mark.e2e  # starts the engine on a local Ray instance


def test_ctrl_c_exits_130_names_the_resume_command_and_leaves_no_ray_process(tmp_path: Path) -> None:
    run = tmp_path / "run"
    ray_base = Path("/tmp") / f"evalrun-int-{os.getpid()}"  # Ray's socket paths must stay short
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "RAY_TMPDIR": str(ray_base)}
    command = [sys.executable, "-m", "evalrun.cli", "run", f"run.dir={run}", "seeds.repeats=20",
               "cluster.batch_size=32", "run.progress=false"]  # fmt: skip
    # The driver inherits SIGINT ignored, as a background job of a non-interactive shell does (and as
    # this process may, after an earlier test): `evalrun` must still turn Ctrl-C into exit 130.
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        driver = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                                  start_new_session=True)  # fmt: skip
    finally:
        signal.signal(signal.SIGINT, previous)
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and len(list((run / "outputs").glob("part-*.parquet"))) < 2:
            assert driver.poll() is None, driver.communicate()[1][-2000:]
            time.sleep(0.2)
        driver.send_signal(signal.SIGINT)
        _out, err = driver.communicate(timeout=120)
    finally:
        if driver.poll() is None:
            driver.kill()
    assert driver.returncode == 130, err[-2000:]
    assert "Traceback" not in err
    assert "Token authentication" not in err  # Ray's notice of its default stays off the terminal
    assert f"evalrun run: interrupted: the run in {run} is incomplete; `evalrun resume {run}` finishes it" in err
    sessions = [p for p in (ray_base / "ray").glob("session_2*") if p.is_dir()]
    assert sessions and all(processes_using(s) == [] for s in sessions)

    done = subprocess.run([sys.executable, "-m", "evalrun.cli", "resume", str(run), "run.progress=false"],
                          capture_output=True, text=True, env=env, timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == str(run)
    assert verify_run(run).episodes == 200 * 20
    subprocess.run(["rm", "-rf", str(ray_base)], check=False)
