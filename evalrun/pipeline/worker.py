"""An engine worker: one engine, the determinism layer applied first, episodes in, results out.

The same class runs inline in the driver or, wrapped in :class:`RayEngineWorker`, as a Ray actor; it writes files only
when a dispatch hands it a sink for its parts (run.part_writes=workers).
"""

from __future__ import annotations

import itertools
import logging
import os
import pickle
import re
import socket
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pyarrow as pa

from evalrun.config import DeterminismConfig, EngineConfig
from evalrun.engines import ClosingEngine, ServedEngine, ServedReport, build_engine, logs
from evalrun.episodes import (
    EncodedPart,
    Engines,
    EpisodeKind,
    Planned,
    Provenance,
    WrittenPart,
    kind_of_episodes,
)
from evalrun.errors import BadInput, CheckFailed
from evalrun.pipeline import cpu_isa, determinism, failpoints
from evalrun.pipeline.canary import CanaryResult, canary_at_start
from evalrun.pipeline.environment import hardware_fingerprint, library_versions, python_version
from evalrun.records.canonical import canonical_json
from evalrun.records.heads import PackedHeads
from evalrun.rundir.writer import PartSink
from evalrun.scoring.parts import PartScorer, ScoredPart, ScoringSetup


@dataclass(frozen=True)
class WorkerSpec:
    """Everything a worker needs to build its engine; plain data, so it can cross to a Ray actor.

    ``engine_factory`` replaces the configured engine (benchmarks of the dispatcher use a
    fixed-latency stand-in); it must be picklable.
    """

    model_path: str
    model_dtype: str
    engine: EngineConfig
    determinism: DeterminismConfig
    engine_factory: Callable[[WorkerSpec], Any] | None = None
    # a second engine for a rubric's judges: of the judges' model (same engine settings), or of judge_engine's
    # settings (the run's model where no judge model is given), or both
    judge_model_path: str | None = None
    judge_model_dtype: str | None = None
    judge_engine: EngineConfig | None = None
    # torch's intra-op (OpenMP) threads in the worker's process, set before its engine is built: the CPUs a
    # worker is given (cluster.cpus_per_worker), in the driver's process as in a Ray actor of that many CPUs
    # (Ray sets OMP_NUM_THREADS to them). None: torch's default, one per core, whose spinning threads slowed
    # an inline engine 10x on a machine whose cores other processes share (docs/nondeterminism.md "What it costs").
    threads: int | None = None
    # the instruction set this worker's kernels may use (one of engine.cpu_isa's levels, chosen per worker by the
    # dispatcher, which starts the worker's process with its variables; evalrun.pipeline.cpu_isa)
    cpu_isa: str = cpu_isa.NATIVE
    # a second engine for a model playing a world's simulated user: of the user model (same engine settings), or of
    # user_engine's settings (the run's model where no user model is given), or both
    user_model_path: str | None = None
    user_model_dtype: str | None = None
    user_engine: EngineConfig | None = None

    def as_record(self) -> dict[str, Any]:
        factory = self.engine_factory
        return {
            "model_path": self.model_path,
            "model_dtype": self.model_dtype,
            "engine": self.engine.as_record(),
            "determinism": self.determinism.as_record(),
            "engine_factory": None if factory is None else f"{factory.__module__}.{factory.__qualname__}",
            "judge_model_path": self.judge_model_path,
            "judge_model_dtype": self.judge_model_dtype,
            **({"judge_engine": self.judge_engine.as_record()} if self.judge_engine is not None else {}),
            "threads": self.threads,
            **({"cpu_isa": self.cpu_isa} if self.cpu_isa != cpu_isa.NATIVE else {}),
            **({"user_model_path": self.user_model_path, "user_model_dtype": self.user_model_dtype}
               if self.user_model_path is not None else {}),
            **({"user_engine": self.user_engine.as_record()} if self.user_engine is not None else {}),
        }  # fmt: skip


