"""One run, start to end: config -> plan -> dispatch -> store -> score -> report.

Everything that can be checked is checked before any model loads (the run directory's destination
too); record.json and then the attestation are written last, and a run is complete only with both
(docs/design.md "The run directory").
"""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from functools import partial
from pathlib import Path
from typing import Any

import pyarrow as pa

from evalrun.config import EngineConfig, EvalConfig, ModelConfig, load_stored, parse_overrides, to_yaml, validate
from evalrun.engines import ENGINES, EngineDown, preflight, weights_pinned
from evalrun.engines.pins import ResolvedModel, model_directory, resolve_model
from evalrun.episodes import (
    EPISODE_KINDS,
    EncodedPart,
    EpisodeKind,
    Planned,
    PlanSlice,
    WrittenPart,
    kind_of,
    model_files,
    planned_digests,
)
from evalrun.episodes.checked import verify_part
from evalrun.errors import BadInput, CheckFailed, Interrupted, WriteFailed, first_line
from evalrun.pipeline import canary, cpu_isa, failpoints
from evalrun.pipeline.checkpoints import Checkpointer
from evalrun.pipeline.dispatch import DISPATCHERS, Dispatcher, IdleDispatcher, dispatcher_key, open_dispatcher
from evalrun.pipeline.environment import install_provenance
from evalrun.pipeline.manifest import (
    Digest,
    build_manifest,
    compute_digest,
    generator_info,
    run_identity,
    scoring_context,
)
from evalrun.pipeline.progress import RunProgress
from evalrun.pipeline.provenance import Drift, DriftStopped, WorkerWatch
from evalrun.pipeline.runlogs import write_logs
from evalrun.pipeline.worker import WorkerSpec
from evalrun.records.canonical import differences, file_sha256
from evalrun.records.formats import SEAL_FORMAT_ALL, EpisodeCounts, Record, seal_of
from evalrun.records.heads import Heads, digest_sum
from evalrun.records.merkle import DIGEST_BYTES
from evalrun.rundir import layout, ledger, reader, store, writer
from evalrun.rundir.attest import attest_finished_run, signing_key
from evalrun.rundir.writer import PartSink
from evalrun.scoring import NORMALIZERS, SCORERS, Scoring, make_scorer, score_columns
from evalrun.scoring.parts import ScoringSetup
from evalrun.stats.summary import summarize, summary_columns


@dataclass(frozen=True)
class Prepared:
    """A run checked and planned, not yet started: nothing has been written or loaded."""

    config: EvalConfig
    model: ResolvedModel
    kind: EpisodeKind
    task: Any  # the kind's own loaded task
    digest: Digest
    episodes: Sequence[Planned]  # the kind's episodes (a dataset's Plan makes them on demand)
    worker_spec: WorkerSpec
    judge_model: ResolvedModel | None = None  # None: the judges (if any) run on the run's model
    user_model: ResolvedModel | None = None  # None: a model-played simulated user (if any) is the run's model


def _directory(m: ModelConfig) -> Path:
    return model_directory(model_id=m.id, path=m.path, revision=m.revision, cache_dir=m.cache_dir).resolve()


def worker_spec(config: EvalConfig) -> WorkerSpec:
    """The engine worker a config needs, from the config alone: its model's directory is found, not hashed,
    so that the engine can load while :func:`prepare` checks the pins (docs/design.md "Start-up and exit")."""
    judge, user = config.judge_model, config.user_model
    if config.cluster.name == "local":  # the workers run on this machine: its processor is theirs
        cpu_isa.check_runs_here(config.engine.cpu_isa_levels())
    return WorkerSpec(
        model_path=str(_directory(config.model)),
        model_dtype=config.model.dtype,
        engine=config.engine,
        determinism=config.determinism,
        judge_model_path=str(_directory(judge)) if judge is not None else None,
        judge_model_dtype=judge.dtype if judge is not None else None,
        judge_engine=config.judge_engine,
        threads=worker_threads(config),
        user_model_path=str(_directory(user)) if user is not None else None,
        user_model_dtype=user.dtype if user is not None else None,
        user_engine=config.user_engine,
    )


def worker_threads(config: EvalConfig) -> int:
    """torch's threads in each engine worker: the whole CPUs it is given (``cluster.cpus_per_worker``, at least
    one), as Ray gives an actor of that many CPUs (OMP_NUM_THREADS); inline too (docs/nondeterminism.md
    "What it costs")."""
    return max(1, int(config.cluster.cpus_per_worker))


def _resolve(m: ModelConfig) -> ResolvedModel:
    """A model config section, its pins checked (BadInput naming the first mismatch)."""
    return resolve_model(
        model_id=m.id, path=m.path, revision=m.revision, pins=dict(m.sha256), pinned=m.pinned,
        cache_dir=m.cache_dir,
    )  # fmt: skip


