"""Several lm-eval tasks in one run: a group, a tag or a list of names (evalrun.tasks.lm_eval_groups) runs as one
sealed run per task, in one directory, on one engine, and a group record over them.

``GROUP_DIR/TASK/`` is each task's run directory, complete in itself (verify, rescore, replay, compare and report
take it as any run); ``GROUP_DIR/group.json`` (:data:`GROUP_FORMAT`), written once every task's run is complete,
records the group as defined (its YAMLs' sha256), each task's run (its digest, Merkle root and seal), and each
group's aggregate metrics, computed from the tasks' summaries as lm-eval computes a group's (evalrun.stats.groups),
and is sealed by the sha256 of the rest. ``evalrun verify GROUP_DIR`` verifies every task's run and recomputes the
record (evalrun.audit.groups). See docs/design.md "lm-eval groups".
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from evalrun.config import EvalConfig, to_yaml
from evalrun.episodes.lm_eval import DEFAULT_NAME
from evalrun.errors import BadInput
from evalrun.pipeline.dispatch import Dispatcher
from evalrun.pipeline.runner import (
    Prepared,
    check_unchanged,
    execute,
    load_config_file,
    load_run_config,
    open_for,
    prepare,
    resume,
)
from evalrun.records.canonical import canonical_hash
from evalrun.rundir import layout, store
from evalrun.rundir.reader import load_record, read_summary
from evalrun.rundir.writer import locked, write_atomic, write_json
from evalrun.scoring.lm_eval import metric_name
from evalrun.stats.groups import group_mean, group_stderr
from evalrun.stats.summary import is_perplexity, reported
from evalrun.tasks.lm_eval_groups import NO_FILTER, Group, find_group

GROUP_FORMAT = "evalrun.group/1"
_PLAIN_NAME = re.compile(r"[A-Za-z0-9_.\-]+")


@dataclass(frozen=True)
class GroupPlan:
    """A group's run: its definition, its directory's location, and one config per task (run.dir in the directory)."""

    group: Group
    location: str  # a path, or an object store's location (s3://...)
    config: EvalConfig  # the group's own (task.name the group, run.dir its location): config.yaml there
    members: tuple[EvalConfig, ...]

    @property
    def directory(self) -> Path:
        """The group's directory: its path, or, on an object store, the local working copy staged for it (made the
        first time it is asked for: what is written into it is put to the store, and its tasks' runs are made
        within it)."""
        if not store.is_remote(self.location):
            return Path(self.location)
        return store.working_copy(store.open_store(self.location, "run.dir"))  # a resumed group's: the copy read

    def begin(self) -> None:
        """The group's directory with its config.yaml, before its first task runs (``evalrun resume`` reads it)."""
        path = self.directory / layout.CONFIG
        if not path.is_file():
            self.directory.mkdir(parents=True, exist_ok=True)
            write_atomic(path, to_yaml(self.config).encode("utf-8"))


def plan_group(config: EvalConfig) -> GroupPlan | None:
    """The group ``config``'s lm-eval task names (``task.name`` a group, a tag or ``a,b``; ``task.path`` a group
    YAML), each task a config of its own; None when it names one task. Reads YAMLs (and, for a group on an object
    store, lists the store to find a free name); nothing is created."""
    if config.task.kind != "lm_eval" or config.task.path is None:
        return None
    wanted = None if config.task.name == DEFAULT_NAME else config.task.name
    group = find_group(Path(config.prompt_path), wanted)
    if group is None:
        return None
    leaves = group.leaves()
    location = _location(config, group.name)
    typed = Path(config.task.path)
    base = config.prompt_path if config.prompt_path.is_dir() else config.prompt_path.parent
    typed_base = typed if config.prompt_path.is_dir() else typed.parent
    members = []
    for leaf in leaves:
        if not _PLAIN_NAME.fullmatch(leaf.name):
            raise BadInput("task.name", f"task {leaf.name!r} of group {group.name!r}: its run directory is named after "
                                        "it, so it must be letters, digits and _ . - only")  # fmt: skip
        # the group's settings of the task, under the run's own (lm-eval's builder: the caller's over the group's)
        task = replace(config.task, name=leaf.name, path=str(typed_base / leaf.path.relative_to(base)),
                       overrides={**leaf.overrides, **config.task.overrides})  # fmt: skip
        members.append(replace(config, task=task, prompt_path=leaf.path,
                               run=replace(config.run, dir=store.join(location, leaf.name))))  # fmt: skip
    own = replace(config, run=replace(config.run, dir=location))
    return GroupPlan(group, location, own, tuple(members))


