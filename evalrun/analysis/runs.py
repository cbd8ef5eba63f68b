"""Finished run directories as read by compare, gate and nondet (read only; never an engine).

A run is its manifest plus scores.parquet; observations are ``(item, trial, value)`` triples with
``item = (task, item_id)`` and ``trial = (seed, repeat)``, the shape :mod:`evalrun.stats.estimates` takes.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa

from evalrun.errors import BadInput
from evalrun.records.canonical import canonical_hash
from evalrun.rundir import layout
from evalrun.rundir.reader import open_run, read_manifest, read_outputs, read_scores

Observation = tuple[tuple[str, str], tuple[int, int], float]
OVERALL = "(overall)"


@dataclass(frozen=True)
class Run:
    path: Path
    manifest: dict[str, Any]
    scores: pa.Table

    @property
    def digest(self) -> dict[str, str]:
        return self.manifest["digest"]

    @property
    def master_seed(self) -> int:
        return int(self.manifest["seeds"]["master"])

    @property
    def metrics(self) -> list[str]:
        return sorted(set(self.scores.column("metric").to_pylist()))

    def observations(self) -> dict[tuple[str, str], list[Observation]]:
        """``(task, metric)`` -> observations, plus ``(OVERALL, metric)`` over every task."""
        cols = self.scores.select(["task", "item_id", "seed", "repeat", "metric", "value"]).to_pydict()
        grouped: dict[tuple[str, str], list[Observation]] = defaultdict(list)
        for task, item, seed, repeat, metric, value in zip(*cols.values(), strict=True):
            obs = ((task, item), (seed, repeat), value)
            grouped[(task, metric)].append(obs)
            grouped[(OVERALL, metric)].append(obs)
        return dict(grouped)

    def read_outputs(self, columns: list[str]) -> pa.Table:
        return read_outputs(layout.RunDir(self.path), columns)


def load_run(path: Path) -> Run:
    """A finished run: manifest.json, record.json and scores.parquet must exist (else exit 2)."""
    run = open_run(path)
    for required in (run.manifest, run.record, run.scores):
        if not required.is_file():
            raise BadInput(str(required), "missing: compare, gate and nondet read finished runs only")
    manifest = read_manifest(run)
    if not isinstance(manifest, dict) or "digest" not in manifest or "identity" not in manifest:
        raise BadInput(str(run.manifest), "expected an evalrun manifest with 'digest' and 'identity'")
    return Run(path=path, manifest=manifest, scores=read_scores(run))


def model_hash(manifest: dict[str, Any]) -> str:
    """The model checkpoint hash: sha256 of the canonical JSON of {file name: sha256}."""
    return canonical_hash(manifest["identity"]["model"]["files"])


def digest_record(run: Run) -> dict[str, str]:
    """The six-field record of the release-gate seed."""
    d = run.digest
    return {
        "candidate": run.manifest["identity"]["model"]["id"],
        "model_checkpoint": model_hash(run.manifest),
        "prompt_pack": d["prompt_pack"],
        "seed_set": d["seed_set"],
        "scoring": d["scoring"],
        "digest": d["digest"],
    }


def pick_metric(runs: list[Run], metric: str | None) -> str:
    """``metric`` if every run has it; else the one metric all runs share (exit 2 when ambiguous)."""
    shared = sorted(set.intersection(*(set(r.metrics) for r in runs)))
    if metric is not None:
        if metric not in shared:
            raise BadInput("--metric", f"expected one of the runs' shared metrics {shared}, got {metric!r}")
        return metric
    if len(shared) != 1:
        raise BadInput("--metric", f"expected --metric, one of {shared}")
    return shared[0]
