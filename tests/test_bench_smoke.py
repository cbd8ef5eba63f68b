"""The benchmarks at a smoke size, so that a change that breaks one fails the suite
(the figures they print are not checked: machines here are noisy). bench_report's smoke test is in
tests/test_report.py."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def test_bench_records_smoke(tmp_path: Path) -> None:
    """Write (three ways, byte-identical), verify and rescore a synthetic run through the real code."""
    done = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "bench_records.py"), "--episodes", "300", "--part-size", "100",
         "--jobs", "2", "--dir", str(tmp_path)],
        capture_output=True, text=True, timeout=600, cwd=ROOT,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert re.search(r"write   : 300 episodes", done.stdout)
    assert re.search(r"verify  : 900 log entries, 300 rows", done.stdout)
    assert re.search(r"rescore : 300 rows", done.stdout)


@pytest.mark.e2e
def test_bench_startup_smoke() -> None:
    """Two whole processes on 4 items: the raw vLLM script (with evalrun's vLLM settings) and `evalrun run
    cluster=inline`, each timed from spawn to exit, and their ratio."""
    done = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "bench_startup.py"), "--rounds", "1", "--no-warmup", "--limit", "4",
         "--modes", "raw-tuned,inline"],
        capture_output=True, text=True, timeout=900, cwd=ROOT,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert re.search(r"round 1 raw-tuned .* raw: 4 prompts, \d+ tokens", done.stdout), done.stdout
    assert re.search(r"round 1 inline .* timings: start-up", done.stdout), done.stdout
    assert re.search(r"^ratio inline/raw-tuned: \d+\.\d{3}$", done.stdout, re.MULTILINE), done.stdout


def test_bench_dispatch_smoke() -> None:
    """(b) the stand-in engine on 1 and 2 Ray workers and (c) the driver's memory at 2,000 episodes, in a
    child process; (a) loads the real engine twice and is left out."""
    done = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "bench_dispatch.py"), "--skip-a", "--seeds", "1", "--workers", "1,2",
         "--scale", "2000"],
        capture_output=True, text=True, timeout=600, cwd=ROOT,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert re.search(r"1 workers: .* parallel efficiency 1\.000, driver CPU .* \(200 episodes;", done.stdout)
    assert re.search(r"2 workers: .* parallel efficiency \d\.\d{3}, driver CPU .* \(200 episodes;", done.stdout)
    assert re.search(r"2,000 episodes: peak RSS +\d+ MiB .* driver CPU +[\d.]+ us/episode", done.stdout)
