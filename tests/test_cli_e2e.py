"""The command as a user runs it: a fresh process, Hydra overrides, -m multirun, stdout contract."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from evalrun.cli import main

pytestmark = pytest.mark.e2e  # starts the engine


def test_multirun_from_the_command_line(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "evalrun.cli", "run", "-m", "limit=12", "seeds.master=1,2", "report=true,false",
         "cluster=inline", f"run.root={tmp_path / 'runs'}"],
        capture_output=True, text=True, timeout=600, cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    lines = result.stdout.strip().splitlines()
    runs = [Path(line) for line in lines[-4:]]  # jobs in order: (1, true), (1, false), (2, true), (2, false)
    assert all((run / "record.json").is_file() for run in runs)
    manifests = [json.loads((run / "manifest.json").read_text()) for run in runs]
    assert [m["seeds"]["master"] for m in manifests] == [1, 1, 2, 2]
    assert manifests[0]["digest"]["seed_set"] != manifests[2]["digest"]["seed_set"]
    assert manifests[0]["digest"]["prompt_pack"] == manifests[2]["digest"]["prompt_pack"]
    # the compile path that reuses vLLM's cache (docs/design.md "Start-up and exit"), recorded as evalrun's choice
    assert manifests[0]["engine"]["compile"]["aot_compile"] is False
    assert "episodes" in result.stderr  # progress was shown
    # report=true writes RUN_DIR/report.html and prints its path before the run directories; report=false
    # does not, and is no part of the run: same identity, digest and root
    assert [line for line in lines if line.startswith("report: ")] == [f"report: {runs[i] / 'report.html'}"
                                                                       for i in (0, 2)]  # fmt: skip
    assert [(run / "report.html").is_file() for run in runs] == [True, False, True, False]
    assert manifests[0]["identity"] == manifests[1]["identity"] and manifests[0]["digest"] == manifests[1]["digest"]
    roots = [json.loads((run / "record.json").read_text())["merkle_root"] for run in runs]
    assert roots[0] == roots[1]
    assert main(["verify", str(runs[0])]) == 0  # verify accepts the report in the run
