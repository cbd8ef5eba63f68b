"""One run, start to end: config -> plan -> dispatch -> store -> score -> report.

Everything that can be checked is checked before any model loads; record.json is written last,
so a run directory without it is not a result.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from evalrun import store
from evalrun.config import REPO_ROOT, EvalConfig, to_yaml
from evalrun.dispatch import Dispatcher, dispatcher_key, open_dispatcher
from evalrun.manifest import Digest, build_manifest, compute_digest, generator_info
from evalrun.merkle import merkle_root
from evalrun.model import ResolvedModel, resolve_model
from evalrun.plan import Episode, build_plan
from evalrun.progress import RunProgress
from evalrun.report import summarize
from evalrun.scoring import score_outputs
from evalrun.tasks import Task, load_task
from evalrun.worker import WorkerSpec

RECORD_FORMAT = "evalrun.record/1"


@dataclass(frozen=True)
class Prepared:
    """A run checked and planned, not yet started: nothing has been written or loaded."""

    config: EvalConfig
    model: ResolvedModel
    task: Task
    digest: Digest
    episodes: list[Episode]
    worker_spec: WorkerSpec


def prepare(config: EvalConfig) -> Prepared:
    """All checks that need no engine: model pins, dataset, template rendering, the plan."""
    m = config.section("model")
    model = resolve_model(
        model_id=m["id"], path=m["path"], revision=m["revision"], pins=m["sha256"], pinned=m["pinned"],
        repo_root=REPO_ROOT,
    )  # fmt: skip
    task = load_task(config)
    episodes = build_plan(task, config.section("decoding"), config.section("seeds"))
    spec = WorkerSpec(
        model_path=str(model.path),
        model_dtype=m["dtype"],
        engine=config.section("engine"),
        determinism=config.section("determinism"),
    )
    return Prepared(
        config=config, model=model, task=task, digest=compute_digest(config, task), episodes=episodes,
        worker_spec=spec,
    )  # fmt: skip


def open_for(prepared: Prepared) -> Dispatcher:
    return open_dispatcher(prepared.worker_spec, prepared.config.section("cluster"))


def _batches(episodes: list[Episode], size: int) -> list[list[Episode]]:
    return [episodes[i : i + size] for i in range(0, len(episodes), size)]


def execute(prepared: Prepared, dispatcher: Dispatcher | None = None) -> Path:
    """Run a prepared plan and return the run directory. A given dispatcher is reused, not closed."""
    config = prepared.config
    cluster = config.section("cluster")
    if dispatcher is not None and dispatcher.key != dispatcher_key(prepared.worker_spec, cluster):
        raise ValueError("the dispatcher was opened for another model, engine, determinism or cluster setting")
    own = dispatcher is None
    if dispatcher is None:
        dispatcher = open_for(prepared)
    try:
        return _execute(prepared, dispatcher)
    finally:
        if own:
            dispatcher.close()


def _execute(prepared: Prepared, dispatcher: Dispatcher) -> Path:
    config, task, digest = prepared.config, prepared.task, prepared.digest
    workers = dispatcher.workers()
    manifest = build_manifest(config, task, prepared.model, digest, workers, len(prepared.episodes))

    run_cfg = config.section("run")
    stamp = datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S")
    run = store.create_run_dir(
        Path(run_cfg["root"]),
        f"{task.name}-{stamp}-{digest.digest[:8]}",
        exact=Path(run_cfg["dir"]) if run_cfg["dir"] else None,
    )
    files = {store.CONFIG: store.write_atomic(run.config, to_yaml(config).encode("utf-8"))}
    files[store.MANIFEST] = store.write_json(run.manifest, manifest)

    writer = store.PartWriter(run)
    generator = generator_info()
    batches = _batches(prepared.episodes, config.section("cluster")["batch_size"])
    with RunProgress(len(prepared.episodes), task.name, enabled=run_cfg["progress"]) as progress:
        for outcome in dispatcher.map(batches, generator):
            provenance = store.Provenance(
                worker=outcome.worker, hardware=outcome.hardware,
                batch_size=len(outcome.results), latency_s=outcome.latency_s,
            )  # fmt: skip
            writer.write(outcome.results, provenance)
            progress.advance(len(outcome.results), sum(len(r.completion.token_ids) for r in outcome.results))

    planned = {e.episode_id for e in prepared.episodes}
    if set(writer.heads) != planned:
        raise RuntimeError(f"{len(planned - set(writer.heads))} planned episodes have no result")

    scores = score_outputs(run.read_outputs(["episode_id", "task", "item_id", "seed", "repeat", "output", "target"]),
                           config.section("task")["scorer"])  # fmt: skip
    files[store.SCORES] = store.write_atomic(run.scores, store.table_bytes(scores))
    files[store.SUMMARY] = store.write_json(run.summary, summarize(scores))
    files.update(writer.file_hashes)

    record = {
        "format": RECORD_FORMAT,
        "episodes": {"planned": len(planned), "written": len(writer.heads)},
        "parts": writer.next_index,
        "output_tokens": writer.output_tokens,
        "merkle_root": merkle_root(writer.heads.items()),
        "digest": digest.digest,
        "manifest_sha256": files[store.MANIFEST],
        "files": dict(sorted(files.items())),
        "ended_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }
    store.write_json(run.record, record)
    return run.path