def _served_unpinned(model: ResolvedModel, engine: EngineConfig) -> ResolvedModel:
    """``model``, recorded as unpinned when ``engine`` computes with weights evalrun did not hash (a server it did
    not start: its model files here only render the prompts)."""
    return model if weights_pinned(engine.name, engine.as_record()) else replace(model, pinned=False)


def check_plugins(config: EvalConfig) -> None:
    """Every plug-in the config names is registered: episode kind, engine, dispatcher, scorer, normalisers
    (a BadInput names the field). Nothing is imported to check."""
    EPISODE_KINDS.check(config.task.episode_kind)
    ENGINES.check(config.engine.name)
    for section in ("judge_engine", "user_engine"):
        engine = getattr(config, section)
        if engine is not None:
            ENGINES.check(engine.name, field=f"{section}.name")
    DISPATCHERS.check(config.cluster.name)
    SCORERS.check(config.task.scorer.name)
    for name in config.task.scorer.normalize:
        NORMALIZERS.check(name)


def prepare(config: EvalConfig) -> Prepared:
    """All checks that need no engine: plug-in names, model pins, the task (dataset, templates, world), the
    scorer's settings, the plan. The kind of episode loads and plans (docs/design.md "Kinds of episode")."""
    check_plugins(config)
    resolved = _resolve(config.model)
    model = _served_unpinned(resolved, config.engine)
    judge = _second_model(config, config.judge_model, config.judge_engine, resolved, model)
    user = _second_model(config, config.user_model, config.user_engine, resolved, model)
    kind = kind_of(config)
    files = model_files(model, judge, user)
    config, task = kind.load(config, files)
    make_scorer(config.task.scorer, kind.scoring_context(config, task, model, judge))  # e.g. a regex that won't compile
    episodes = kind.plan(config, task, files)
    return Prepared(
        config=config, model=model, kind=kind, task=task, digest=compute_digest(kind, config, task, model, judge),
        episodes=episodes, worker_spec=worker_spec(config), judge_model=judge, user_model=user,
    )  # fmt: skip


def _second_model(config: EvalConfig, own: ModelConfig | None, engine: EngineConfig | None, resolved: ResolvedModel,
                  model: ResolvedModel) -> ResolvedModel | None:  # fmt: skip
    """The model a second engine (the judges', a simulated user's) runs, as the run records it: its own model, pins
    checked; or the run's model, recorded as a model of its own when the second engine's weights are pinned where
    the run's are not, or the other way round (a served judge or customer of an offline run's model); else None."""
    second = _resolve(own) if own is not None else None
    if second is None and engine is None:
        return None
    served = _served_unpinned(second or resolved, engine or config.engine)
    return served if second is not None or served.pinned != model.pinned else None


def check_destination(config: EvalConfig) -> None:
    """``run.dir`` (must not hold files) or ``run.root`` can take a new run directory: checked before any
    engine loads (a BadInput names the field)."""
    if config.run.dir:
        layout.check_destination("run.dir", config.run.dir, exact=True)
    else:
        layout.check_destination("run.root", config.run.root, exact=False)


def part_writes(config: EvalConfig) -> str:
    """Who writes a run's parts: ``run.part_writes``, or by default the engine workers where they run in processes
    of their own on a cluster (``cluster=ray``) or the run lives on an object store, else the driver
    (docs/design.md "Workers write, the driver commits")."""
    if config.run.part_writes is not None:
        return config.run.part_writes
    remote = store.is_remote(config.run.dir or config.run.root)
    return "workers" if config.cluster.name != "inline" and (config.cluster.name == "ray" or remote) else "driver"


def part_sink(run: layout.RunDir, config: EvalConfig, first_index: int) -> PartSink | None:
    """Where the workers commit parts when they write them (None: the driver writes them): the run directory as
    every node names it, the absolute path on a shared file system or the store's location."""
    if part_writes(config) != "workers":
        return None
    remote = store.remote_of(run.path)
    return PartSink(remote.location if remote is not None else str(run.path.resolve()), first_index)


def check_before_engine(config: EvalConfig) -> None:
    """What a new run checks before any engine loads, beyond its config: the destination, the ledger it
    anchors to, and the install record and container image the manifest will record (a BadInput names the
    field)."""
    check_destination(config)
    check_ledger(config)
    install_provenance()


def check_ledger(config: EvalConfig) -> None:
    """``run.ledger``: a ledger whose chain holds, or a new file in a directory that exists."""
    if config.run.ledger is None:
        return
    path = Path(config.run.ledger)
    if path.is_dir() or not path.parent.is_dir():
        raise BadInput("run.ledger", f"{path}: expected a ledger file in a directory that exists")
    if path.exists():
        try:
            ledger.read_ledger(path)
        except CheckFailed as exc:
            raise BadInput("run.ledger", str(exc)) from exc