def is_group_dir(path: Path) -> bool:
    """A group's directory: finished, with its record (group.json), or not (a config.yaml and no run's manifest)."""
    unfinished = (path / layout.CONFIG).is_file() and not (path / layout.MANIFEST).exists()
    return (path / layout.GROUP).is_file() or unfinished


def load_group(directory: Path, overrides: list[str]) -> GroupPlan:
    """The plan of the group whose directory is ``directory``, from its config.yaml (with ``evalrun resume``'s
    overrides of how it runs); a BadInput when the YAMLs no longer define the tasks it ran."""
    stored = load_config_file(directory / layout.CONFIG, overrides)
    where = store.location_of(directory)  # where it is now: a path, or the store a working copy was read from
    plan = plan_group(replace(stored, run=replace(stored.run, dir=where)))
    if plan is None:
        raise BadInput(str(directory / layout.CONFIG), "not a group's config (its task.name names one task)")
    tasks = {m.task.name for m in plan.members}
    strays = sorted(p.name for p in directory.iterdir() if p.is_dir() and p.name not in tasks)
    if strays:
        raise BadInput(str(directory / strays[0]), f"a run of a task that group {plan.group.name!r} no longer has "
                                                   f"(its tasks now: {', '.join(sorted(tasks))})")  # fmt: skip
    return plan


def _location(config: EvalConfig, name: str) -> str:
    """Where the group's directory goes: ``run.dir``, or a new directory under ``run.root``; a path or an object
    store's location (docs/design.md "Run directories on shared storage")."""
    fresh = f"{re.sub(r'[^A-Za-z0-9_.-]', '_', name)}-{datetime.now(timezone.utc).strftime('%Y%m%d-%H%M%S')}"
    if store.is_remote(config.run.dir or config.run.root):
        where = store.open_store(config.run.dir, "run.dir") if config.run.dir else layout.free_location(
            config.run.root, fresh)  # fmt: skip
        return where.location
    return str(Path(config.run.dir) if config.run.dir else layout.free_path(Path(config.run.root), fresh))


def run_group(plan: GroupPlan, prepared: Sequence[Prepared], dispatcher: Dispatcher,
              on_task: Callable[[Path], None] = lambda _: None) -> dict[str, Any]:  # fmt: skip
    """Run each of the group's prepared tasks on ``dispatcher`` (``on_task`` after each), then write and return
    the group's record."""
    plan.begin()
    for job in prepared:
        on_task(execute(job, dispatcher))
    return finish_group(plan)


def resume_group(directory: Path, overrides: Sequence[str] = (), dispatcher: Dispatcher | None = None,
                 on_task: Callable[[Path], None] = lambda _: None) -> dict[str, Any]:  # fmt: skip
    """Finish an interrupted group: each task's complete run kept (checked against what its YAML makes now: a
    BadInput when it would be made differently), an interrupted one resumed, a missing one run, on one engine
    (``dispatcher``, or one opened for the first task that runs); then the group's record."""
    plan = load_group(directory, list(overrides))
    left = []
    for job in (prepare(member) for member in plan.members):  # every task checked before any engine loads
        run = layout.RunDir(directory / job.config.task.name)
        if run.record.is_file() and (run.path / layout.ATTESTATION).is_file():
            check_unchanged(run, job)  # a complete run is kept only if its task would be made the same now
            continue
        if run.path.exists():
            try:
                load_run_config(run, list(overrides))
            except BadInput as exc:
                why = f"{exc.message}: its driver stopped before the run began; remove it and resume the group again"
                raise BadInput(exc.where, why) from exc
            with locked(run):  # a driver still at it (or a dead one's lock on an object store) refused now
                pass
        left.append((job, run))
    opened: Dispatcher | None = None
    try:
        for job, run in left:
            if dispatcher is None:
                dispatcher = opened = open_for(job)
            if run.path.exists():
                on_task(resume(run.path, list(overrides), dispatcher))
            else:
                on_task(execute(job, dispatcher))
    finally:
        if opened is not None:
            opened.close()
    return finish_group(plan)


