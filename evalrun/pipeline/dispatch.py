"""Dispatch: hand batches of episodes to engine workers and yield outcomes as they arrive.

A dispatcher is a class registered by name with ``@dispatcher("NAME")``; ``cluster.name`` in the
config selects one (:func:`open_dispatcher`).

``inline``: one worker in this process (debugging, machines without Ray).
``local`` and ``ray``: one Ray actor per worker (a local Ray started here, or the Ray cluster at
``cluster.address``), each owning an engine, with at most
``max_in_flight`` batches queued per worker so a slow worker never holds up the rest. A batch
whose worker dies goes back to the queue and runs on a live or restarted worker; the driver only
ever receives a batch's results once, from the attempt that succeeded. A batch whose code raises
in a live worker is not retried: the run stops with the error (a request the engine refuses
does not raise: the harness records its episode as failed).
"""

from __future__ import annotations

import contextlib
import dataclasses
import pickle
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol, TypeVar

from evalrun.config import ClusterConfig
from evalrun.config.registry import Registry
from evalrun.engines import logs
from evalrun.episodes import PlanSlice
from evalrun.errors import BadInput, first_line
from evalrun.pipeline import cpu_isa
from evalrun.pipeline.raylocal import start_local
from evalrun.pipeline.worker import (
    ACTOR_CONCURRENCY,
    BatchOutcome,
    CollectedLogs,
    EngineWorker,
    RayEngineWorker,
    RunContext,
    WorkerSpec,
)
from evalrun.records.canonical import canonical_hash
from evalrun.rundir.writer import PartSink
from evalrun.scoring.parts import ScoringSetup

LOG_TIMEOUT_S = 30.0  # how long the driver waits for a worker's log at the end of a run
# A call of a Ray worker takes no more batches once it holds this many episodes (eight batches of 256; it may pass it by
# less than a batch): Ray's cost, about a millisecond of the driver's CPU, is per call, and a worker that dies loses
# its call's episodes, however they were batched.
MAX_LEASE_EPISODES = 2048