def _anchor(run: layout.RunDir, config: EvalConfig) -> None:
    """A finished run's seal, digest and root appended to ``run.ledger`` (as ``evalrun anchor`` appends them)."""
    if config.run.ledger is None:
        return
    record = reader.load_record(run)
    assert record.seal is not None
    try:
        ledger.append(Path(config.run.ledger), ledger.run_name(run.path), record.seal, record.digest,
                      record.merkle_root)  # fmt: skip
    except CheckFailed as exc:
        raise BadInput("run.ledger", str(exc)) from exc


def _checkpointer(run: layout.RunDir, prepared: Prepared, parts: writer.PartWriter) -> Checkpointer | None:
    """The run's checkpoints (none when both run.checkpoint_every_* are null), going on from a resumed run's."""
    kept = dict(parts.file_hashes) if parts.kept_parts else None
    found = Checkpointer(run, prepared.digest.digest, prepared.config.run, signing_key(), parts.heads, kept)
    return found if found.enabled else None


@contextlib.contextmanager
def _resumable(run: layout.RunDir) -> Iterator[None]:
    """A run that stops on a failed write or Ctrl-C says how to finish it: ``evalrun resume RUN_DIR``."""
    try:
        yield
    except WriteFailed as exc:
        raise WriteFailed(exc.where, f"{exc.message}; the run is incomplete: then `evalrun resume {run.path}` "
                                     f"completes it") from exc  # fmt: skip
    except EngineDown as exc:
        stopped = CheckFailed(f"{first_line(exc)}; the run is incomplete: `evalrun resume {run.path}` finishes it "
                              "once the engine answers again (with engine.base_url=URL if it moved)")  # fmt: skip
        stopped.remote_traceback = getattr(exc, "remote_traceback", None)  # a worker's, for evalrun --debug
        raise stopped from exc
    except KeyboardInterrupt as exc:
        raise Interrupted(run.path) from exc


def open_for(prepared: Prepared) -> Dispatcher:
    """The dispatcher (its workers, their engines) of a prepared run, once the engine's own checks pass (e.g. the
    server of a served model answers and serves it: engines.CheckedEngine; a BadInput names the setting)."""
    config = prepared.config
    policy_needs, judge_needs = _engine_needs(prepared)
    judges = config.judge_engine or (config.engine if prepared.judge_model is not None else None)
    preflight(config.engine.name, prepared.model.path, config.engine.as_record(),
              policy_needs | (judge_needs if judges is None else frozenset()))  # fmt: skip
    if judges is not None:  # the judges' server (when served) answers, serves the judges' model, gives what they need
        hint = "" if config.judge_engine is not None else (
            " (the judges' model runs on the run's engine settings: give its server with +engine@judge_engine="
            "openai judge_engine.base_url=URL)")  # fmt: skip
        _preflight_second(
            judges,
            "judge_engine" if config.judge_engine is not None else "engine",
            (prepared.judge_model or prepared.model).path,
            judge_needs,
            "the judges' engine",
            hint,
        )
    if config.user_model is not None or config.user_engine is not None:  # the simulated user's server, likewise
        _preflight_second(
            config.user_engine or config.engine,
            "user_engine" if config.user_engine else "engine",
            (prepared.user_model or prepared.model).path,
            frozenset(),
            "the simulated user's engine",
        )
    return open_dispatcher(prepared.worker_spec, config.cluster)


def _preflight_second(engine: EngineConfig, where: str, model: Path, needs: frozenset[str], what: str,
                      hint: str = "") -> None:  # fmt: skip
    """The preflight of a worker's second engine (the judges', the simulated user's), its errors named as ``where``."""
    try:
        preflight(engine.name, model, engine.as_record(), needs)
    except BadInput as exc:
        named = f"{where}{exc.where.removeprefix('engine')}" if exc.where.startswith("engine") else exc.where
        raise BadInput(named, f"{what}: {exc.message}{hint}") from exc


# what an engine must serve for each way of scoring a choice (letter: generation only)
CHOICE_SCORING_NEEDS = {"loglikelihood": frozenset({"loglikelihood"}), "both": frozenset({"loglikelihood"}),
                        "loglikelihood_rolling": frozenset({"loglikelihood", "loglikelihood_rolling"})}  # fmt: skip


def _engine_needs(prepared: Prepared) -> tuple[frozenset[str], frozenset[str]]:
    """What the run's calls need of an engine beyond generation, for the policy's calls and the judges':
    ``loglikelihood`` where multiple-choice options or a rubric's verdicts are scored by it, as the kind's scoring
    context says (engines.CheckedEngine)."""
    context = prepared.kind.scoring_context(prepared.config, prepared.task, prepared.model, prepared.judge_model)
    rubric = context.rubric
    policy = CHOICE_SCORING_NEEDS.get(context.choice_scoring, frozenset())
    judges = {"loglikelihood"} if rubric is not None and rubric.scoring == "loglikelihood" else set()
    return frozenset(policy), frozenset(judges)