@dataclass(frozen=True)
class BatchOutcome:
    part: EncodedPart | WrittenPart  # the part's bytes, or (run.part_writes=workers) what its worker committed
    episodes: int
    worker: str
    # what the worker's served engines met while it ran the batch (their servers' answers, faults, retries; the
    # driver checks the answers for drift): provenance, never hashed. None: no engine of the worker is served
    served: ServedReport | None = None
    # the batch's number in its dispatch (the order the plan made it in), which names its part: part numbers do
    # not depend on which worker answered first. None: a dispatcher that does not say (parts in arrival order)
    batch: int | None = None

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickled (a Ray actor's result on its way to the driver), the log part travels zstd-compressed and
        is restored byte for byte on arrival: a batch of 64 single-call episodes' result shrinks from about
        105 KB to 45 KB, under Ray's 100 KiB limit for returning a result inline, so it does not go through
        the object store (raylet and driver CPU; docs/design.md "Data flow"). Inline, nothing is pickled."""
        part = self.part
        if isinstance(part, WrittenPart):  # about 64 bytes an episode and the scored rows: as it is
            return (BatchOutcome, (part, self.episodes, self.worker, self.served, self.batch))
        log = _LOG_CODEC.compress(part.log, asbytes=True)
        fields = (log, len(part.log), part.table, part.heads, part.output_tokens, part.scored, self.episodes,
                  self.worker, self.served, self.batch)  # fmt: skip
        return (_unpickle_outcome, fields)


_LOG_CODEC = pa.Codec("zstd", compression_level=1)


def _unpickle_outcome(log: bytes, log_size: int, table: bytes, heads: PackedHeads, output_tokens: int,
                      scored: ScoredPart | None, episodes: int, worker: str,
                      served: ServedReport | None = None, batch: int | None = None) -> BatchOutcome:  # fmt: skip
    log = _LOG_CODEC.decompress(log, decompressed_size=log_size, asbytes=True)
    return BatchOutcome(EncodedPart(log, table, heads, output_tokens, scored), episodes, worker, served, batch)


@dataclass(frozen=True)
class Generated:
    """A batch run on a worker's engines, its results not yet encoded: what :meth:`EngineWorker.generate` hands to
    :meth:`EngineWorker.encode` (in a Ray worker, from its engine's thread to its encoding thread)."""

    kind: EpisodeKind
    results: list[Any]
    provenance: Provenance
    served: ServedReport | None  # what the served engines met while the batch ran (BatchOutcome.served)


@dataclass(frozen=True)
class CollectedLogs:
    """A dispatcher's logs at the end of a run: text by log name (a worker's, as ``inline-0`` or ``ray-1``, or
    ``driver``), and why each one that could not be fetched was not."""

    texts: dict[str, str]
    failed: dict[str, str]


class EngineWorker:
    def __init__(self, spec: WorkerSpec, name: str) -> None:
        self.name = f"{name}@{socket.gethostname()}:{os.getpid()}"
        # A Ray actor's stderr is a log file of its own (Ray's worker-*.err): every record goes there, in
        # order with what C++ code prints; inline, the driver's choice (-v or not) stands.
        self._own_process = _in_ray_actor()
        self._log = logs.route(stderr_is_a_log=self._own_process)
        try:  # before torch's first kernel: a capped level is chosen once per process
            cpu_isa.apply(spec.cpu_isa)
        except RuntimeError as exc:  # this worker's processor lacks the level (a Ray node other than the driver's)
            raise BadInput("engine.cpu_isa", f"{exc} (worker {self.name})") from exc
        settings = spec.determinism.as_record()
        # a vLLM server the engine starts (engine.serve) inherits this process's environment: the determinism
        # settings made for vLLM (VLLM_CPU_ATTN_SPLIT_KV, VLLM_BATCH_INVARIANT) reach it; torch's flags stay here
        acts_on = "vllm" if spec.engine.serve else spec.engine.name
        self.determinism = determinism.apply(settings, seed=spec.engine.seed, engine=acts_on)
        if spec.engine.serve and spec.determinism.enabled:
            self.determinism["notes"].append(
                "the vLLM server evalrun started inherits the determinism environment (VLLM_CPU_ATTN_SPLIT_KV, "
                "VLLM_BATCH_INVARIANT); torch's deterministic algorithms and seeds are set in this process only"
            )
        self.determinism["honoured"]["torch_threads"] = _set_threads(spec.threads)  # kernels split work by threads
        started = time.perf_counter()
        self.engine = _build_engine(spec, self.name)
        self.engine_load_s = round(time.perf_counter() - started, 3)  # provenance: the engine's own start
        # read once the engine is built: the kernel library it loaded is part of the hardware it ran on
        uses_vllm = spec.engine_factory is None and spec.engine.name == "vllm" and not spec.engine.serve
        self.hardware = canonical_json({**hardware_fingerprint(), "isa": cpu_isa.in_effect(spec.cpu_isa, uses_vllm)})
        # before the judge engine and any episode: the canary is about this engine as the run finds it
        self.canary, not_run = canary_at_start(self.engine, spec.determinism.canary, spec.engine_factory is not None)
        if not_run is not None:
            self.determinism["notes"].append(not_run)
        self._scorers: dict[bytes, PartScorer | None] = {}  # by pickled ScoringSetup
        self.judge_engine = self.engine
        if spec.judge_model_path is not None or spec.judge_engine is not None:
            self.judge_engine = _build_engine(judge_spec(spec), self.name, "judges")
        self.user_engine = self.engine
        if spec.user_model_path is not None or spec.user_engine is not None:
            self.user_engine = _build_engine(user_spec(spec), self.name, "simulated user")
        self.engines = Engines(self.engine, self.judge_engine, user=self.user_engine)

    def info(self) -> dict[str, Any]:
        return {
            "worker": self.name,
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "hardware": self.hardware,
            "libraries": library_versions(),
            "python": python_version(),
            "determinism": self.determinism,
            "engine": self.engine.describe(),
            "judge_engine": self.judge_engine.describe() if self.judge_engine is not self.engine else None,
            **({"user_engine": self.user_engine.describe()} if self.user_engine is not self.engine else {}),
            "canary": None if self.canary is None else self.canary.as_record(),  # None: not run (see notes)
            "engine_load_s": self.engine_load_s,
            # within engine_load_s: vLLM's profiling, KV cache and warm-up (compiling), as it reports them
            **({"warmup_s": warmup} if (warmup := getattr(self.engine, "warmup_s", None)) is not None else {}),
        }

    def close(self) -> None:
        """Let go of what the engines hold outside this process (a server one started)."""
        for engine in self._engines():
            if isinstance(engine, ClosingEngine):
                engine.close()

    def _engines(self) -> list[Any]:
        """This worker's engines, each once (the judges' and the user's may be the run's)."""
        return list({id(e): e for e in (self.engine, self.judge_engine, self.user_engine)}.values())

    def log_text(self) -> str:
        """This worker's log so far (RUN_DIR/logs/<worker>.log; docs/design.md "Logs"): in a Ray actor, what
        its process wrote to stdout and stderr (C++ and print output included); else, or when those are
        not files, the log records of its process."""
        text = logs.stdio_files_text() if self._own_process else None
        return self._log.text() if text is None else text

    def generate(self, episodes: list[Planned], generator: dict[str, Any]) -> Generated:
        """A batch run on the engines, its results not yet encoded (:meth:`encode` makes its part)."""
        started = time.perf_counter()
        kind = kind_of_episodes(episodes)
        results = kind.run(self.engines, episodes, generator)
        provenance = Provenance(self.name, self.hardware, len(results), time.perf_counter() - started)
        return Generated(kind, results, provenance, self._served())

    def encode(self, generated: Generated, scorer: PartScorer | None = None) -> BatchOutcome:
        """A generated batch's outcome: its part encoded, its rows scored by ``scorer`` when given, else left for the
        driver to score (what follows the engines, and needs none)."""
        part = generated.kind.encode(generated.results, generated.provenance, scorer)
        return BatchOutcome(part, len(generated.results), self.name, generated.served)

    def _served(self) -> ServedReport | None:
        """What the served engines met since the last batch (None: no engine of this worker is served)."""
        served = [e for e in self._engines() if isinstance(e, ServedEngine)]
        return sum((e.take_report() for e in served), ServedReport()) if served else None

    def part_scorer(self, scoring: bytes | None) -> PartScorer | None:
        """The scorer of a pickled setup, built on its first batch. None when this process cannot build it
        (a scorer registered only in the driver's process, say): the driver then scores the parts."""
        if scoring is None:
            return None
        if scoring not in self._scorers:
            try:
                setup = pickle.loads(scoring)
                self._scorers[scoring] = PartScorer(setup) if isinstance(setup, ScoringSetup) else None
            except Exception as exc:  # whatever keeps this process from scoring: the driver scores instead
                _LOG.warning("the driver scores this worker's parts: %s", exc)
                self._scorers[scoring] = None
        return self._scorers[scoring]

    def run_batches(self, batches: Iterable[list[Planned]], generator: dict[str, Any]) -> Iterator[BatchOutcome]:
        """:meth:`generate` and :meth:`encode` over each batch, in order, with the same parts, through the kind's
        ``run_batches`` (a dataset's keeps a queueing engine busy between batches). A part's ``latency_s`` is then
        the time from the previous part's hand-over to its own results."""
        source = iter(batches)
        first = next(source, None)
        if first is None:
            return
        kind = kind_of_episodes(first)
        started = time.perf_counter()
        for results in kind.run_batches(self.engines, itertools.chain([first], source), generator):
            provenance = Provenance(self.name, self.hardware, len(results), time.perf_counter() - started)
            yield BatchOutcome(kind.encode(results, provenance), len(results), self.name, self._served())
            started = time.perf_counter()


@dataclass(frozen=True)
class RunContext:
    """What every batch of one dispatch shares, sent to each Ray worker once (through Ray's object store) rather than
    with each batch: the plan whose slices the batches are, the generator record, the pickled scoring setup (None:
    the driver scores the parts) and, with run.part_writes=workers, the sink the worker commits its parts to."""

    plan: Sequence[Planned]
    generator: dict[str, Any]
    scoring: bytes | None = None
    sink: PartSink | None = None


class RayEngineWorker:
    """An :class:`EngineWorker` as a Ray actor of ``max_concurrency`` >= 2 (:data:`ACTOR_CONCURRENCY` more than the
    batches the dispatcher keeps in flight for it): a batch goes through three stages, each on threads of its own,
    so that the engine never waits for what follows it.

    1. The engine lives on one thread: the worker is built there (its engine, its torch thread settings, its canary)
       and every batch's engine work runs there, one batch at a time (:meth:`EngineWorker.generate`). OpenMP keeps
       its thread count per calling thread, and a result may depend on it.
    2. One encoding thread encodes each generated batch's part and scores its rows (:meth:`EngineWorker.encode`),
       one batch at a time (a scorer need not be thread-safe), while the engine runs the next batch.
    3. The Ray call's own thread commits the part (run.part_writes=workers: two files, each fsynced, and their
       directories; tens of milliseconds on a disk, more on a shared file system or an object store) and sends the
       result.

    (docs/design.md "Workers write, the driver commits")"""

    def __init__(self, spec: WorkerSpec, name: str) -> None:
        """Returns at once, the engine starting on its thread: a call of :meth:`placed` answers as soon as Ray has
        placed the actor (the dispatcher tells a cluster that cannot place its workers from engines that load
        slowly), and every other call waits for the engine. An engine that fails to start raises its error from
        every call (a ``RayTaskError`` whose cause is the error itself), not from the actor's creation, whose
        error Ray hands over only as text."""
        self._engine_thread = ThreadPoolExecutor(1, thread_name_prefix="evalrun-engine")
        self._encoding_thread = ThreadPoolExecutor(1, thread_name_prefix="evalrun-encode")
        self._started = self._engine_thread.submit(EngineWorker, spec, name)
        self._context_changed = threading.Condition()
        self._run: tuple[str, RunContext] | None = None  # the latest run's key and context

    @property
    def _worker(self) -> EngineWorker:
        return self._started.result()

    def placed(self) -> str:
        """This actor's host, once Ray has placed it (its engine may still be loading)."""
        return socket.gethostname()

    def info(self) -> dict[str, Any]:
        return self._worker.info()

    def log_text(self) -> str:
        return self._worker.log_text()

    def arm_failpoint(self, name: str, once: str | None = None) -> None:
        """Testing recovery: this worker's process SIGKILLs itself when it reaches failpoint ``name`` (with ``once``,
        only if it is the first armed process to: :mod:`evalrun.pipeline.failpoints`)."""
        failpoints.arm(name, once)

    def run_slices(self, key: str, slices: list[tuple[int, int, int]],
                   context: list[Any] | None = None) -> list[BatchOutcome]:  # fmt: skip
        """Batches ``(number, start, stop)`` of the run ``key``, whose :class:`RunContext` comes with the run's first
        call to this worker: ``context`` holds its object ref (in a list, so that Ray hands over the ref, and the
        worker fetches the context, the plan among it, once a run). A later call that starts first waits for it."""
        return self.run_batches(self._context(key, context), slices)

    def run_batches(self, run: RunContext, slices: list[tuple[int, int, int]]) -> list[BatchOutcome]:
        """Batches ``(number, start, stop)``, episodes ``start`` to ``stop`` of the run's plan, each in three stages:
        the engine's work on the engine thread, one batch after another; the part's encoding on the encoding thread,
        its rows scored there when the run's scoring setup is given, so the scorer's CPU is spent in the worker's
        process, not the driver's (docs/design.md "Scores"); with a sink (run.part_writes=workers), the part's commit
        into the run directory on this thread, the driver then sent only what its commit needs (docs/design.md
        "Workers write, the driver commits")."""
        worker, scorer = self._worker, self._worker.part_scorer(run.scoring)

        def generate_then_encode(episodes: list[Planned]) -> Future[BatchOutcome]:
            generated = worker.generate(episodes, run.generator)
            return self._encoding_thread.submit(worker.encode, generated, scorer)

        stages = [self._engine_thread.submit(generate_then_encode, run.plan[start:stop]) for _, start, stop in slices]
        outcomes = []
        for (number, _, _), stage in zip(slices, stages, strict=True):
            outcome = replace(stage.result().result(), batch=number)
            if run.sink is not None:
                part = outcome.part
                assert isinstance(part, EncodedPart)
                files = run.sink.write(number, part.log, part.table)
                failpoints.hit(f"worker-after-write-{run.sink.first_index + number}")  # written, not yet reported
                outcome = replace(outcome, part=part.written(files))
            outcomes.append(outcome)
        return outcomes

    def _context(self, key: str, context: list[Any] | None) -> RunContext:
        """The context of run ``key``: fetched from ``context`` when given, else the one its first call fetches (the
        worker keeps the latest run's)."""
        import ray

        with self._context_changed:
            if context is not None and (self._run is None or self._run[0] != key):
                self._run = (key, ray.get(context[0]))
                self._context_changed.notify_all()
            if not self._context_changed.wait_for(lambda: self._run is not None and self._run[0] == key,
                                                  CONTEXT_WAIT_S):  # fmt: skip
                raise RuntimeError(f"the context of run {key} did not come within {CONTEXT_WAIT_S:g} s")
            assert self._run is not None
            return self._run[1]

    def close(self) -> None:
        def close_started() -> None:  # on the engine thread, after the start: an engine that failed holds nothing
            if self._started.exception() is None:
                self._started.result().close()

        self._engine_thread.submit(close_started).result()
        self._engine_thread.shutdown()
        self._encoding_thread.shutdown()


CONTEXT_WAIT_S = 600.0  # how long a worker's call waits for its run's context, which an earlier call carries
ACTOR_CONCURRENCY = 2  # a RayEngineWorker's threads beyond its batches in flight: its commits, info and logs meanwhile

_LOG = logging.getLogger(__name__)


def judge_spec(spec: WorkerSpec) -> WorkerSpec:
    """The spec of a worker's judge engine: the judges' model (the run's where none is given) on the judges'
    engine settings (the run's where none are given)."""
    return _second_spec(spec, spec.judge_model_path, spec.judge_model_dtype, spec.judge_engine)


def user_spec(spec: WorkerSpec) -> WorkerSpec:
    """The spec of the engine of a model playing a world's simulated user, as :func:`judge_spec`'s."""
    return _second_spec(spec, spec.user_model_path, spec.user_model_dtype, spec.user_engine)


def _second_spec(spec: WorkerSpec, path: str | None, dtype: str | None, engine: EngineConfig | None) -> WorkerSpec:
    """A second engine's spec: its model (the run's where none is given) on its settings (the run's likewise)."""
    return replace(spec, model_path=path or spec.model_path, model_dtype=dtype or spec.model_dtype,
                   engine=engine or spec.engine, judge_model_path=None, judge_model_dtype=None, judge_engine=None,
                   user_model_path=None, user_model_dtype=None, user_engine=None)  # fmt: skip


def canary_on_demand(spec: WorkerSpec) -> tuple[CanaryResult, dict[str, Any]]:
    """``evalrun canary``: one worker built in this process for ``spec`` (its judge engine left out), the
    canary run whatever ``determinism.canary`` says; the result and the worker's info. A canary that
    could not run is a BadInput naming why (the engine refused its prompts, or does not generate)."""
    spec = replace(spec, determinism=replace(spec.determinism, canary=True), judge_model_path=None, judge_engine=None,
                   user_model_path=None, user_engine=None)  # fmt: skip
    worker = EngineWorker(spec, "canary-0")
    if worker.canary is None:
        notes = [n for n in worker.determinism["notes"] if n.startswith("determinism.canary")]
        raise BadInput("canary", "; ".join(notes))
    return worker.canary, worker.info()


def _in_ray_actor() -> bool:
    """Whether this worker is a Ray actor (in a process of its own), not inline in the driver."""
    ray = sys.modules.get("ray")
    return ray is not None and ray.is_initialized() and ray.get_runtime_context().get_actor_id() is not None


def _set_threads(threads: int | None) -> int:
    """torch's intra-op threads set to ``threads`` (None: left as they are); the number it now uses. Called
    before the engine is built: vLLM's CPU worker then replaces ``torch.set_num_threads`` with a no-op."""
    import torch

    if threads is not None and threads >= 1 and torch.get_num_threads() != threads:
        torch.set_num_threads(threads)
    return int(torch.get_num_threads())


def _build_engine(spec: WorkerSpec, worker: str, role: str = "model") -> Any:
    """Engine ``role`` (the run's model, the judges', the simulated user's) of ``worker``. An engine that does not
    start is an :class:`EngineStartFailed` naming the worker, the model and the engine's own last word on why; its
    whole traceback goes to a file of this process (:func:`start_log`). evalrun's own errors (a served model's
    server that does not answer: engine.base_url) pass as they are raised."""
    try:
        if spec.engine_factory is not None:
            return spec.engine_factory(spec)
        return build_engine(spec.engine.name, Path(spec.model_path), spec.model_dtype, spec.engine.as_record())
    except (BadInput, CheckFailed):
        raise
    except Exception as exc:
        raise EngineStartFailed.of(exc, spec, worker, role) from exc


class EngineStartFailed(BadInput):
    """An engine that did not start (weights that do not load, memory or a KV cache the machine cannot give, a
    kernel this machine lacks): exit 2, one line naming the worker, the model and the engine's own explanation,
    the traceback in a file on the worker's host that the message names, and in ``remote_traceback`` (``evalrun
    --debug`` prints it)."""

    @classmethod
    def of(cls, exc: BaseException, spec: WorkerSpec, worker: str, role: str) -> EngineStartFailed:
        text = "".join(traceback.format_exception(exc))
        log = start_log(worker, text)
        said = "\n".join(f"{type(e).__name__}: {e}" for e in _chain(exc))  # the messages, not the frames' file names
        hint = next((hint for pattern, hint in START_HINTS if pattern.search(said)), "")
        where = spec.model_path  # what failed to start: the model (a server evalrun starts serves it too)
        failed = cls(f"{where} ({role})" if role != "model" else where,
                     f"the {spec.engine.name} engine did not start on worker {worker}: {root_cause(exc)}"
                     f"{hint} (traceback: {log or 'not written'})")  # fmt: skip
        failed.remote_traceback = text
        return failed


# What an engine's start-up failure says, and the setting that answers it (EngineStartFailed's hint)
START_HINTS = (
    (re.compile(r"KV cache|kv_cache|KVCACHE|num_gpu_blocks|cache blocks", re.IGNORECASE),
     "; engine.cpu_kvcache_gib (CPU) or engine.gpu_memory_utilization (GPU) sets the KV cache, and "
     "engine.max_model_len what it must hold"),
    (re.compile(r"out of memory|OutOfMemory|Cannot allocate memory|MemoryError", re.IGNORECASE),
     "; the model and its KV cache do not fit: a smaller engine.max_model_len, engine.cpu_kvcache_gib or "
     "engine.gpu_memory_utilization, or more engine.tensor_parallel_size"),
    (re.compile(r"safetensors|SafetensorError|HeaderTooLarge|incomplete metadata|deserializ", re.IGNORECASE),
     "; the model directory's weights do not load (a partial copy? `evalrun pin` checks them against the pins)"),
)  # fmt: skip


def _chain(exc: BaseException) -> list[BaseException]:
    """``exc`` and the exceptions it was raised from or while handling, outermost first."""
    chain = [exc]
    while (inner := exc.__cause__ or (None if exc.__suppress_context__ else exc.__context__)) is not None:
        if any(inner is seen for seen in chain):
            break
        chain.append(inner)
        exc = inner
    return chain


def root_cause(exc: BaseException) -> str:
    """The innermost exception of ``exc``'s chain (what raised first: the engine's own explanation), as one line."""
    exc = _chain(exc)[-1]
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return f"{type(exc).__name__}: {lines[-1].rstrip('.;')}" if lines else type(exc).__name__


def start_log(worker: str, text: str) -> str | None:
    """``text`` (an engine's start-up traceback) written to a file of its own on this host, in
    ``$TMPDIR/evalrun-logs/``; its path, or None when it cannot be written (the message then says so)."""
    name = re.sub(r"[^A-Za-z0-9_.-]+", "-", worker)
    path = Path(tempfile.gettempdir()) / "evalrun-logs" / f"engine-start-{name}.log"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    except OSError:
        return None
    return str(path)
