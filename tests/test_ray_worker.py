"""A Ray worker (``RayEngineWorker``) keeps its engine on the one thread that built it and commits each batch's part
on the Ray call's own thread, so that a slow commit (fsyncs on a shared file system, PUTs to an object store) overlaps
the worker's next batch (docs/design.md "Workers write, the driver commits"). Engine-free: the worker is called from
threads as Ray's thread pool calls an actor of ``max_concurrency`` > 1; a sink whose commit waits is the one thing
held still."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest

from evalrun.config import load
from evalrun.engines import Completion, GenerationRequest
from evalrun.pipeline import runner
from evalrun.pipeline.worker import RayEngineWorker, RunContext, WorkerSpec
from evalrun.rundir.writer import PartFiles, PartSink

GENERATOR = {"name": "evalrun", "version": "t", "git_commit": None}


class ThreadNoting:
    """Answers every request " 0" and notes the thread it was built on and each thread it generated on."""

    def __init__(self) -> None:
        self.built_on = threading.get_ident()
        self.generated_on: list[int] = []

    def generate(self, requests: list[GenerationRequest]) -> list[Completion]:
        self.generated_on.append(threading.get_ident())
        return [Completion(" 0", (1,), (-0.5,), "stop", 4) for _ in requests]

    def describe(self) -> dict[str, Any]:
        return {"name": "thread-noting", "version": "1", "settings": {}}


def thread_noting(spec: WorkerSpec) -> ThreadNoting:
    return ThreadNoting()


@dataclass(frozen=True)
class HeldSink(PartSink):
    """A sink whose commit of batch 0 waits until ``release`` is set (a slow store), noting each commit's thread."""

    release: threading.Event
    committed: list[tuple[int, int]]  # (batch, thread), appended to

    def write(self, number: int, log: bytes, table: bytes) -> PartFiles:
        if number == 0:
            assert self.release.wait(30), "batch 0's commit was never released"
        self.committed.append((number, threading.get_ident()))
        return PartFiles((f"log/{number}", "0" * 64, len(log)), (f"outputs/{number}", "0" * 64, len(table)))


@pytest.fixture
def worker_and_plan() -> tuple[RayEngineWorker, Any]:
    prepared = runner.prepare(load(["limit=4", "cluster=inline", "run.progress=false"]))
    worker = RayEngineWorker(replace(prepared.worker_spec, engine_factory=thread_noting), "ray-0")
    return worker, prepared.episodes


def batch(number: int) -> tuple[int, int, int]:
    """Batch ``number``: episodes 0 and 1 of the plan, or 2 and 3, in turn."""
    return number, 2 * (number % 2), 2 * (number % 2) + 2


def test_the_engine_runs_every_batch_on_the_thread_that_built_it(worker_and_plan: Any) -> None:
    worker, plan = worker_and_plan
    run = RunContext(plan, GENERATOR)
    with ThreadPoolExecutor(4) as calls:  # as Ray's pool calls an actor of max_concurrency 4
        leases = list(calls.map(lambda n: worker.run_batches(run, [batch(n)]), range(5)))
    leases.append(worker.run_batches(run, [batch(5)]))
    outcomes = [outcome for lease in leases for outcome in lease]
    engine = worker._worker.engine
    assert engine.built_on != threading.main_thread().ident
    assert engine.generated_on == [engine.built_on] * 6
    assert sorted(o.batch for o in outcomes) == list(range(6))
    worker.close()


def test_a_part_s_commit_overlaps_the_next_batch(worker_and_plan: Any, tmp_path: Path) -> None:
    worker, plan = worker_and_plan
    sink = HeldSink(str(tmp_path), 0, threading.Event(), [])
    run = RunContext(plan, GENERATOR, sink=sink)
    engine = worker._worker.engine
    with ThreadPoolExecutor(2) as calls:
        first = calls.submit(worker.run_batches, run, [batch(0)])
        while not engine.generated_on:  # batch 0 generated; its commit now waits on the sink
            assert not first.done()
            threading.Event().wait(0.01)
        second = calls.submit(worker.run_batches, run, [batch(1)])
        assert second.result(timeout=30)[0].batch == 1  # generated and committed while batch 0's commit waits
        assert not first.done() and [number for number, _ in sink.committed] == [1]
        sink.release.set()
        [written] = first.result(timeout=30)
    assert written.part.files.log[0] == "log/0" and [number for number, _ in sink.committed] == [1, 0]
    assert all(thread != engine.built_on for _, thread in sink.committed)  # never on the engine's thread
    worker.close()


def test_a_lease_of_batches_answers_each_in_order_and_commits_each(worker_and_plan: Any, tmp_path: Path) -> None:
    worker, plan = worker_and_plan
    sink = HeldSink(str(tmp_path), 0, threading.Event(), [])
    sink.release.set()
    outcomes = worker.run_batches(RunContext(plan, GENERATOR, sink=sink), [batch(4), batch(5), batch(6)])
    assert [o.batch for o in outcomes] == [4, 5, 6] and [n for n, _ in sink.committed] == [4, 5, 6]
    assert [o.part.files.log[0] for o in outcomes] == ["log/4", "log/5", "log/6"]
    assert [o.part.heads.ids for o in outcomes] == [plan.episode_digests(0, 2), plan.episode_digests(2, 4),
                                                    plan.episode_digests(0, 2)]  # fmt: skip
    worker.close()