def _checked_dispatcher(prepared: Prepared, dispatcher: Dispatcher | None) -> tuple[Dispatcher, bool]:
    """The given dispatcher (checked to fit the run) or a new one; True when the caller must close it."""
    if dispatcher is None:
        return open_for(prepared), True
    if dispatcher.key != dispatcher_key(prepared.worker_spec, prepared.config.cluster):
        raise ValueError("the dispatcher was opened for another model, engine, determinism or cluster setting")
    return dispatcher, False


def execute(prepared: Prepared, dispatcher: Dispatcher | None = None) -> Path:
    """Run a prepared plan in a new run directory and return it. A given dispatcher is reused, not closed."""
    clock = PhaseClock()
    check_before_engine(prepared.config)
    dispatcher, own = _checked_dispatcher(prepared, dispatcher)
    try:
        config, task = prepared.config, prepared.task
        watch = _watch_workers(config, dispatcher, None)  # drift stops the run here, before anything is written
        manifest = build_manifest(
            prepared.kind,
            config,
            task,
            prepared.model,
            prepared.digest,
            dispatcher.workers(),
            len(prepared.episodes),
            prepared.judge_model,
            watch.drift,
            prepared.user_model,
        )
        stamp = datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S")
        run = layout.create_run_dir(
            config.run.root, f"{task.name}-{stamp}-{prepared.digest.digest[:8]}", exact=config.run.dir or None
        )
        with writer.locked(run):
            try:
                writer.write_atomic(run.config, to_yaml(config).encode("utf-8"))
                writer.write_json(run.manifest, manifest)
                writer.copy_tokenizer(run, prepared.model.path)
            except WriteFailed as exc:  # not yet a run that resume can finish
                raise WriteFailed(exc.where, f"{exc.message}; then remove {run.path} and run again") from exc
            with _resumable(run):
                failpoints.hit("before-first-part")
                committed = _Committed(run, prepared)
                parts = writer.PartWriter(run, background=True, on_durable=committed)
                committed.attach(parts, _checkpointer(run, prepared, parts))
                _complete(run, prepared, dispatcher, parts, committed, watch, clock)
            _anchor(run, config)
        return run.path
    finally:
        if own:
            dispatcher.close()


def load_run_config(run: layout.RunDir, overrides: list[str]) -> EvalConfig:
    """The config a run was made with (its config.yaml), with ``cluster=NAME``, ``cluster.*``, ``run.progress``,
    ``run.on_drift``, a served engine's transport (``engine.base_url``, ...: a server that moved) and a model's
    directory (``model.path``: weights that moved, still checked against the recorded sha256 of every file)
    overrides: how it runs, never what it computes."""
    if not run.config.is_file() or not run.manifest.is_file():
        raise BadInput(str(run.path), "not an evalrun run directory (config.yaml or manifest.json is missing)")
    return load_config_file(run.config, overrides)


def load_config_file(path: Path, overrides: list[str]) -> EvalConfig:
    """A stored config.yaml (a run's, a group's) with :func:`load_run_config`'s overrides of how it runs."""
    transport = {f"{section}.{key}" for section in ("engine", "judge_engine") for key in EngineConfig.TRANSPORT}
    moved = {f"{section}.path" for section in ("model", "judge_model", "user_model")}
    for override in parse_overrides(overrides, plain=True):
        key = override.key
        if not (key in ("cluster", "run.progress", "run.on_drift", "run.part_writes") or key.startswith("cluster.")
                or key in transport or key in moved):  # fmt: skip
            raise BadInput(override.text, "only cluster=NAME, cluster.*, run.progress, run.on_drift, run.part_writes, "
                                          "a served engine's engine.base_url, api_key_env, max_concurrency, timeout_s "
                                          "and max_retries, and model.path (weights that moved) overrides are "
                                          "accepted; the rest is the run's own")  # fmt: skip
    return validate(load_stored(path, overrides, groups=("cluster",)))


def check_finished(run: layout.RunDir) -> None:
    """A finished run's files are the ones its record lists, with their sha256: a CheckFailed names the first that
    is not (an edited summary, a part), so resume never presents an altered run as complete."""
    record = reader.load_record(run)
    for rel, expected in sorted(record.files.items()):
        path = run.path / rel
        if not path.is_file() or file_sha256(path) != expected:
            state = "missing" if not path.is_file() else "its sha256 differs from record.json"
            raise CheckFailed(f"{rel}: {state}: the run was altered after it finished; `evalrun verify {run.path}` "
                              "says what else; a run that fails verify is no result (run it again)")  # fmt: skip


