"""Dispatch: hand batches of episodes to engine workers and yield outcomes as they arrive.

``InlineDispatcher`` runs one worker in this process (debugging, machines without Ray).
``RayDispatcher`` runs one Ray actor per worker, each owning an engine, with at most
``max_in_flight`` batches queued per worker so a slow worker never holds up the rest.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Protocol

from evalrun.digest import canonical_hash
from evalrun.plan import Episode
from evalrun.worker import BatchOutcome, EngineWorker, WorkerSpec


class Dispatcher(Protocol):
    key: str

    def workers(self) -> list[dict[str, Any]]: ...

    def map(self, batches: list[list[Episode]], generator: dict[str, Any]) -> Iterator[BatchOutcome]: ...

    def close(self) -> None: ...


def dispatcher_key(spec: WorkerSpec, cluster: dict[str, Any]) -> str:
    """Runs whose key matches may share a dispatcher: same model, engine, determinism and workers.

    The batch size is left out: it is the driver's choice, and results must not depend on it.
    """
    from dataclasses import asdict

    workers = {k: v for k, v in cluster.items() if k != "batch_size"}
    return canonical_hash({"worker": asdict(spec), "cluster": workers})


class InlineDispatcher:
    def __init__(self, spec: WorkerSpec, cluster: dict[str, Any]) -> None:
        self.key = dispatcher_key(spec, cluster)
        self.worker = EngineWorker(spec, "inline-0")

    def workers(self) -> list[dict[str, Any]]:
        return [self.worker.info()]

    def map(self, batches: list[list[Episode]], generator: dict[str, Any]) -> Iterator[BatchOutcome]:
        for batch in batches:
            yield self.worker.run(batch, generator)

    def close(self) -> None:
        pass


class RayDispatcher:
    def __init__(self, spec: WorkerSpec, cluster: dict[str, Any]) -> None:
        import ray

        self.key = dispatcher_key(spec, cluster)
        self._started_ray = False
        if not ray.is_initialized():
            if cluster["name"] == "ray":
                ray.init(address=cluster["address"], log_to_driver=False)
            else:
                ray.init(include_dashboard=False, log_to_driver=False)
            self._started_ray = True
        gpus = cluster["gpus_per_worker"]
        if gpus is None:
            gpus = spec.engine["tensor_parallel_size"] if ray.cluster_resources().get("GPU", 0) > 0 else 0
        actor = ray.remote(EngineWorker).options(num_cpus=cluster["cpus_per_worker"], num_gpus=gpus)
        self._actors = [actor.remote(spec, f"ray-{i}") for i in range(cluster["num_workers"])]
        self._max_in_flight = cluster["max_in_flight"]
        self._infos = ray.get([a.info.remote() for a in self._actors])

    def workers(self) -> list[dict[str, Any]]:
        return list(self._infos)

    def map(self, batches: list[list[Episode]], generator: dict[str, Any]) -> Iterator[BatchOutcome]:
        import ray

        pending = list(reversed(batches))
        in_flight: dict[Any, int] = {}  # object ref -> actor index
        load = [0] * len(self._actors)

        def submit(index: int) -> None:
            ref = self._actors[index].run.remote(pending.pop(), generator)
            in_flight[ref] = index
            load[index] += 1

        for index in range(len(self._actors)):
            while pending and load[index] < self._max_in_flight:
                submit(index)
        while in_flight:
            (done,), _ = ray.wait(list(in_flight), num_returns=1)
            index = in_flight.pop(done)
            load[index] -= 1
            outcome = ray.get(done)
            if pending:
                submit(index)
            yield outcome

    def close(self) -> None:
        import ray

        for a in self._actors:
            ray.kill(a)
        self._actors = []
        if self._started_ray:
            ray.shutdown()


def open_dispatcher(spec: WorkerSpec, cluster: dict[str, Any]) -> Dispatcher:
    if cluster["name"] == "inline":
        return InlineDispatcher(spec, cluster)
    return RayDispatcher(spec, cluster)
