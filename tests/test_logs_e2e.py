"""A default run's terminal and its RUN_DIR/logs/, with the real engine (docs/design.md "Logs")."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from evalrun.cli.main import main

pytestmark = pytest.mark.e2e  # starts the engine

# What an engine or Ray log line looks like on a terminal: vLLM's own format, evalrun's stderr format,
# Ray's, a progress bar of the weights' loading.
ENGINE_LINE = re.compile(r"\b(INFO|WARNING|DEBUG)\b|non-default args|safetensors|\[W\d{4} |Started a local Ray")


def test_an_inline_run_prints_results_and_its_directory_only_and_keeps_the_engine_log(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "evalrun.cli", "run", "cluster=inline", "limit=3", f"run.root={tmp_path / 'runs'}"],
        capture_output=True, text=True, timeout=600, cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    lines = result.stdout.strip().splitlines()
    run = Path(lines[-1])  # the last line is the run directory
    assert (run / "record.json").is_file()
    assert not [line for line in lines if ENGINE_LINE.search(line)], result.stdout
    assert lines[0] == f"results: {run}" and lines[-2] == f"report: {run / 'report.html'}"
    # stderr: progress, timings and warnings; no INFO record, no progress bar of the weights' loading
    assert "non-default args" not in result.stderr and "Loading safetensors" not in result.stderr
    assert "episodes" in result.stderr and "timings: " in result.stderr

    record = json.loads((run / "record.json").read_text())
    assert record["logs"] == {"files": ["logs/inline-0.log"], "failed": {}}
    log = (run / "logs" / "inline-0.log").read_text()
    assert re.search(r" INFO \[vllm\.\S+ api_utils\.py:\d+\] non-default args: ", log)
    assert "logs/inline-0.log" not in record["files"]  # provenance: hashed nowhere

    assert main(["verify", str(run)]) == 0
    (run / "logs" / "inline-0.log").write_text("edited")  # not a claim: verify does not hash it
    assert main(["verify", str(run)]) == 0
    (run / "logs" / "notes.txt").write_text("")
    assert main(["verify", str(run)]) == 1


def test_a_ray_run_collects_its_worker_log(run_eval: Callable[..., Path]) -> None:
    run = run_eval("limit=2")
    record = json.loads((run / "record.json").read_text())
    assert "logs/ray-0.log" in record["logs"]["files"] and record["logs"]["failed"] == {}
    log = (run / "logs" / "ray-0.log").read_text()
    # fetched from the actor's process: its log records and what it wrote to its stderr file, in order
    assert "=== stderr ===" in log and re.search(r"INFO \[vllm\.\S+ api_utils\.py:\d+\] non-default args: ", log)
    assert main(["verify", str(run)]) == 0