def _check_kept(run: layout.RunDir, prepared: Prepared) -> None:
    """Every part a resume keeps verifies (its chains, and its rows against them): a damaged one is refused
    (CheckFailed naming the file), never sealed into a run that cannot verify."""
    for out_part in run.output_parts():
        out_rel = out_part.relative_to(run.path).as_posix()
        log_rel = run.log_part(int(out_part.stem.split("-")[1])).relative_to(run.path).as_posix()
        try:
            verify_part(str(run.path), log_rel, out_rel, prepared.kind.name)
        except CheckFailed as exc:
            raise CheckFailed(f"{exc}; resume keeps only parts that verify: remove {run.path / log_rel} and "
                              f"{run.path / out_rel} (their episodes run again), then `evalrun resume "
                              f"{run.path}`") from None  # fmt: skip


def check_unchanged(run: layout.RunDir, prepared: Prepared) -> None:
    """The run's recorded identity is what ``prepared`` would make now, or a BadInput naming the first field that
    changed (by its own field first, task.dataset_sha256, the digests that follow from it last)."""
    recorded = prepared.kind.recorded_identity(reader.read_manifest(run).get("identity", {}), prepared.config)
    current = run_identity(prepared.kind, prepared.config, prepared.task, prepared.model, prepared.digest,
                           len(prepared.episodes), prepared.judge_model, prepared.user_model)  # fmt: skip
    changed = sorted((path for path, _, _ in differences(recorded, current)), key=lambda p: p.startswith("digest"))
    if changed:
        more = f" (and {len(changed) - 1} more)" if len(changed) > 1 else ""
        raise BadInput(str(run.manifest), f"the run would now be made differently: {changed[0]} changed{more}")


def resume(run_path: Path, overrides: list[str] | None = None, dispatcher: Dispatcher | None = None) -> Path:
    """Finish an interrupted run: keep its complete parts, run only the missing episodes.

    A run is complete when record.json and its attestation are both on disk; a run that stopped
    between the two (a crash, a full disk) gets its attestation now (docs/design.md "The run directory").
    """
    run = layout.RunDir(run_path)
    prepared = prepare(load_run_config(run, overrides or []))
    with writer.locked(run), _resumable(run):
        if run.record.is_file():
            if not (run.path / layout.ATTESTATION).is_file():
                writer.remove_temporaries(run)
                attest_finished_run(run.path)
            _anchor(run, prepared.config)  # a no-op when the run was anchored before it stopped
            return run.path
        check_unchanged(run, prepared)
        clock = PhaseClock()
        committed = _Committed(run, prepared)
        parts = writer.PartWriter.recover(run, background=True, on_durable=committed)
        _check_kept(run, prepared)  # what it keeps, and its checkpoints, checked before any engine starts
        committed.attach(parts, _checkpointer(run, prepared, parts))
        if len(parts.kept_ids) == len(prepared.episodes):  # nothing left to run: no worker, no engine
            dispatcher, own = IdleDispatcher(dispatcher_key(prepared.worker_spec, prepared.config.cluster)), False
        else:
            dispatcher, own = _checked_dispatcher(prepared, dispatcher)
        try:
            watch = _watch_workers(prepared.config, dispatcher, run)
            _complete(run, prepared, dispatcher, parts, committed, watch, clock, resumed=True)
        finally:
            if own:
                dispatcher.close()
        _anchor(run, prepared.config)
    return run.path


def drift_policy(config: EvalConfig) -> str:
    """``run.on_drift``, or its default: fail under ``determinism.enabled`` (strict), else warn."""
    return config.run.on_drift or ("fail" if config.determinism.enabled else "warn")


def _warn_drift(drift: Drift) -> None:
    print(f"evalrun: warning: {drift.message()} (run.on_drift=warn: recorded)", file=sys.stderr)


def _watch_workers(config: EvalConfig, dispatcher: Dispatcher, run: layout.RunDir | None) -> WorkerWatch:
    """The dispatcher's workers checked for drift (docs/design.md "Worker provenance") and their
    batch-invariance canaries (:func:`check_canary`); a CheckFailed names the first worker and field that
    differ under ``run.on_drift=fail``, or the first worker whose canary failed under
    ``determinism.require_invariant``."""
    # a resumed run's answers must come from the servers its manifest recorded, not from whatever answers now
    recorded = reader.read_manifest(run).get("workers") if run is not None else None
    # (None: none recorded, as for a run made before servers were fingerprinted: the first worker's then)
    reference = ((recorded[0].get("engine") or {}).get("served_by") or None) if recorded else None
    watch = WorkerWatch(drift_policy(config), _warn_drift, reference)
    for info in dispatcher.workers():
        _see(watch, info, run, config)
    return watch