class Factoring:
    """How many batches each call of a worker takes: factoring (Hummel, Schonberg and Flynn, "Factoring: a method for
    scheduling parallel loops", CACM 1992). Calls go out in rounds of one a slot (a call a live worker may have in
    flight); each call of a round takes ceil(R / 2P) batches, R the batches left when the round began and P the slots.
    Each round takes about half of what is left, so a worker that turns out slower holds at most about half its share,
    and the last rounds take one batch a call, so the workers finish together (docs/design.md "Workers write, the
    driver commits": a round's size set once, not at each call, makes 60 calls where a size set at each call made 104,
    188 batches on 8 workers)."""

    def __init__(self) -> None:
        self._size, self._calls_left = 1, 0

    def next(self, left: int, slots: int) -> int:
        """The batches of the next call: ``left`` batches are left (the call's first among them), ``slots`` calls may
        be in flight at once."""
        if self._calls_left <= 0:
            slots = max(1, slots)  # none live: a replacement is starting
            self._size, self._calls_left = max(1, -(-left // (2 * slots))), slots
        self._calls_left -= 1
        return self._size


@dataclass
class DispatchStats:
    """What happened while dispatching one run's batches (provenance: kept out of every hash)."""

    retries: int = 0  # batches that ran again after their worker failed
    worker_restarts: int = 0
    events: list[dict[str, Any]] = field(default_factory=list)

    def as_record(self) -> dict[str, Any]:
        return asdict(self)


class Dispatcher(Protocol):
    key: str
    stats: DispatchStats

    def workers(self) -> list[dict[str, Any]]: ...

    def map(self, batches: Iterable[PlanSlice], generator: dict[str, Any], scoring: ScoringSetup | None = None,
            sink: PartSink | None = None) -> Iterator[BatchOutcome]:  # fmt: skip
        """Each batch's outcome as it arrives, with its number in ``batches`` (``BatchOutcome.batch``); batches are
        slices of one plan, taken from ``batches`` only as workers can take them. With ``scoring``, workers in
        processes of their own score their parts' rows (``EncodedPart.scored``). With ``sink``
        (run.part_writes=workers), each worker commits its batches' parts there itself and sends a
        ``WrittenPart``."""
        ...

    def logs(self) -> CollectedLogs: ...

    def close(self) -> None: ...


DispatcherFactory = Callable[[WorkerSpec, ClusterConfig], Dispatcher]
D = TypeVar("D", bound=DispatcherFactory)

DISPATCHERS: Registry[DispatcherFactory] = Registry("dispatcher", field="cluster.name")


def dispatcher(name: str) -> Callable[[D], D]:
    """Register a dispatcher class as ``name``: ``cls(worker_spec, cluster)`` opens one."""

    def register(cls: D) -> D:
        DISPATCHERS.add(name, cls)
        return cls

    return register


def dispatcher_key(spec: WorkerSpec, cluster: ClusterConfig) -> str:
    """Runs whose key matches may share a dispatcher: same model, engine, determinism and workers.

    The batch size is left out: it is the driver's choice, and results must not depend on it.
    """
    return canonical_hash({"worker": spec.as_record(), "cluster": cluster.worker_settings()})


class IdleDispatcher:
    """What a resume whose every episode is kept dispatches to: no worker, no engine (nothing is left to run)."""

    def __init__(self, key: str) -> None:
        self.key = key
        self.stats = DispatchStats()

    def workers(self) -> list[dict[str, Any]]:
        return []

    def map(self, batches: Iterable[PlanSlice], generator: dict[str, Any], scoring: ScoringSetup | None = None,
            sink: PartSink | None = None) -> Iterator[BatchOutcome]:  # fmt: skip
        for batch in batches:  # taken to the end: the plan pass counts the kept episodes as it goes
            raise RuntimeError(f"a batch of {len(batch)} episodes to run, but every episode was kept")
        yield from ()

    def logs(self) -> CollectedLogs:
        return CollectedLogs({}, {})

    def close(self) -> None:
        pass


@dispatcher("inline")
class InlineDispatcher:
    def __init__(self, spec: WorkerSpec, cluster: ClusterConfig) -> None:
        self.key = dispatcher_key(spec, cluster)
        self.stats = DispatchStats()
        self.worker = EngineWorker(spec, "inline-0")

    def workers(self) -> list[dict[str, Any]]:
        return [self.worker.info()]

    def map(self, batches: Iterable[PlanSlice], generator: dict[str, Any], scoring: ScoringSetup | None = None,
            sink: PartSink | None = None) -> Iterator[BatchOutcome]:  # fmt: skip
        """The parts carry their rows unscored (``EncodedPart.rows``): in this process, the driver's part
        writer scores them in its own thread, alongside the engine, at no cost of decoding. The worker is the
        driver's process, so the driver writes its parts (no ``sink``)."""
        if sink is not None:
            raise ValueError("cluster=inline runs its worker in the driver's process: the driver writes the parts")
        self.stats = DispatchStats()
        for number, outcome in enumerate(self.worker.run_batches((list(batch) for batch in batches), generator)):
            yield dataclasses.replace(outcome, batch=number)

    def logs(self) -> CollectedLogs:
        """The worker's log: the records of this process, the driver's own among them."""
        return CollectedLogs({"inline-0": self.worker.log_text()}, {})

    def close(self) -> None:
        self.worker.close()


@dataclass
class _Slot:
    """One worker position: its current actor, and whether that actor is serving."""

    index: int
    actor: Any
    live: bool = False
    load: int = 0
    info: dict[str, Any] | None = None
    holds: str = ""  # the key of the run context the actor was sent


@dispatcher("local")
@dispatcher("ray")
class RayDispatcher:
    def __init__(self, spec: WorkerSpec, cluster: ClusterConfig, *, wait: bool = True) -> None:
        import ray

        self._driver_log = logs.route()  # Ray's driver-side records (Ray installed its handler on import)
        self.key = dispatcher_key(spec, cluster)
        self.stats = DispatchStats()
        self._spec = spec
        self._started_ray = connect_ray(cluster)
        gpus = cluster.gpus_per_worker
        if gpus is None:
            gpus = spec.engine.tensor_parallel_size if ray.cluster_resources().get("GPU", 0) > 0 else 0
        self._actor_class = ray.remote(RayEngineWorker)
        self._max_in_flight = cluster.max_in_flight
        self._actor_options: dict[str, Any] = {"num_cpus": cluster.cpus_per_worker, "num_gpus": gpus,
                                               "max_concurrency": self._max_in_flight + ACTOR_CONCURRENCY}  # fmt: skip
        self._max_restarts = cluster.max_worker_restarts
        self._max_attempts = cluster.max_batch_attempts
        self._start_timeout = cluster.worker_start_timeout_s
        self._restarts_total = 0
        self._starting: dict[Any, _Slot] = {}
        self._slots = [_Slot(i, self._new_actor(i)) for i in range(cluster.num_workers)]
        self._first_infos: dict[Any, _Slot] | None = {slot.actor.info.remote(): slot for slot in self._slots}
        if wait:
            self.ready()

    def ready(self) -> None:
        """Wait until every worker has started (its engine loaded); with ``wait=False`` the workers start in
        their own processes meanwhile, and the first call of :meth:`workers` or :meth:`map` waits."""
        import ray

        refs, self._first_infos = self._first_infos, None
        if refs is None:
            return
        try:
            infos = ray.get(list(refs), timeout=self._start_timeout)
        except ray.exceptions.GetTimeoutError:
            self.close()
            raise RuntimeError(
                f"{len(refs)} engine workers did not start within {self._start_timeout}s "
                f"(cluster resources: {ray.cluster_resources()})"
            ) from None
        for slot, info in zip(refs.values(), infos, strict=True):
            slot.info, slot.live = info, True

    def _new_actor(self, index: int) -> Any:
        """Worker ``index``'s actor; one of a capped instruction set (engine.cpu_isa) in a process started with its
        variables, which its libraries read once, on load (evalrun.pipeline.cpu_isa)."""
        level = cpu_isa.for_worker(self._spec.engine.cpu_isa_levels(), index)
        options = dict(self._actor_options)
        if level != cpu_isa.NATIVE:
            options["runtime_env"] = {"env_vars": cpu_isa.environment(level)}
        spec = dataclasses.replace(self._spec, cpu_isa=level)
        return self._actor_class.options(**options).remote(spec, f"ray-{index}")

    def workers(self) -> list[dict[str, Any]]:
        self.ready()
        return [slot.info for slot in self._slots if slot.info is not None]

    def actors(self) -> list[Any]:
        """The live actors, in worker order (for tests and operators that need to reach one)."""
        return [slot.actor for slot in self._slots if slot.live]

    def map(self, batches: Iterable[PlanSlice], generator: dict[str, Any], scoring: ScoringSetup | None = None,
            sink: PartSink | None = None) -> Iterator[BatchOutcome]:  # fmt: skip
        import ray

        self.ready()
        packed_scoring = _packed_scoring(scoring)
        self.stats = stats = DispatchStats()
        source = enumerate(batches)  # taken as workers can take batches: the driver holds those in flight
        pending: deque[tuple[int, PlanSlice]] = deque()  # batches to run again
        attempts: dict[int, int] = {}  # batch number -> attempts, while it is in flight or pending
        unsent = True  # batches may be left in source
        in_flight: dict[Any, tuple[_Slot, Any, list[tuple[int, PlanSlice]]]] = {}  # ref -> slot, actor, batches
        starting = self._starting  # info() refs of replacement actors, kept across runs
        self._restarts_total = 0  # the restart budget is per run
        # The run's context (its plan among it) in Ray's object store, put when the first batch is taken: each worker
        # fetches it with its first call of the run, and a batch crosses to a worker as its number and bounds.
        plan: Sequence[Any] | None = None
        context: list[Any] = []  # [the context's object ref]: in a list, Ray passes the ref, not the object
        context_key = ""

        factoring = Factoring()
        frontier = 0  # where in the plan the batches taken from the source have reached

        def take() -> tuple[int, PlanSlice] | None:
            nonlocal unsent, plan, context_key, frontier
            if pending:
                return pending.popleft()
            taken = next(source, None) if unsent else None
            unsent = taken is not None
            if taken is not None:
                frontier = taken[1].stop
            if taken is not None and plan is None:
                plan = taken[1].plan
                context.append(ray.put(RunContext(plan, generator, packed_scoring, sink)))
                context_key = context[0].hex()
            if taken is not None and taken[1].plan is not plan:
                raise ValueError("the batches of one dispatch are slices of one plan")
            return taken

        def lease() -> list[tuple[int, PlanSlice]]:
            """The batches of a worker's next call: one, or several while many are left (Ray's cost is per call)."""
            first = take()
            if first is None:
                return []
            batches, episodes = [first], len(first[1])
            left = 1 + len(pending) + (len(first[1].plan) - frontier) // max(1, len(first[1]))
            size = factoring.next(left, sum(slot.live for slot in self._slots) * self._max_in_flight)
            while len(batches) < size and episodes < MAX_LEASE_EPISODES and (taken := take()) is not None:
                batches.append(taken)
                episodes += len(taken[1])
            return batches

        def fill(slot: _Slot) -> None:
            while slot.live and slot.load < self._max_in_flight and (batches := lease()):
                for number, _ in batches:
                    attempts[number] = attempts.get(number, 0) + 1
                bounds = [(number, batch.start, batch.stop) for number, batch in batches]
                ref = slot.actor.run_slices.remote(context_key, bounds, context if slot.holds != context_key else None)
                slot.holds = context_key
                in_flight[ref] = (slot, slot.actor, batches)
                slot.load += 1

        def replace(slot: _Slot, actor: Any, error: BaseException) -> None:
            """Retire a failed actor; start a replacement if the restart budget allows."""
            if slot.actor is not actor or not slot.live:
                return  # already retired: its other in-flight batches fail the same way
            slot.live = False
            ray.kill(slot.actor, no_restart=True)
            stats.events.append({"worker": (slot.info or {}).get("worker"), "error": type(error).__name__})
            if self._restarts_total < self._max_restarts:
                self._restarts_total += 1
                stats.worker_restarts += 1
                slot.actor, slot.info, slot.load, slot.holds = self._new_actor(slot.index), None, 0, ""
                starting[slot.actor.info.remote()] = slot

        for slot in self._slots:
            fill(slot)
        waiting_since = time.monotonic()
        while in_flight or pending or unsent:
            refs = list(in_flight) + list(starting)
            if not refs:
                raise RuntimeError("no engine worker is left to run the remaining batches (restart budget spent)")
            ready, _ = ray.wait(refs, num_returns=1, timeout=10.0)
            if not ready:
                if not in_flight and time.monotonic() - waiting_since > self._start_timeout:
                    raise RuntimeError(f"no replacement worker started within {self._start_timeout}s")
                continue
            waiting_since = time.monotonic()
            ref = ready[0]
            if ref in starting:
                slot = starting.pop(ref)
                try:
                    slot.info, slot.live = ray.get(ref), True
                except ray.exceptions.RayError as exc:
                    slot.live = True  # so that replace() retires it and counts the restart
                    replace(slot, slot.actor, exc)
                fill(slot)
                continue
            slot, actor, batches = in_flight.pop(ref)
            if slot.actor is actor:
                slot.load -= 1
            try:
                outcomes = ray.get(ref)
            except ray.exceptions.RayError as exc:
                call = f"a call of {len(batches)} batches ({sum(len(batch) for _, batch in batches)} episodes)"
                if _raised_by_the_batch(exc):
                    # The batch's code raised in a live worker: running it again would raise again.
                    if isinstance(exc.cause, BadInput):  # a worker's commit of its part failed: named, one line
                        raise exc.cause from None
                    worker = (slot.info or {}).get("worker")
                    raise RuntimeError(f"{call} failed on {worker}: {exc.cause!r}") from exc
                if max(attempts[number] for number, _ in batches) >= self._max_attempts:
                    raise RuntimeError(f"{call} failed: a batch of it has failed {self._max_attempts} times") from exc
                stats.retries += len(batches)
                pending.extendleft(reversed(batches))
                replace(slot, actor, exc)
                for other in self._slots:
                    fill(other)
                continue
            for number, _ in batches:
                del attempts[number]
            fill(slot)
            yield from outcomes

    def logs(self, timeout_s: float = LOG_TIMEOUT_S) -> CollectedLogs:
        """Each live worker's log (fetched from its process, wherever it runs), and the driver's own records
        when there are any; a worker that does not answer within ``timeout_s`` is named in ``failed``."""
        import ray

        driver = self._driver_log.text()
        texts, failed = ({"driver": driver} if driver else {}), {}
        refs = {slot.actor.log_text.remote(): f"ray-{slot.index}" for slot in self._slots if slot.live}
        ready = ray.wait(list(refs), num_returns=len(refs), timeout=timeout_s)[0] if refs else []
        for ref, name in refs.items():
            if ref not in ready:
                failed[name] = f"no answer within {timeout_s:g} s"
                continue
            try:
                texts[name] = ray.get(ref)
            except ray.exceptions.RayError as exc:
                failed[name] = first_line(exc)
        return CollectedLogs(texts, failed)

    def close(self) -> None:
        import ray

        self._first_infos = None
        with contextlib.suppress(Exception):  # a worker that is gone has nothing to let go of
            ray.get([slot.actor.close.remote() for slot in self._slots], timeout=60)
        for slot in self._slots:
            ray.kill(slot.actor, no_restart=True)
        self._slots, self._starting = [], {}
        if self._started_ray:
            ray.shutdown()


def connect_ray(cluster: ClusterConfig) -> bool:
    """Connect this driver to Ray for ``cluster`` unless it is connected: start a local instance (``local``)
    or join ``cluster.address`` (``ray``). True when it connected now (the dispatcher then shuts Ray down)."""
    import ray

    if ray.is_initialized():
        return False
    if cluster.name == "ray":
        ray.init(address=cluster.address, log_to_driver=False)
    else:
        start_local(include_dashboard=False, log_to_driver=False)  # stops what killed drivers left
    return True


def _packed_scoring(scoring: ScoringSetup | None) -> bytes | None:
    """The setup as the workers get it, pickled once a run; None when there is none or it does not pickle
    (a context holding what pickle cannot take): the driver then scores every part itself."""
    if scoring is None:
        return None
    try:
        return pickle.dumps(scoring, protocol=pickle.HIGHEST_PROTOCOL)
    except (pickle.PicklingError, TypeError, AttributeError):
        return None


def _raised_by_the_batch(error: BaseException) -> bool:
    """The batch raised an exception in a worker that is still alive (a ``RayTaskError`` that is not an
    actor's death): not a worker failure, so not retried as one. A request the engine refuses never
    gets here: the harness records its episode as failed (docs/design.md "Failed episodes")."""
    import ray

    return isinstance(error, ray.exceptions.RayTaskError) and not isinstance(error, ray.exceptions.RayActorError)


def open_dispatcher(spec: WorkerSpec, cluster: ClusterConfig) -> Dispatcher:
    return DISPATCHERS.get(cluster.name)(spec, cluster)


def start_early(spec: WorkerSpec, cluster: ClusterConfig) -> Dispatcher | None:
    """A dispatcher whose workers start now, in their own processes, while the driver checks pins, reads the
    dataset and plans (docs/design.md "Start-up and exit"): Ray's (its first use waits for the workers, and
    closing it stops them at once). None for ``inline``: its engine loads in the driver's interpreter, where
    nothing would overlap it, and only once every input is checked."""
    if cluster.name in ("local", "ray"):
        return RayDispatcher(spec, cluster, wait=False)
    return None
