"""The prepared GPU check (scripts/device_check.sh) dry-runs on CPU, every step of it, so that it cannot rot before a
device is lent: its runs, its nondet reports against the carried CPU baseline, its table and its canaries."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.checkout import CHECKOUT

DECODINGS = ("greedy", "sample")


@pytest.mark.e2e
def test_the_gpu_check_dry_runs_on_cpu_and_writes_its_table(tmp_path: Path) -> None:
    out = tmp_path / "out"
    env = {**os.environ, "OUT": str(out), "PYTHON": sys.executable, "TMPDIR": str(tmp_path)}
    result = subprocess.run(["scripts/device_check.sh", "--dry-run"], cwd=CHECKOUT, env=env, capture_output=True,
                            text=True, timeout=1200)  # fmt: skip
    assert result.returncode == 0, result.stderr[-4000:]
    assert "gpu None" in (out / "device.txt").read_text()

    rows = (out / "table.md").read_text().splitlines()
    header, cells = rows[0], [r.strip("|").split(" | ") for r in rows[2:]]
    assert header.count(" | ") == 9 and all(len(c) == 10 for c in cells)
    labels = [c[0].strip() for c in cells]
    for decoding in DECODINGS:  # every comparison, each decoding: none fell out for want of its runs
        expected = [f"gpu {det} {dtype}, batch 1/8/64, {decoding}" for det in ("strict", "off") for dtype in
                    ("fp32", "bf16")]  # fmt: skip
        expected += [f"gpu strict vs off, fp32 batch 64, {decoding}", f"gpu fp32 vs bf16, strict batch 64, {decoding}",
                     f"gpu vs its machine's cpu, fp32 batch 64, {decoding}",
                     f"gpu vs carried cpu native, fp32 batch 64, {decoding}"]  # fmt: skip
        assert [label for label in labels if label.endswith(decoding)] == expected
    episodes = {int(c[1]) for c in cells}
    assert len(episodes) == 1 and episodes.pop() >= 2  # every report matched all the runs' episodes
    reports = [json.loads(p.read_text()) for p in sorted(out.glob("nondet-*.json"))]
    assert len(reports) == len(cells) and all(r["unmatched_episodes"] == 0 for r in reports)
    # the device's runs in 32-bit and 16-bit floats (one comparison per decoding): the settings nondet lists say so
    dtypes = [[s["values"] for s in r["settings"] if s["field"] == "engine.settings.dtype"] for r in reports]
    assert sorted(d for d in dtypes if d) == [[["float32", "bfloat16"]]] * 2
    for name in ("gpu-strict", "gpu-off", "cpu-strict"):
        assert json.loads((out / f"canary-{name}.json").read_text())["batch_sizes"]
    assert (out / "runs.tar.gz").stat().st_size > 0