def _see(watch: WorkerWatch, info: dict[str, Any], run: layout.RunDir | None, config: EvalConfig) -> None:
    if str(info["worker"]) in watch.workers:
        return
    check_canary(config, info, run)
    try:
        watch.see(info)
    except DriftStopped as exc:
        raise _drift_stop(exc, run) from exc


def _drift_stop(exc: DriftStopped, run: layout.RunDir | None) -> CheckFailed:
    where = (
        "nothing was written" if run is None
        else f"the run is incomplete: `evalrun resume {run.path} run.on_drift=warn` completes it"
    )  # fmt: skip
    return CheckFailed(f"{exc} (run.on_drift=fail; {where})")


def check_canary(config: EvalConfig, info: dict[str, Any], run: layout.RunDir | None) -> None:
    """A worker's batch-invariance canary (``info["canary"]``, docs/nondeterminism.md "Canary") against the
    run's determinism settings, before any of its results count. Under ``determinism.require_invariant`` a
    failed canary, or one that did not run, stops the run: a CheckFailed (exit 1) naming the worker and the
    figures, raised before anything is written (or, for a worker that replaced another mid-run, with no
    record.json: the run is incomplete, not a result). Otherwise, under ``determinism.enabled`` (strict), a
    failed canary is one warning line on stderr and the run goes on; its record is in the manifest either
    way, and the results table and the report show it."""
    record, worker = info.get("canary"), str(info.get("worker"))
    if config.determinism.require_invariant:
        where = ("nothing was written" if run is None
                 else f"the run is incomplete, with no record.json: {run.path} holds no result")  # fmt: skip
        if record is None:
            notes = [n for n in (info.get("determinism") or {}).get("notes") or []
                     if n.startswith("determinism.canary")]  # fmt: skip
            why = f": {'; '.join(notes)}" if notes else ""
            raise CheckFailed(f"worker {worker}: the batch-invariance canary did not run{why} "
                              f"(determinism.require_invariant=true needs it to pass; {where})")  # fmt: skip
        if canary.record_failed(record):
            raise CheckFailed(f"worker {worker}: {canary.failure_line(record)} (determinism.require_invariant=true; "
                              f"{where})")  # fmt: skip
    elif config.determinism.enabled and canary.record_failed(record):
        print(f"evalrun: warning: worker {worker}: {canary.failure_line(record)}: its results may depend on the "
              f"batch they ran in (recorded in the manifest; determinism.require_invariant=true stops such a run)",
              file=sys.stderr)  # fmt: skip


class PhaseClock:
    """Wall seconds per phase of one driver invocation (docs/design.md "Record": ``timings``, provenance).

    ``start-up``: from the call to the first batch sent (engine load included when the run starts its
    own workers); ``generation``: batches dispatched and answered, the driver's writing excluded;
    ``writing``: the driver waiting for parts to be committed and their scored rows taken (the part
    writer does both in the background); ``scoring``: the scores sorted and written, and the summary;
    ``records``: the Merkle root and the logs (made on a thread of their own during ``scoring``: what is
    left of them), and the seal (record.json's own write and the attestation follow it and are not counted).
    """

    def __init__(self) -> None:
        self._mark = time.perf_counter()
        self.seconds: dict[str, float] = {}

    def lap(self, phase: str) -> None:
        now = time.perf_counter()
        self.add(phase, now - self._mark)
        self._mark = now

    def add(self, phase: str, seconds: float) -> None:
        self.seconds[phase] = self.seconds.get(phase, 0.0) + seconds

    def record(self, workers: list[dict[str, Any]]) -> dict[str, Any]:
        """The phases, each worker's engine load and each worker's batch-invariance canary (its seconds, run
        after the engine loaded and before the worker served: within ``start-up`` when this invocation
        started the workers), by worker."""
        loads = {w["worker"]: w["engine_load_s"] for w in workers if w.get("engine_load_s") is not None}
        warmups = {w["worker"]: w["warmup_s"] for w in workers if w.get("warmup_s") is not None}
        canaries = {w["worker"]: w["canary"]["seconds"] for w in workers
                    if isinstance(w.get("canary"), dict) and w["canary"].get("seconds") is not None}  # fmt: skip
        return {**{k: round(v, 3) for k, v in self.seconds.items()}, "engine_load": loads,
                **({"warmup": warmups} if warmups else {}), **({"canary": canaries} if canaries else {})}  # fmt: skip


