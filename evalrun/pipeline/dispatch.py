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
from evalrun.engines import EngineDown, logs
from evalrun.episodes import PlanSlice
from evalrun.errors import BadInput, CheckFailed, first_line
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
RAY_LOGS = "Ray's session folder, /tmp/ray/session_latest/logs/ on each node"  # where a Ray worker's own log is


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


class WorkersNotPlaced(BadInput):
    """The cluster did not place enough workers within cluster.start_timeout_s (exit 2): what each asks, what the
    cluster has, and the settings that change either."""


class _Startup:
    """The first start of a Ray dispatcher's workers: each placed by Ray (its actor's process up, with what it asks),
    then its engine started."""

    def __init__(self, placing: dict[Any, _Slot]) -> None:
        self.placing = placing  # the placed() ref of each worker not yet placed
        self.began = time.monotonic()  # placement counts from the workers' creation (dispatch.start_early)

    def wait(self, to_start: int, placement_timeout: float, start_timeout: float,
             placement_error: Callable[[int], BadInput]) -> None:  # fmt: skip
        """Until ``to_start`` workers have started; the others go on starting."""
        import ray

        loading: dict[Any, tuple[_Slot, float]] = {}  # info() ref -> slot, when it was placed
        placed = live = 0
        while live < to_start:
            deadlines = [at + start_timeout for _, at in loading.values()]
            if placed < to_start:
                deadlines.append(self.began + placement_timeout)
            ready, _ = ray.wait([*self.placing, *loading], num_returns=1,
                                timeout=max(0.0, min(deadlines) - time.monotonic()))  # fmt: skip
            if not ready:
                now = time.monotonic()
                if placed < to_start and now >= self.began + placement_timeout:
                    raise placement_error(placed)
                late = sorted(slot.index for slot, at in loading.values() if now >= at + start_timeout)
                if late:
                    raise BadInput("cluster.worker_start_timeout_s",
                                   f"the engine of worker{'s' if len(late) > 1 else ''} "
                                   f"{', '.join(f'ray-{i}' for i in late)} did not start within {start_timeout:g} s "
                                   f"of its placement (its log: {RAY_LOGS})")  # fmt: skip
                continue
            ref = ready[0]
            if ref in self.placing:
                slot = self.placing.pop(ref)
                _started(ray, ref, slot)
                placed += 1
                loading[slot.actor.info.remote()] = (slot, time.monotonic())
                continue
            slot, _ = loading.pop(ref)
            slot.info, slot.live = _started(ray, ref, slot), True
            live += 1


def _started(ray: Any, ref: Any, slot: _Slot) -> Any:
    """The answer of a starting worker's call: its engine's error as it was raised in the worker (an
    EngineStartFailed, or evalrun's own: a served model's server that does not answer), or one line for a worker
    whose process died."""
    try:
        return ray.get(ref)
    except ray.exceptions.RayActorError as exc:
        said = [line.strip() for line in str(exc).splitlines() if line.strip()] or [type(exc).__name__]
        raise BadInput(f"ray-{slot.index}", f"the worker died while it started: {said[-1]} (its log: {RAY_LOGS})"
                       ) from None  # (Ray's text ends with the cause)  # fmt: skip
    except ray.exceptions.RayTaskError as exc:
        raise _cause(exc) from None


def _cause(error: Any) -> BaseException:
    """The exception a Ray task raised in its worker, as it was raised there (evalrun's errors cross intact:
    errors.KeepsFields), carrying the worker's traceback as ``remote_traceback`` (``evalrun --debug`` prints it)."""
    cause = getattr(error, "cause", None)
    if not isinstance(cause, BaseException):
        return error
    if getattr(cause, "remote_traceback", None) is None:
        with contextlib.suppress(AttributeError, TypeError):  # an exception type without a __dict__
            cause.remote_traceback = str(error)
    return cause