def finish_group(plan: GroupPlan) -> dict[str, Any]:
    """The group's record over its tasks' complete runs, written to group.json."""
    record = group_record(plan.group, plan.directory, [m.task.name for m in plan.members])
    write_json(plan.directory / layout.GROUP, record)
    return record


def group_record(group: Group, directory: Path, tasks: Sequence[str]) -> dict[str, Any]:
    """The group record over the complete runs ``directory/TASK`` (see the module's docstring), sealed."""
    members, summaries = [], {}
    for name in tasks:
        run = layout.RunDir(directory / name)
        record = load_record(run)
        summaries[name] = read_summary(run)
        members.append({"task": name, "run": name, "digest": record.digest, "merkle_root": record.merkle_root,
                        "seal": record.seal})  # fmt: skip
    body = {"format": GROUP_FORMAT, "group": group.as_record(), "members": members,
            "results": group_results(group, summaries)}  # fmt: skip
    return {**body, "seal": canonical_hash(body)}


def group_results(group: Group, summaries: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """Each group's (the group's and its subgroups') aggregate metrics over its leaf tasks, from the tasks'
    summaries, as lm-eval's ``Group.aggregate``: per ``aggregate_metric_list`` entry and filter (each filter a
    task reports the metric under, when the entry names none), the tasks' means weighted by their items, the
    pooled standard error, the items; a task without the metric is left out and named."""
    results: dict[str, Any] = {}
    for each in group.groups():
        leaves = [leaf.name for leaf in each.leaves()]
        overall = {name: summaries[name].get("overall", {}) for name in leaves}
        metrics: dict[str, Any] = {}
        for aggregate in each.aggregates:
            filters = aggregate.filters if aggregate.filters is not None else _discovered(aggregate.metric, overall)
            for pipeline in filters:
                key = metric_name(aggregate.metric, pipeline)
                values, sizes, stderrs, have, missing = [], [], [], [], []
                for name in leaves:
                    estimate = overall[name].get(key)
                    value = None if estimate is None else reported(estimate, key)
                    if value is None:
                        missing.append(name)
                        continue
                    have.append(name)
                    values.append(value)
                    sizes.append(int(estimate["n_items"]))
                    # a perplexity's or a corpus metric's: no standard error (lm-eval's is bootstrapped)
                    stderrs.append(None if is_perplexity(key) or "aggregation" in estimate else estimate.get("se"))
                if not values:
                    metrics[key] = {"tasks": [], "missing": missing}
                    continue
                stderr = (group_stderr(stderrs, sizes, aggregate.weight_by_size)  # type: ignore[arg-type]
                          if all(se is not None for se in stderrs) else None)  # fmt: skip
                metrics[key] = {"mean": group_mean(values, sizes, aggregate.weight_by_size), "stderr": stderr,
                                "n_items": sum(sizes), "weight_by_size": aggregate.weight_by_size, "tasks": have,
                                **({"missing": missing} if missing else {})}  # fmt: skip
        results[each.name] = {"kind": each.kind, **({"alias": each.alias} if each.alias else {}),
                              "tasks": leaves, "metrics": metrics}  # fmt: skip
    return results


def _discovered(metric: str, overall: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """The filters the tasks report ``metric`` under (lm-eval's ``_discover_filters_for_metric``), sorted."""
    found = set()
    for metrics in overall.values():
        for key in metrics:
            if key == metric:
                found.add(NO_FILTER)
            elif key.startswith(f"{metric}/"):
                found.add(key[len(metric) + 1 :])
    return sorted(found)