class _Committed:
    """What the part writer's thread does with each part once it is durable: fire the failpoint
    after-part-K, and take the part's scored rows, so that a run's scoring overlaps its generation and
    only the sorted scores are left for its end (docs/design.md "Scores"). A part's rows come scored by
    its worker when the worker's scoring hash is the run's; else they are scored here, from the rows an
    inline worker handed over or from the part's bytes."""

    def __init__(self, run: layout.RunDir, prepared: Prepared) -> None:
        spec = prepared.config.task.scorer
        self.run = run
        self.columns = score_columns(spec)
        self.setup = ScoringSetup(spec, scoring_context(prepared.kind, prepared.config, prepared.task, prepared.model,
                                                        prepared.judge_model))  # fmt: skip
        self.scoring_hash = prepared.digest.scoring
        self.scoring = Scoring(self.setup.spec, self.setup.context)
        self.refused: set[str] = set()  # workers whose scored rows carried another scoring hash
        self.file_hashes: Mapping[str, str] = {}
        self.checkpointer: Checkpointer | None = None

    def attach(self, parts: writer.PartWriter, checkpointer: Checkpointer | None) -> None:
        """The part writer whose parts these are (their files' hashes), and the run's checkpoints if any."""
        self.file_hashes, self.checkpointer = parts.file_hashes, checkpointer

    def __call__(self, index: int, part: EncodedPart | WrittenPart) -> None:
        failpoints.hit(f"after-part-{index}")
        self._score(index, part)
        if self.checkpointer is not None:  # the part's files are durable and hashed by now (this thread's)
            self.checkpointer.committed({name: self.file_hashes[name] for name in layout.part_names(index)})

    def _score(self, index: int, part: EncodedPart | WrittenPart) -> None:
        if part.scored is not None and part.scored.scoring_hash == self.scoring_hash:
            self.scoring.add_scored(part.scored.table())
            return
        if part.scored is not None and part.scored.scoring_hash not in self.refused:
            self.refused.add(part.scored.scoring_hash)
            print(f"evalrun: warning: a worker scored with scoring hash {part.scored.scoring_hash[:12]}, the run's "
                  f"is {self.scoring_hash[:12]} (other scoring code or Python): the driver scores its parts",
                  file=sys.stderr)  # fmt: skip
        if part.rows is not None:
            self.scoring.add(part.rows)
            return
        where = layout.part_names(index)[1]
        table = part.table if isinstance(part, EncodedPart) else reader.part_bytes(self.run, where)
        self.scoring.add(reader.decode_output_part(table, where, self.columns))


def _write_scores(run: layout.RunDir, schema: pa.Schema, chunks: Iterator[pa.Table]) -> str:
    """scores.parquet written a chunk at a time as the chunks are scored: the run never holds it whole."""
    return writer.write_atomic_streamed(run.scores, lambda file: writer.write_parquet(file, schema, chunks))


