"""Faults found inside a Ray worker or the cluster, on the default dispatcher: one line and the right exit code, never
a traceback, never a silent wait (docs/design.md "Exit codes"). The real engine and real Ray: the CLI in this process
on the session's Ray (workers asking no CPU, so they are placed whatever else holds the session's CPUs), or in a
process of its own that starts a local Ray of this machine's CPUs, where what fits is known."""

from __future__ import annotations

import json
import os
import pickle
import shutil
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import ray
from helpers.errors import ERRORS

from evalrun.cli.main import _failure, main
from evalrun.config import load
from evalrun.errors import BadInput, CheckFailed
from evalrun.pipeline.dispatch import RayDispatcher, WorkersNotPlaced, _cause
from evalrun.pipeline.runner import execute, prepare
from evalrun.pipeline.worker import WorkerSpec
from evalrun.rundir import layout

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[1]
NO_CPU = "cluster.cpus_per_worker=0"  # placed on the session's Ray whatever the other fixtures' workers hold
CPUS = os.cpu_count() or 1


@ray.remote(num_cpus=0)
def _raise(pickled: bytes) -> None:
    raise pickle.loads(pickled)


def test_every_error_raised_in_a_ray_worker_reaches_the_driver_as_it_was_raised(ray_session: None) -> None:
    for error, fields in ERRORS:
        if isinstance(error, KeyboardInterrupt):  # Ray takes one raised in a task for the task's cancellation
            continue
        with pytest.raises(ray.exceptions.RayTaskError) as raised:
            ray.get(_raise.remote(pickle.dumps(error)))
        found = _cause(raised.value)
        assert type(found) is type(error) and str(found) == str(error)
        assert all(getattr(found, name) == getattr(error, name) for name in fields if name != "remote_traceback")
        # the worker's traceback, kept for evalrun --debug (an engine's own, where the error carried it already)
        assert found.remote_traceback == getattr(error, "remote_traceback", None) or (
            "ray::_raise()" in found.remote_traceback
        )


def _lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.strip()]


def test_an_unreachable_base_url_on_ray_is_one_line_and_exit_2(ray_session, tmp_path, capsys) -> None:
    code = main(["run", "engine=openai", "engine.base_url=http://127.0.0.1:1/v1", "limit=2", NO_CPU,
                 f"run.root={tmp_path}", "run.progress=false"])  # fmt: skip
    err = _lines(capsys.readouterr().err)
    assert code == 2 and len(err) == 1, err
    assert err[0].startswith("evalrun run: error: engine.base_url: http://127.0.0.1:1/v1: no server answers"), err
    assert not list(tmp_path.iterdir())  # nothing written


def test_a_model_whose_weights_do_not_load_is_named_in_one_line(ray_session, tmp_path, capsys) -> None:
    model = Path(shutil.copytree(ROOT / "evalrun" / "models" / "tiny-adder", tmp_path / "model"))
    weights = model / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])  # a partial copy
    runs = tmp_path / "runs"
    code = main(["run", f"model.path={model}", "model.pinned=false", "limit=2", NO_CPU, f"run.root={runs}",
                 "run.progress=false"])  # fmt: skip
    err = _lines(capsys.readouterr().err)
    assert code == 2 and len(err) <= 3, err
    line = err[-1]
    assert line.startswith(f"evalrun run: error: {model}: the vllm engine did not start on worker ray-0@"), line
    assert "SafetensorError" in line and "weights do not load" in line
    log = Path(line.rsplit("(traceback: ", 1)[1].rstrip(")"))
    assert "Traceback (most recent call last)" in log.read_text() and "SafetensorError" in log.read_text()
    assert not runs.exists() or not any(runs.iterdir())  # nothing that could pass for a result


def test_a_resource_no_node_has_is_named_within_the_start_timeout(ray_session) -> None:
    cfg = load(["limit=1", NO_CPU, "+cluster.resources_per_worker.no_such_accelerator=1", "cluster.start_timeout_s=3"])
    started = time.monotonic()
    with pytest.raises(WorkersNotPlaced) as raised:
        RayDispatcher(prepare(cfg).worker_spec, cfg.cluster)
    assert time.monotonic() - started < 30
    assert raised.value.where == "cluster.resources_per_worker.no_such_accelerator"
    assert "no node of the cluster has no_such_accelerator=1" in raised.value.message
    assert "0 of 1 workers placed within cluster.start_timeout_s=3 s" in raised.value.message


def test_a_run_whose_every_episode_failed_exits_1_and_verifies(tmp_path, capsys) -> None:
    """(inline, where the engine starts fastest: what decides the exit code is the same on every dispatcher)"""
    code = main(["run", "engine.max_model_len=8", "limit=3", "cluster=inline", f"run.root={tmp_path}",
                 "run.progress=false", "report=false"])  # fmt: skip
    out, err = capsys.readouterr()
    assert code == 1, err
    assert "all 3 episodes failed, none was scored" in err
    run = Path(out.strip().splitlines()[-1])
    assert main(["verify", str(run)]) == 0  # sealed and valid: it measured nothing, and says so


