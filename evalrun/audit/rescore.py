"""``evalrun rescore``: score the stored outputs again with the current scorer code, no engine.

With the run's own scorer (same name, version and parameters) the new table must equal
scores.parquet exactly; a difference means the scorer code changed without a version bump (exit 1).
With a changed scorer (overrides such as ``normalize=[strip,lower]`` or ``name=number``, or a new
version in the code) the new scores go beside the old ones, under
``RUN_DIR/rescore/<scoring hash>/``, and the per-task differences are reported: "was it the
grader?" answered without a single model call.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from evalrun.config import Override, ScorerConfig, parse_overrides
from evalrun.episodes import kind_of_manifest
from evalrun.errors import BadInput, CheckFailed
from evalrun.records.canonical import canonical_hash, differences
from evalrun.records.outputs import same_scores
from evalrun.rundir import layout, writer
from evalrun.rundir.reader import open_run, read_config, read_manifest, read_outputs
from evalrun.scoring import (
    ScoringContext,
    corpus_aggregations,
    make_scorer,
    score_columns,
    score_outputs,
    scorer_version,
    scoring_hash,
)
from evalrun.stats.summary import Aggregation, summarize
from evalrun.tasks.lm_eval import find_task
from evalrun.tasks.rubric import load_rubric


@dataclass(frozen=True)
class TaskDiff:
    task: str
    metric: str
    old_mean: float | None
    new_mean: float | None
    changed_episodes: int


@dataclass(frozen=True)
class ScoreDifference:
    """The first score row (in scores.parquet's order) whose rescored value or extracted answer differs."""

    episode_id: str
    metric: str
    recorded: float | None
    rescored: float | None


@dataclass(frozen=True)
class RescoreReport:
    rows: int
    scorer_changed: bool
    identical: bool  # the new table equals scores.parquet, value for value
    bytes_identical: bool  # and its Parquet bytes equal the file's
    diffs: tuple[TaskDiff, ...]
    written: Path | None
    first_difference: ScoreDifference | None = None
    # what of the scoring settings changed, dotted (an lm-eval task's filter_list.0.filter.0.regex_pattern)
    changed: tuple[str, ...] = ()


def recorded_scorer(run: layout.RunDir) -> ScorerConfig:
    """The run's ``task.scorer`` settings (config.yaml), over the current defaults as a stored config is read."""
    try:
        record = dict(read_config(run)["task"]["scorer"])
    except (KeyError, TypeError) as exc:
        raise BadInput(layout.CONFIG, f"expected the run's resolved config with task.scorer ({exc})") from exc
    return ScorerConfig.from_record({**ScorerConfig().as_record(), **record})


def recorded_aggregations(run: layout.RunDir) -> Mapping[str, Aggregation]:
    """The corpus metrics' aggregations of the run's recorded scorer and scoring context (an lm-eval task's, from
    the YAML its manifest names, checked against what it recorded): what its summary's aggregates are recomputed
    with."""
    manifest = read_manifest(run)
    context = kind_of_manifest(manifest).recorded_scoring_context(manifest, None)
    return corpus_aggregations(recorded_scorer(run), context)


SCORER_SETTINGS = tuple(ScorerConfig().as_record())


def _scorer_key(override: Override) -> str | None:
    """The scorer setting an override sets (``KEY``, ``scorer.KEY`` or ``task.scorer.KEY``); None for another key."""
    key = override.key
    for prefix in ("task.scorer.", "scorer."):
        if key.startswith(prefix):
            key = key[len(prefix) :]
            break
    return key if key in SCORER_SETTINGS else None


def split_overrides(overrides: list[str]) -> tuple[dict[str, object], Path | None, Path | None]:
    """The scorer settings, the rubric file (``task.rubric=PATH`` or ``rubric=PATH``) and an lm-eval task's YAML
    (``task.path=PATH``: its filters and metrics edited) that ``overrides`` set."""
    settings: dict[str, object] = {}
    rubric = task_path = None
    for override in parse_overrides(overrides, plain=True):
        key = _scorer_key(override)
        if key is not None:
            settings[key] = override.value
        elif override.key in ("task.rubric", "rubric") and isinstance(override.value, str):
            rubric = Path(override.value).expanduser().resolve()
        elif override.key == "task.path" and isinstance(override.value, str):
            task_path = Path(override.value).expanduser().resolve()
        else:
            names = ", ".join(SCORER_SETTINGS)
            raise BadInput(override.text, f"expected KEY=VALUE with KEY a scorer setting ({names}), task.rubric or "
                                          "task.path (an lm-eval task's YAML)")  # fmt: skip
    return settings, rubric, task_path


def edited_lm_eval_context(run: layout.RunDir, path: Path) -> tuple[ScoringContext, tuple[str, ...]]:
    """The scoring context of an lm-eval run with its task's YAML at ``path`` read now (its filters and metrics
    edited), and what of them changed. Everything else the YAML defines must be as recorded: the prompts the
    model was shown, the data, the functions (else: a new run, exit 2)."""
    manifest = read_manifest(run)
    task = manifest.get("task") or {}
    if task.get("kind") != "lm_eval":
        raise BadInput("task.path", "this run is not an lm-eval task's: task.path edits an lm-eval task's YAML")
    settings = read_config(run).get("task") or {}  # the data read as the run read it
    edited = find_task(path, str(task.get("name")), bool(settings.get("allow_unpinned_dataset")),
                       settings.get("dataset_revision"), settings.get("overrides"))  # fmt: skip
    recorded_prompts = {k: v for k, v in (task.get("prompt_pack") or {}).items() if k not in ("path", "decoding")}
    recorded = {"prompt_pack": recorded_prompts, "dataset": (task.get("dataset") or {}).get("splits")}
    now = {"prompt_pack": edited.prompt_record(), "dataset": edited.splits_record()}
    first = next(differences(recorded, now), None)
    if first is not None:
        raise BadInput(str(path), f"what the model was shown or what it ran on changed ({first[0]}): the "
                                  "recorded outputs do not apply; that is a new run")  # fmt: skip
    scoring, recorded_scoring = edited.scoring_record(), task.get("lm_eval") or {}
    context = kind_of_manifest(manifest).recorded_scoring_context(manifest, None)
    return replace(context, lm_eval=scoring, lm_eval_path=str(edited.path)), tuple(
        d[0] for d in differences(recorded_scoring, scoring)
    )


def _diffs(old: pa.Table, new: pa.Table) -> tuple[TaskDiff, ...]:
    old_summary, new_summary = summarize(old), summarize(new)
    key = ["episode_id", "metric"]
    before = {tuple(k): v for *k, v in zip(*(old.column(c).to_pylist() for c in [*key, "value"]), strict=True)}
    changed: dict[tuple[str, str], int] = {}
    for eid, metric, task, value in zip(*(new.column(c).to_pylist() for c in [*key, "task", "value"]), strict=True):
        if before.get((eid, metric)) != value:
            changed[(task, metric)] = changed.get((task, metric), 0) + 1
    pairs = sorted({(t, m) for s in (old_summary, new_summary) for t, metrics in s["tasks"].items() for m in metrics})
    return tuple(
        TaskDiff(
            task=t,
            metric=m,
            old_mean=old_summary["tasks"].get(t, {}).get(m, {}).get("mean"),
            new_mean=new_summary["tasks"].get(t, {}).get(m, {}).get("mean"),
            changed_episodes=changed.get((t, m), 0),
        )
        for t, m in pairs
    )


def recorded_context(run: layout.RunDir, rubric_path: Path | None) -> tuple[ScoringContext, bool]:
    """The scoring context of the run, with its rubric file (or ``rubric_path``) read now; True when
    that rubric differs from the one the run was scored with.

    Only weights, option values and the aggregation may differ: verdicts were given to the
    judge-facing part, so a rubric whose judges would see something else is refused (exit 2).
    """
    manifest = read_manifest(run)
    recorded_rubric = manifest.get("task", {}).get("rubric")
    if recorded_rubric is None:
        if rubric_path is not None:
            raise BadInput("task.rubric", "this run has no rubric: its outputs were never judged")
        return kind_of_manifest(manifest).recorded_scoring_context(manifest, None), False
    path = rubric_path or Path(recorded_rubric["path"])
    rubric = load_rubric(path)
    if canonical_hash(rubric.judge_facing()) != canonical_hash(recorded_rubric["judge_facing"]):
        changed = [k for k, v in rubric.judge_facing().items() if v != recorded_rubric["judge_facing"].get(k)]
        raise BadInput(str(path), f"what the judges see changed ({', '.join(changed)}): the recorded verdicts do not "
                                  "apply; judging again is a new run")  # fmt: skip
    recorded_record = {k: v for k, v in recorded_rubric.items() if k != "path"}
    return kind_of_manifest(manifest).recorded_scoring_context(manifest, rubric), rubric.as_record() != recorded_record


def first_difference(old: pa.Table, new: pa.Table) -> ScoreDifference | None:
    """The first row of ``old`` whose value or extracted answer ``new`` does not have for its episode and metric
    (a row ``new`` lacks: rescored None)."""
    key = ["episode_id", "metric"]
    rescored = {(e, m): (v, x) for e, m, v, x in zip(*(new.column(c).to_pylist() for c in [*key, "value", "extracted"]),
                                                      strict=True)}  # fmt: skip
    for e, m, v, x in zip(*(old.column(c).to_pylist() for c in [*key, "value", "extracted"]), strict=True):
        got = rescored.pop((e, m), None)
        if got is None or got != (v, x):
            return ScoreDifference(e, m, v, None if got is None else got[0])
    return next((ScoreDifference(e, m, None, v) for (e, m), (v, _x) in rescored.items()), None)


@dataclass(frozen=True)
class _Rescored:
    spec: ScorerConfig
    context: ScoringContext
    scorer_changed: bool
    old: pa.Table
    new: pa.Table
    identical: bool
    bytes_identical: bool
    new_bytes: bytes
    changed: tuple[str, ...] = ()


def _rescore(run: layout.RunDir, overrides: list[str]) -> _Rescored:
    recorded = recorded_scorer(run)
    settings, rubric_path, task_path = split_overrides(overrides)
    context, rubric_changed = recorded_context(run, rubric_path)
    changed: tuple[str, ...] = ()
    if task_path is not None:
        context, changed = edited_lm_eval_context(run, task_path)
    spec = ScorerConfig.from_record({**recorded.as_record(), **settings})
    make_scorer(spec, context)  # a BadInput names a setting the scorer cannot use
    outputs = read_outputs(run, score_columns(spec))
    new = score_outputs(outputs, spec, context)
    old_bytes = run.scores.read_bytes()
    old = pq.read_table(pa.BufferReader(old_bytes))
    old_versions = set(old.column("scorer_version").to_pylist()) if "scorer_version" in old.column_names else set()
    scorer_changed = (spec != recorded or rubric_changed or bool(changed)
                      or old_versions - {scorer_version(spec)} != set())  # fmt: skip
    identical = same_scores(old, new)
    new_bytes = writer.table_bytes(new)
    return _Rescored(
        spec, context, scorer_changed, old, new, identical, identical and new_bytes == old_bytes, new_bytes, changed
    )


def rescore_recorded(path: Path) -> RescoreReport:
    """The stored outputs rescored with the run's own scorer and compared with scores.parquet; nothing
    is written and a difference is reported, not raised (``evalrun check``)."""
    r = _rescore(open_run(path), [])
    if r.identical:
        return RescoreReport(r.new.num_rows, r.scorer_changed, True, r.bytes_identical, (), None)
    return RescoreReport(r.new.num_rows, r.scorer_changed, False, False, _diffs(r.old, r.new), None,
                         first_difference(r.old, r.new))  # fmt: skip


def rescore_run(path: Path, overrides: list[str]) -> RescoreReport:
    run = open_run(path)
    r = _rescore(run, overrides)
    spec, context, scorer_changed, new = r.spec, r.context, r.scorer_changed, r.new
    if r.identical:
        return RescoreReport(new.num_rows, scorer_changed, True, r.bytes_identical, (), None, changed=r.changed)
    out_dir = run.path / layout.RESCORE / scoring_hash(spec, context)[:16]
    out_dir.mkdir(parents=True, exist_ok=True)
    writer.write_atomic(out_dir / layout.SCORES, r.new_bytes)
    writer.write_json(out_dir / layout.SUMMARY, summarize(new, aggregations=corpus_aggregations(spec, context)))
    writer.write_json(out_dir / layout.RESCORER, {**spec.as_record(), "context": context.as_record()})
    diffs = _diffs(r.old, new)
    report = RescoreReport(new.num_rows, scorer_changed, False, False, diffs, out_dir, first_difference(r.old, new),
                           r.changed)  # fmt: skip
    if not scorer_changed:
        changed = sum(d.changed_episodes for d in diffs)
        first = report.first_difference
        where = f"; first: episode {first.episode_id} metric {first.metric}" if first is not None else ""
        raise CheckFailed(
            f"{layout.SCORES}: rescoring with the recorded scorer {spec.name} version "
            f"{scorer_version(spec)} gives different scores ({changed} rows differ{where}; new scores in "
            f"{out_dir}): the scorer code changed without a version bump, or the outputs changed"
        )
    return report