class _PlanPass:
    """One pass over the plan for a run's dispatch: the episodes not yet written, as slices of the plan, and what
    the end of the run checks the written episodes against (their count and the sum of their ids, which the plan
    gives without making its episodes: a pass that never holds the plan's ids; ids are sha256 digests, and a
    repeated one fails the Merkle root)."""

    ID_SPAN = 4096  # episodes whose ids are made at a time, in whole batches

    def __init__(self, kept: frozenset[str]) -> None:
        self._kept = frozenset(bytes.fromhex(episode_id) for episode_id in kept)
        self.id_sum = 0
        self.kept_seen = 0

    def slices(self, plan: Sequence[Planned], size: int) -> Iterator[PlanSlice]:
        """Batches of at most ``size`` episodes, each a run of consecutive episodes of ``plan`` that are not kept
        (a kept part's episodes split a batch: a resumed run's batches fall where the first run's did). The ids are
        made a span of whole batches at a time (``ID_SPAN`` episodes or one batch): a small batch's own call and sum
        cost more than its ids."""
        total, span = 0, max(1, self.ID_SPAN // size) * size
        for span_begin in range(0, len(plan), span):
            span_stop = min(span_begin + span, len(plan))
            digests = planned_digests(plan, span_begin, span_stop)
            total += digest_sum(digests)
            for begin in range(span_begin, span_stop, size):
                stop = min(begin + size, span_stop)
                start = begin
                for position in range(begin, stop) if self._kept else ():
                    offset = (position - span_begin) * DIGEST_BYTES
                    if digests[offset : offset + DIGEST_BYTES] in self._kept:
                        self.kept_seen += 1
                        if start < position:
                            yield PlanSlice(plan, start, position)
                        start = position + 1
                if start < stop:
                    yield PlanSlice(plan, start, stop)
        self.id_sum = total % (1 << 256)

    def check(self, heads: Heads, planned: int) -> None:
        if len(heads) != planned or heads.id_sum != self.id_sum or self.kept_seen != len(self._kept):
            raise RuntimeError(
                f"the written episodes are not the planned ones ({len(heads)} written of {planned}, "
                f"{self.kept_seen} of {len(self._kept)} kept ones planned)"
            )


def _complete(
    run: layout.RunDir,
    prepared: Prepared,
    dispatcher: Dispatcher,
    parts: writer.PartWriter,
    committed: _Committed,
    watch: WorkerWatch,
    clock: PhaseClock,
    resumed: bool = False,
) -> None:
    """Score the kept parts, run every planned episode the part writer does not have yet (``committed``
    takes the scored rows of each new part as it is committed), then write the scores, summarise and record."""
    config, scoring = prepared.config, committed.scoring
    if parts.kept_parts:  # a resumed run: the parts on disk now are the kept ones
        scoring.add(reader.read_outputs(run, committed.columns))
    planned = len(prepared.episodes)
    plan = _PlanPass(parts.kept_ids)
    generator = generator_info()
    batches = plan.slices(prepared.episodes, config.cluster.batch_size)
    progress = RunProgress(planned, prepared.task.name, enabled=config.run.progress, done=len(parts.kept_ids))
    clock.lap("start-up")
    writing = 0.0
    first_index = parts.next_index  # batch N of this dispatch is part first_index + N, whoever answers first
    sink = part_sink(run, config, first_index)
    with progress, contextlib.closing(parts):
        try:
            for outcome in dispatcher.map(batches, generator, committed.setup, sink):
                if outcome.worker not in watch.workers:  # a replacement worker: checked before its results count
                    for info in dispatcher.workers():
                        if info["worker"] == outcome.worker:
                            _see(watch, info, run, config)
                try:  # a server that changed mid-run: its answers are not committed under run.on_drift=fail
                    watch.see_served(outcome.worker, outcome.served)
                except DriftStopped as exc:
                    raise _drift_stop(exc, run) from exc
                started = time.perf_counter()
                if parts.write(outcome.part, None if outcome.batch is None else first_index + outcome.batch):
                    progress.advance(outcome.episodes, outcome.part.output_tokens)
                writing += time.perf_counter() - started
        except EngineDown:  # the backend stopped answering: the batches it answered are kept for resume
            parts.flush()
            raise
        started = time.perf_counter()
        parts.flush()  # every part durable before anything is scored
        writing += time.perf_counter() - started
    clock.lap("generation")
    clock.add("generation", -writing)
    clock.add("writing", writing)

    plan.check(parts.heads, planned)

    # The Merkle root (hashing) and the logs (fetched from the workers, which are idle now, and fsynced)
    # are made on a thread of their own while the scores are sorted and written (Arrow and the disk).
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="evalrun-records") as records:
        merkle = records.submit(parts.heads.merkle_root)
        run_logs = records.submit(write_logs, run, dispatcher)
        files = {name: file_sha256(run.path / name) for name in (layout.CONFIG, layout.MANIFEST)}
        files[layout.SCORES] = scoring.into(partial(_write_scores, run))
        pa.default_memory_pool().release_unused()  # the scored rows' memory back before the summary's
        corpus = scoring.aggregations
        scores = reader.read_scores(run, summary_columns(reader.scores_columns(run), bool(corpus)), compact=True)
        # failed episodes: see `error`
        files[layout.SUMMARY] = writer.write_json(run.summary, summarize(scores, aggregations=corpus))
        del scores
        files.update(parts.file_hashes)
        files.update(writer.tokenizer_hashes(run))
        files.update({p.relative_to(run.path).as_posix(): file_sha256(p) for p in run.checkpoint_files()})
        failpoints.hit("before-record")
        clock.lap("scoring")
        try:
            root = merkle.result()
        except ValueError as exc:  # an episode id written twice
            raise RuntimeError(str(exc)) from None
        logs = run_logs.result()

    record = Record(
        episodes=EpisodeCounts(planned=planned, written=len(parts.heads)),
        parts=len(parts.file_hashes) // 2,
        output_tokens=parts.output_tokens,
        merkle_root=root,
        digest=prepared.digest.digest,
        manifest_sha256=files[layout.MANIFEST],
        files=dict(sorted(files.items())),
        dispatch={
            **dispatcher.stats.as_record(),
            **watch.as_record(),
            "resumed": resumed,
            "kept_parts": parts.kept_parts,
        },
        ended_at=datetime.now(timezone.utc).isoformat(timespec="seconds"),
    )
    clock.lap("records")
    timings = clock.record(dispatcher.workers())
    record = record.model_copy(update={"timings": timings, "logs": logs, "seal_format": SEAL_FORMAT_ALL})
    record = record.model_copy(update={"seal": seal_of(record)})  # over everything, provenance included
    writer.write_json(run.record, record)
    attest_finished_run(run.path)  # in-toto Statement over the record files (signed if EVALRUN_SIGNING_KEY)