def _amount(value: float) -> str:
    return f"{value:g}"


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
        if cluster.resources_per_worker:
            self._actor_options["resources"] = dict(cluster.resources_per_worker)
        self._max_restarts = cluster.max_worker_restarts
        self._max_attempts = cluster.max_batch_attempts
        self._start_timeout = cluster.worker_start_timeout_s
        self._placement_timeout = cluster.placement_timeout_s
        self._to_start = cluster.workers_to_start
        self._restarts_total = 0
        self._starting: dict[Any, _Slot] = {}
        self._slots = [_Slot(i, self._new_actor(i)) for i in range(cluster.num_workers)]
        self._startup: _Startup | None = _Startup({slot.actor.placed.remote(): slot for slot in self._slots})
        if wait:
            self.ready()

    def ready(self) -> None:
        """Wait until ``cluster.min_workers`` workers (all, by default) have started (their engines loaded); with
        ``wait=False`` the workers start in their own processes meanwhile, and the first call of :meth:`workers` or
        :meth:`map` waits. The others join the run as they start (:meth:`map` takes them in). A cluster that has not
        placed enough workers within ``cluster.start_timeout_s`` (pending, or infeasible: no node has what one
        asks) is a :class:`WorkersNotPlaced`; a worker whose engine does not start ends the start with its error
        (an :class:`~evalrun.pipeline.worker.EngineStartFailed` naming the worker, the model and the cause)."""
        startup, self._startup = self._startup, None
        if startup is None:
            return
        try:
            startup.wait(self._to_start, self._placement_timeout, self._start_timeout, self._placement_error)
        except BaseException:
            self.close()
            raise
        for slot in self._slots:  # the rest join as they start
            if not slot.live:
                self._starting[slot.actor.info.remote()] = slot

    def _placement_error(self, placed: int) -> WorkersNotPlaced:
        """What the cluster could not place: what each worker asks, what the cluster has, what to change."""
        import ray

        asks = {"CPU": self._actor_options["num_cpus"], "GPU": self._actor_options["num_gpus"],
                **self._actor_options.get("resources", {})}  # fmt: skip
        asks = {name: amount for name, amount in asks.items() if amount}
        total, free = ray.cluster_resources(), ray.available_resources()
        nodes = [node.get("Resources", {}) for node in ray.nodes() if node.get("Alive")]
        fits = sum(min(int(node.get(k, 0) // v) for k, v in asks.items()) if asks else 1 for node in nodes)
        missing = [name for name in asks if not any(node.get(name, 0) >= asks[name] for node in nodes)]
        have = ", ".join(f"{k}={_amount(total.get(k, 0))} ({_amount(free.get(k, 0))} free)" for k in asks)
        asked = ", ".join(f"{k}={_amount(v)}" for k, v in asks.items()) or "nothing"
        nodes_text = f"{len(nodes)} node{'s' if len(nodes) != 1 else ''}"
        placed_text = (f"{placed} of {len(self._slots)} workers placed within cluster.start_timeout_s="
                       f"{self._placement_timeout:g} s, {self._to_start} needed (cluster.min_workers)")  # fmt: skip
        if missing:
            setting = {"CPU": "cluster.cpus_per_worker", "GPU": "cluster.gpus_per_worker"}.get(
                missing[0], f"cluster.resources_per_worker.{missing[0]}"
            )
            return WorkersNotPlaced(
                setting,
                f"no node of the cluster has {' and '.join(f'{k}={_amount(asks[k])}' for k in missing)} "
                f"({placed_text}): each worker asks {asked}; the cluster has {have} on {nodes_text}",
            )
        return WorkersNotPlaced(
            "cluster.num_workers",
            f"{placed_text}: each worker asks {asked}, the cluster has {have} on {nodes_text}, room for {fits} such "
            f"worker{'s' if fits != 1 else ''}; ask for fewer (cluster.num_workers, cluster.cpus_per_worker, "
            f"cluster.gpus_per_worker), or start with those that fit (cluster.min_workers={max(1, fits)})",
        )

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
        start_failed: BaseException | None = None  # the error of a late worker's engine that did not start
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
                if start_failed is not None:
                    raise start_failed
                spent = f"cluster.max_worker_restarts={self._max_restarts} replacements spent"
                raise EngineDown(f"no engine worker is left to run the remaining batches ({spent}; logs: {RAY_LOGS})")
            ready, _ = ray.wait(refs, num_returns=1, timeout=10.0)
            if not ready:
                if not in_flight and time.monotonic() - waiting_since > self._start_timeout:
                    raise EngineDown(f"no live worker, and no replacement started within cluster."
                                     f"worker_start_timeout_s={self._start_timeout:g}")  # fmt: skip
                continue
            waiting_since = time.monotonic()
            ref = ready[0]
            if ref in starting:
                slot = starting.pop(ref)
                try:
                    slot.info, slot.live = ray.get(ref), True
                except ray.exceptions.RayError as exc:
                    if _raised_by_the_batch(exc):  # its engine did not start: starting it again would fail again
                        start_failed = _cause(exc)
                        ray.kill(slot.actor, no_restart=True)
                        stats.events.append({"worker": f"ray-{slot.index}", "error": type(start_failed).__name__})
                        continue
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
                    cause = _cause(exc)
                    if isinstance(cause, (BadInput, CheckFailed, EngineDown)):  # evalrun's own: as it was raised
                        raise cause from None
                    worker = (slot.info or {}).get("worker")
                    stopped = EngineDown(f"{call} raised on {worker}: {first_line(cause)} (`evalrun --debug` prints "
                                         f"the worker's traceback)")  # fmt: skip
                    stopped.remote_traceback = str(exc)  # type: ignore[attr-defined]
                    raise stopped from exc
                if max(attempts[number] for number, _ in batches) >= self._max_attempts:
                    raise EngineDown(f"{call} failed: a batch of it was lost with its worker {self._max_attempts} "
                                     f"times (cluster.max_batch_attempts): {first_line(exc)}") from exc  # fmt: skip
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

        self._startup = None
        with contextlib.suppress(Exception):  # a worker that is gone has nothing to let go of
            ray.get([slot.actor.close.remote() for slot in self._slots if slot.live], timeout=60)
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
