"""The command as a user runs it: a fresh process, Hydra overrides, -m multirun, stdout contract."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e  # starts the engine


def test_multirun_from_the_command_line(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "evalrun.cli", "run", "-m", "limit=12", "seeds.master=1,2", "cluster=inline",
         f"run.root={tmp_path / 'runs'}"],
        capture_output=True, text=True, timeout=600, cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    lines = result.stdout.strip().splitlines()
    runs = [Path(line) for line in lines[-2:]]
    assert all((run / "record.json").is_file() for run in runs)
    manifests = [json.loads((run / "manifest.json").read_text()) for run in runs]
    assert [m["seeds"]["master"] for m in manifests] == [1, 2]
    assert manifests[0]["digest"]["seed_set"] != manifests[1]["digest"]["seed_set"]
    assert manifests[0]["digest"]["prompt_pack"] == manifests[1]["digest"]["prompt_pack"]
    assert "episodes" in result.stderr  # progress was shown