def _evalrun(cwd: Path, *args: str) -> tuple[subprocess.CompletedProcess[str], float]:
    """``evalrun ARGS`` in a process of its own (its own local Ray, of this machine's CPUs) and how long it took."""
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "evalrun.cli", *args], capture_output=True, text=True, timeout=600,
                          cwd=cwd)  # fmt: skip
    return done, time.monotonic() - started


# Two workers each asking for every CPU of this machine: one fits
TOO_MANY = ("cluster.num_workers=2", f"cluster.cpus_per_worker={CPUS}", "limit=8", "cluster.batch_size=2",
            "run.progress=false", "report=false")  # fmt: skip


def test_more_workers_than_the_cluster_places_end_within_the_start_timeout(tmp_path: Path) -> None:
    done, took = _evalrun(tmp_path, "run", *TOO_MANY, "cluster.start_timeout_s=10")
    err = _lines(done.stderr)
    assert done.returncode == 2 and len(err) == 1, done.stderr[-3000:]
    assert err[0].startswith("evalrun run: error: cluster.num_workers: 1 of 2 workers placed within "
                             "cluster.start_timeout_s=10 s, 2 needed (cluster.min_workers)"), err  # fmt: skip
    assert f"each worker asks CPU={CPUS}, the cluster has CPU={CPUS}" in err[0] and "room for 1 such worker;" in err[0]
    assert took < 120, took  # Ray's start, the timeout, and the stop: not a silent wait
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())


def test_with_min_workers_the_run_goes_on_the_workers_that_fit_with_the_same_root(run_eval, tmp_path: Path) -> None:
    reference = json.loads((run_eval("limit=8") / layout.RECORD).read_text())["merkle_root"]
    done, _ = _evalrun(tmp_path, "run", *TOO_MANY, "cluster.min_workers=1", "cluster.start_timeout_s=10")
    assert done.returncode == 0, done.stderr[-3000:]
    run = tmp_path / done.stdout.strip().splitlines()[-1]
    record = json.loads((run / layout.RECORD).read_text())
    assert record["merkle_root"] == reference
    workers = json.loads((run / layout.MANIFEST).read_text())["workers"]
    assert len(workers) == 1  # the second never fit: the run did not wait for it
    assert main(["verify", str(run)]) == 0


class RaisingEngine:
    """Stands in for an engine that raises while it runs a batch (the one thing this double isolates): ``error``."""

    def __init__(self, error: BaseException) -> None:
        self.error = error

    def generate(self, requests: list[Any]) -> list[Any]:
        raise self.error

    def describe(self) -> dict[str, Any]:
        return {"name": "raising", "version": "1", "settings": {}}


def raising_bad_input(spec: WorkerSpec) -> RaisingEngine:
    return RaisingEngine(BadInput("engine.served_model", "the server no longer serves 'm'"))


def raising_a_bug(spec: WorkerSpec) -> RaisingEngine:
    return RaisingEngine(ZeroDivisionError("division by zero"))


@pytest.mark.parametrize("factory", [raising_bad_input, raising_a_bug])
def test_an_error_raised_during_a_batch_in_a_ray_worker_is_one_line(ray_session, tmp_path, factory) -> None:
    """evalrun's own error raised mid-batch reaches the driver as it was raised; any other stops the run resumably
    (exit 1), naming the worker and the error, the worker's traceback kept for ``evalrun --debug``."""
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the stand-in crosses to Ray's worker by value
    cfg = load([f"run.root={tmp_path}", "limit=2", NO_CPU, "run.progress=false", "determinism.canary=false"])
    plain = prepare(cfg)
    prepared = replace(plain, worker_spec=replace(plain.worker_spec, engine_factory=factory))
    workers = RayDispatcher(prepared.worker_spec, cfg.cluster)
    try:
        with pytest.raises((BadInput, CheckFailed)) as raised:
            execute(prepared, workers)
    finally:
        workers.close()
    code = _failure("evalrun run", raised.value)
    assert "\n" not in code.message
    if factory is raising_bad_input:
        assert type(raised.value) is BadInput and code.exit_code == 2
        assert (raised.value.where, raised.value.message) == ("engine.served_model", "the server no longer serves 'm'")
    else:
        assert code.exit_code == 1 and "raised on ray-0@" in code.message, code.message
        assert "ZeroDivisionError: division by zero" in code.message and "evalrun resume" in code.message
        remote = raised.value.remote_traceback  # the worker's frames, down to the engine's
        assert "in generate\n    raise self.error\nZeroDivisionError: division by zero" in remote, remote
