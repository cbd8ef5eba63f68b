"""The batch-invariance canary on the real engine: the shared worker's record, nondet, and `evalrun canary`."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from evalrun.analysis.nondet import nondet_paths
from evalrun.pipeline.canary import BATCH_SIZES

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif("__import__('torch').cuda.is_available()", reason="what the canary finds on this CPU"),
]


def test_the_workers_canary_is_in_the_manifest_and_passes_on_this_cpu(run_eval) -> None:  # type: ignore[no-untyped-def]
    runs = [run_eval("limit=4"), run_eval("limit=4", "cluster.batch_size=1")]
    manifest = json.loads((runs[0] / "manifest.json").read_text())
    canary = manifest["workers"][0]["canary"]
    assert canary["invariant"] is True, canary["first_mismatch"]
    assert canary["max_abs_logprob_diff"] == 0 and canary["batch_sizes"] == list(BATCH_SIZES)
    assert all(c["equal"] for c in canary["checks"]) and len(canary["checks"]) == 8
    # the one batch-dependent kernel it found on this CPU, vLLM's split-KV attention, is off under strict
    assert manifest["determinism"]["honoured"][0]["cpu_attn_split_kv"] is False
    report = nondet_paths(runs)
    assert [(c.run, c.status, c.max_abs_logprob_diff) for c in report.canaries] == [
        (0, "invariant", 0), (1, "invariant", 0)]  # fmt: skip


def test_the_canary_command_on_the_default_engine_passes_with_a_row_per_check(tmp_path: Path) -> None:
    result = subprocess.run([sys.executable, "-m", "evalrun.cli", "canary"], capture_output=True, text=True,
                            timeout=900, cwd=tmp_path)  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    lines = result.stdout.splitlines()
    rows = [line for line in lines if line.startswith(("greedy", "sampled"))]
    assert len(rows) == 8 and all("bitwise equal" in row and row.rstrip().endswith("0.000e+00") for row in rows)
    assert any(line.startswith("engine vllm ") for line in lines)  # vLLM logs to stdout too
    assert lines[-1].startswith("ok: batch-invariant: the needle's tokens and logprobs are bitwise equal")
