"""A two-node Ray cluster on this machine, its workers writing their parts into one shared directory, loses a node
mid-run; nothing is lost, and the run verifies."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from evalrun.audit.verify import verify_run
from evalrun.rundir.layout import RunDir
from evalrun.rundir.reader import read_outputs

pytestmark = pytest.mark.e2e  # starts the engine

HELPER = Path(__file__).parent / "helpers" / "multinode.py"
CONFIG = ("limit=40", "cluster.batch_size=2")


def test_losing_a_node_mid_run_completes_with_the_same_root(run_eval, tmp_path: Path) -> None:
    expected = json.loads((run_eval(*CONFIG) / "record.json").read_text())["merkle_root"]
    result = subprocess.run(
        [sys.executable, str(HELPER), str(tmp_path), *CONFIG], capture_output=True, text=True, timeout=900
    )
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    record = report["record"]
    assert len(report["workers"]) == 2
    assert record["episodes"] == {"planned": 40, "written": 40}
    assert record["merkle_root"] == expected
    assert record["dispatch"]["retries"] >= 1
    assert report["part_writes"] == "workers"  # each node's worker committed its parts into the shared directory
    run = Path(report["run"])
    assert len(read_outputs(RunDir(run), ["episode_id"])) == 40
    assert verify_run(run).episodes == 40  # every part a worker wrote is the one the record lists
