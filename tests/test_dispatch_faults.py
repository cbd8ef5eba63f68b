"""Ray dispatch on the real engine: placement independence and workers dying mid-run."""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import ray

from evalrun.config import load
from evalrun.pipeline import dispatch
from evalrun.pipeline.dispatch import Dispatcher, RayDispatcher
from evalrun.pipeline.runner import execute, prepare
from evalrun.rundir.layout import RunDir
from evalrun.rundir.reader import read_outputs

pytestmark = pytest.mark.e2e  # starts the engine

CONFIG = ("limit=40", "decoding=sample", "seeds.repeats=2")  # 80 episodes, sampled


def record(run: Path) -> dict[str, Any]:
    return json.loads((run / "record.json").read_text())


class KillAfterFirstOutcome:
    """The real dispatcher, with one of its real workers killed once the first batch is back."""

    def __init__(self, inner: RayDispatcher, kill: Callable[[RayDispatcher], None]) -> None:
        self.inner, self.kill = inner, kill
        self.key = inner.key

    @property
    def stats(self):
        return self.inner.stats

    def workers(self) -> list[dict[str, Any]]:
        return self.inner.workers()

    def map(self, batches, generator, scoring=None, sink=None) -> Iterator[Any]:
        for number, outcome in enumerate(self.inner.map(batches, generator, scoring, sink)):
            if number == 0:
                self.kill(self.inner)
            yield outcome

    def close(self) -> None:
        self.inner.close()


@pytest.fixture
def reference_root(run_eval) -> str:
    """The undisturbed run, on the one-worker engine with the default batch size."""
    return record(run_eval(*CONFIG))["merkle_root"]


def run_on(dispatcher: Dispatcher, tmp_path: Path, *overrides: str) -> Path:
    cfg = load([f"run.root={tmp_path}", "run.progress=false", "cluster.num_workers=2", *CONFIG, *overrides])
    return execute(prepare(cfg), dispatcher)


class CountingTaken(KillAfterFirstOutcome):
    """The real dispatcher; notes how many batches it had taken from the run each time one came back."""

    def __init__(self, inner: RayDispatcher) -> None:
        super().__init__(inner, lambda d: None)
        self.taken_at_outcome: list[int] = []

    def map(self, batches, generator, scoring=None, sink=None) -> Iterator[Any]:
        taken = 0

        def counted() -> Iterator[Any]:
            nonlocal taken
            for batch in batches:
                taken += 1
                yield batch

        for outcome in self.inner.map(counted(), generator, scoring, sink):
            self.taken_at_outcome.append(taken)
            yield outcome


def test_two_workers_and_any_batch_size_give_the_same_root(two_workers, reference_root, tmp_path) -> None:
    counting = CountingTaken(two_workers)
    run = run_on(counting, tmp_path, "cluster.batch_size=3")
    assert record(run)["merkle_root"] == reference_root
    workers = set(read_outputs(RunDir(run), ["worker"]).column("worker").to_pylist())
    assert len(workers) == 2  # both workers served batches
    # batches are taken as workers can take them: never more than 2 workers x max_in_flight calls ahead, each of at
    # most a lease of batches (a call's outcomes are handed on after its worker took its next lease), and a lease is
    # at most half an equal share of the batches among the calls in flight (factoring's first round)
    in_flight = 2 * load([]).cluster.max_in_flight
    assert len(counting.taken_at_outcome) == 27  # 80 episodes in batches of 3
    ahead = [taken - done for done, taken in enumerate(counting.taken_at_outcome, start=1)]
    lease = -(-27 // (2 * in_flight))
    assert all(n <= in_flight * lease + lease - 1 for n in ahead)


def test_a_call_takes_several_batches_while_many_are_left(two_workers, reference_root, tmp_path) -> None:
    counting = CountingTaken(two_workers)
    run = run_on(counting, tmp_path, "cluster.batch_size=1")  # 80 batches of 1 episode: leases of 80 / 8 at first
    assert record(run)["merkle_root"] == reference_root
    in_flight = 2 * load([]).cluster.max_in_flight
    ahead = [taken - done for done, taken in enumerate(counting.taken_at_outcome, start=1)]
    lease = -(-80 // (2 * in_flight))  # the share: 80 episodes are far below the cap in episodes (MAX_LEASE_EPISODES)
    assert in_flight < max(ahead) <= in_flight * lease + lease - 1  # the first calls took several each


def test_a_call_takes_no_more_episodes_than_the_cap(two_workers, reference_root, tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(dispatch, "MAX_LEASE_EPISODES", 3)  # the share would be 10 batches of 1 episode at first
    counting = CountingTaken(two_workers)
    run = run_on(counting, tmp_path, "cluster.batch_size=1")
    assert record(run)["merkle_root"] == reference_root
    in_flight = 2 * load([]).cluster.max_in_flight
    ahead = [taken - done for done, taken in enumerate(counting.taken_at_outcome, start=1)]
    assert in_flight < max(ahead) <= in_flight * 3 + 3 - 1


def _ray_kill(d: RayDispatcher) -> None:
    ray.kill(d.actors()[0], no_restart=True)


def _sigkill(d: RayDispatcher) -> None:
    os.kill(d.workers()[0]["pid"], signal.SIGKILL)


@pytest.mark.parametrize("kill", [_ray_kill, _sigkill], ids=["ray.kill", "SIGKILL"])
def test_a_worker_dying_mid_run_loses_nothing(two_workers, reference_root, tmp_path, kill) -> None:
    run = run_on(KillAfterFirstOutcome(two_workers, kill), tmp_path, "cluster.batch_size=2")
    rec = record(run)
    assert rec["dispatch"]["retries"] >= 1 and rec["dispatch"]["worker_restarts"] == 1
    assert rec["merkle_root"] == reference_root
    ids = read_outputs(RunDir(run), ["episode_id"]).column("episode_id").to_pylist()
    assert len(ids) == len(set(ids)) == 80  # nothing lost, nothing written twice
