"""Several lm-eval tasks in one run: a ``group:`` YAML, a ``tag``, or a comma-separated list of names, resolved as
lm-eval 0.4.13 resolves them (``lm_eval/tasks/_factory.py``) into a tree of groups over leaf tasks.

A group's ``task:`` lists names (a task, a group or a tag of the same directory), ``{task: NAME}`` and
``{group: NAME}`` entries, and inline subgroups (``{group: NAME, task: [...]}``, named ``PARENT::NAME`` as lm-eval
names them); a tag stands for its tasks in name order. Its ``aggregate_metric_list`` says which metrics the group
reports over its leaf tasks (``mean``, weighted by each task's size unless ``weight_by_size: false``; evalrun.stats.
groups computes them). A group's other keys (``num_fewshot: 5``) and a member entry's (``{task: NAME, task_alias:
...}``) are settings of its tasks over their YAMLs', passed down as lm-eval's builder passes them: a member's over
its group's, an enclosing group's over an inner one's, key by key. Each leaf carries the settings it gets
(:attr:`Leaf.overrides`), run as its ``task.overrides``. What lm-eval also allows and evalrun does not run is refused
by name: an inline task definition (a ``{task: NAME, ...}`` whose NAME no YAML defines; lm-eval 0.4.13 does not build
the shipped ones either), a ``!function`` among a group's settings for its tasks.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from evalrun.errors import BadInput
from evalrun.records.canonical import file_sha256
from evalrun.tasks.lm_eval_catalog import (
    STRUCTURAL_KEYS,
    Catalog,
    catalog,
    overridable,
    quiet,
    reason_of,
    task_reasons,
)

GROUP_KEYS = ("group", "group_alias", "task", "aggregate_metric_list", "metadata")
AGGREGATE_KEYS = ("metric", "filter_list", "aggregation", "weight_by_size")
NO_FILTER = "none"  # lm-eval's name of a metric's result without a filter pipeline


@dataclass(frozen=True)
class TaskIndex:
    """What a directory of lm-eval YAMLs defines, as lm-eval's ``TaskManager`` indexes it: each task's YAML, each
    group's, and each tag's tasks in name order."""

    tasks: Mapping[str, Path]
    groups: Mapping[str, Path]
    tags: Mapping[str, tuple[str, ...]]
    unreadable: Mapping[Path, str] = dataclasses.field(default_factory=dict)  # YAMLs lm-eval's index passed over

    def listing(self) -> str:
        kinds = (("tasks", self.tasks), ("groups", self.groups), ("tags", self.tags))
        named = [f"{kind} {', '.join(sorted(names))}" for kind, names in kinds if names]
        listed = "one of the " + "; ".join(named) if named else "it has no lm-eval YAML"
        unread = "; ".join(f"{path} ({reason})" for path, reason in self.unreadable.items())
        return f"{listed}; lm-eval does not read {unread}" if unread else listed


def index(directory: Path) -> TaskIndex:
    """The tasks, groups and tags lm-eval indexes under ``directory``."""
    return index_of(catalog(directory))


def index_of(found: Catalog) -> TaskIndex:
    """A catalog's tasks, groups and tags as a group's members are looked up in."""
    tasks = {d.name: d.path for d in found.of_kind("task", "python") if d.path is not None}
    groups = {d.name: d.path for d in found.of_kind("group") if d.path is not None}
    return TaskIndex(tasks, groups, {d.name: d.members for d in found.of_kind("tag")}, found.unreadable)


@dataclass(frozen=True)
class Function:
    """A ``!function`` in a group's YAML, by its reference as written (``script.aggregate_metrics``)."""

    reference: str


def read_yaml(path: Path) -> dict[str, Any]:
    """A group YAML as lm-eval's loader reads it (includes merged), each ``!function`` it names imported as lm-eval
    imports it and kept as a :class:`Function` by its reference."""
    from lm_eval.tasks._yaml_loader import load_yaml

    try:
        with quiet():
            raw = load_yaml(path, resolve_func=False)
            if "group" not in raw:  # a task's YAML (its helpers are the task's to import, where it loads)
                return raw
            return _marked(raw, load_yaml(path, resolve_func=True))
    except (Exception, SystemExit) as error:
        raise BadInput(str(path), f"lm-eval does not read it: {reason_of(error)}") from error


def _marked(raw: Any, resolved: Any) -> Any:
    """``raw`` (functions as the loader's unresolved paths) with each place ``resolved`` holds a function marked."""
    if isinstance(raw, dict) and isinstance(resolved, dict):
        return {k: _marked(v, resolved.get(k)) for k, v in raw.items()}
    if isinstance(raw, list) and isinstance(resolved, list):
        return [_marked(a, b) for a, b in zip(raw, resolved, strict=True)]
    if isinstance(raw, str) and callable(resolved):
        return Function(Path(raw).name)  # the loader's unresolved form: the YAML's directory / the reference
    return raw


@dataclass(frozen=True)
class Aggregate:
    """One ``aggregate_metric_list`` entry: the metric, the filter pipelines it is reported for (None: each
    pipeline a leaf task reports it under, as lm-eval discovers them), and whether tasks weigh by their size."""

    metric: str
    filters: tuple[str, ...] | None = None
    weight_by_size: bool = True
    # "mean", or a function's reference: lm-eval 0.4.13 takes one, and still aggregates by the (weighted) mean
    aggregation: str = "mean"

    def as_record(self) -> dict[str, Any]:
        return {"metric": self.metric, "filter_list": None if self.filters is None else list(self.filters),
                "aggregation": self.aggregation, "weight_by_size": self.weight_by_size}  # fmt: skip


@dataclass(frozen=True)
class Leaf:
    """A task of the suite: its name, the YAML that defines it, and the settings its groups give it over that
    YAML's (``num_fewshot: 5``; plain data, no function), as lm-eval merges them into its config."""

    name: str
    path: Path
    overrides: Mapping[str, Any] = field(default_factory=dict)

    def as_record(self) -> dict[str, Any]:
        return {"task": self.name, **({"overrides": dict(self.overrides)} if self.overrides else {})}


@dataclass(frozen=True)
class Group:
    """A group (or a tag, or a list of names: ``kind``) over tasks and subgroups, with the metrics it aggregates;
    ``source`` is the YAML that defines it (None for a tag, a list, or an inline subgroup)."""

    name: str
    kind: str  # group | tag | tasks
    members: tuple[Group | Leaf, ...]
    aggregates: tuple[Aggregate, ...] = ()
    alias: str | None = None
    source: Path | None = None
    version: Any = None

    def leaves(self) -> list[Leaf]:
        """Every leaf task under the group, in lm-eval's order (depth first), each once."""
        seen: dict[str, Leaf] = {}
        for leaf in _walk(self):
            seen.setdefault(leaf.name, leaf)
        return list(seen.values())

    def groups(self) -> Iterator[Group]:
        """The group and every subgroup, the group first (depth first)."""
        yield self
        for member in self.members:
            if isinstance(member, Group):
                yield from member.groups()

    def as_record(self) -> dict[str, Any]:
        """The group as defined: names, kinds, aggregates, members, and the sha256 of each defining YAML."""
        record: dict[str, Any] = {"name": self.name, "kind": self.kind}
        if self.alias is not None:
            record["alias"] = self.alias
        if self.version is not None:
            record["version"] = self.version
        if self.source is not None:
            record["yaml"] = {"file": self.source.name, "sha256": file_sha256(self.source)}
        record["aggregate_metric_list"] = [a.as_record() for a in self.aggregates]
        record["members"] = [m.as_record() for m in self.members]
        return record

    @classmethod
    def from_record(cls, record: Mapping[str, Any]) -> Group:
        """The group :meth:`as_record` recorded (its tree and aggregates; the YAMLs' paths are not recorded)."""
        members = tuple(cls.from_record(m) if "members" in m else Leaf(str(m["task"]), Path(), m.get("overrides", {}))
                        for m in record["members"])  # fmt: skip
        aggregates = tuple(Aggregate(a["metric"], None if a["filter_list"] is None else tuple(a["filter_list"]),
                                     bool(a["weight_by_size"]), str(a["aggregation"]))
                           for a in record["aggregate_metric_list"])  # fmt: skip
        return cls(str(record["name"]), str(record["kind"]), members, aggregates, record.get("alias"), None,
                   record.get("version"))  # fmt: skip


def _walk(group: Group) -> Iterator[Leaf]:
    for member in group.members:
        if isinstance(member, Leaf):
            yield member
        else:
            yield from _walk(member)


def find_group(path: Path, name: str | None) -> Group | None:
    """The group ``name`` names under ``path`` (a directory of YAMLs, or a group YAML itself), a tag's tasks, or the
    tasks of a comma-separated list of names; None when ``name`` names one task (or ``path`` is a task YAML)."""
    if path.is_file():
        settings = read_yaml(path)
        if not isinstance(settings.get("group"), str):
            return None
        if name is not None and name != settings["group"]:
            raise BadInput("task.name", f"{path} defines group {settings['group']!r}, not {name!r}")
        return _one_run_per_task(_group(settings["group"], settings, path, index(path.parent), (), {}))
    if name is None:
        return None
    found = index(path)
    names = [n.strip() for n in name.split(",")] if "," in name else [name]
    if len(names) == 1:
        return None if name in found.tasks else _one_run_per_task(_member(name, found, "", ("task.name",), (), {}))  # type: ignore[arg-type]
    if not all(names):
        raise BadInput("task.name", f"a comma-separated list of task, group or tag names, got {name!r}")
    members = tuple(_member(n, found, "", ("task.name",), (), {}) for n in names)
    return _one_run_per_task(Group(name, "tasks", members))


def _one_run_per_task(group: Group) -> Group:
    """``group``, whose every task runs once (a run per name): a task it lists twice with different settings is
    refused, naming both (lm-eval keeps one of them, by where it comes in its dictionaries)."""
    first: dict[str, Leaf] = {}
    for leaf in _walk(group):
        seen = first.setdefault(leaf.name, leaf)
        if seen.overrides != leaf.overrides:
            raise BadInput(f"task.name: {group.name}", f"task {leaf.name!r} is in the group twice with different "
                                                       f"settings ({dict(seen.overrides)} and {dict(leaf.overrides)}): "
                                                       "evalrun runs a task once; give it one set")  # fmt: skip
    return group


def group_refusal(name: str, found: TaskIndex) -> str | None:
    """Why evalrun does not run the group ``name`` of ``found`` as its tasks (what ``task.name=NAME`` over that
    directory would refuse, before any task loads, and a task that does not load with its group's settings), or
    None."""
    try:
        resolved = _member(name, found, "", ("task.name",), (), {})
        leaves = _one_run_per_task(resolved).leaves() if isinstance(resolved, Group) else []
    except BadInput as refused:
        return f"{refused.where}: {refused.message}"
    for leaf in leaves:
        reasons = task_reasons(leaf.path, leaf.overrides) if leaf.overrides else []
        if reasons:
            return f"task {leaf.name} with the group's settings {dict(leaf.overrides)}: {'; '.join(reasons)}"
    return None


Settings = Mapping[str, Any]  # a group's or a member's settings of its tasks, over their YAMLs'


def _member(name: str, found: TaskIndex, parent: str, where: tuple[str, ...], seen: tuple[str, ...],
            overrides: Settings) -> Group | Leaf:  # fmt: skip
    """The task, group or tag ``name`` names in ``found`` (a BadInput at ``where`` when none), given ``overrides``."""
    if name in found.tasks:
        return Leaf(name, found.tasks[name], overrides)
    if name in found.groups:
        if name in seen:
            raise BadInput(": ".join(where), f"group {name!r} contains itself (through {' -> '.join(seen)})")
        settings = read_yaml(found.groups[name])
        return _group(name, settings, found.groups[name], found, seen, overrides)
    if name in found.tags:
        return Group(name, "tag", tuple(Leaf(t, found.tasks[t], overrides) for t in found.tags[name]))
    inside = f" (in group {parent!r})" if parent else ""
    raise BadInput(": ".join(where), f"no task, group or tag {name!r}{inside}: {found.listing()}")


def _group(name: str, settings: Mapping[str, Any], source: Path | None, found: TaskIndex, seen: tuple[str, ...],
           overrides: Settings) -> Group:  # fmt: skip
    """The group ``settings`` define; its keys that are not a group's are settings of its tasks, under the ones
    given by whatever includes it (``overrides``)."""
    where = str(source) if source is not None else f"group {name!r}"
    own = _task_settings({k: v for k, v in settings.items() if k not in GROUP_KEYS}, (where,))
    given = {**own, **overrides}
    listed = settings.get("task")
    listed = [listed] if isinstance(listed, str) else listed
    if not isinstance(listed, list) or not listed:
        raise BadInput(f"{where}: task", f"the group's members: a name or a list of them, got {listed!r}")
    members: list[Group | Leaf] = []
    for position, entry in enumerate(listed):
        at = (where, f"task[{position}]")
        reference = entry if isinstance(entry, str) else _reference(entry, found, at)
        if reference is not None:
            named, extra = (reference, {}) if isinstance(reference, str) else reference
            member = _member(named, found, name, at, (*seen, name), {**given, **extra})
            # a tag's tasks are the group's own members (lm-eval adds them one by one), not a subgroup
            members.extend(member.members if isinstance(member, Group) and member.kind == "tag" else [member])
        elif isinstance(entry, dict) and isinstance(entry.get("group"), str) and "task" in entry:
            inline = f"{name}::{entry['group']}"  # an inline subgroup, named as lm-eval names it
            members.append(_group(inline, {**entry, "group": inline}, None, found, (*seen, name), given))
        else:
            raise BadInput(": ".join(at), f"a task, group or tag name, or {{task: NAME}} / {{group: NAME, task: "
                                          f"[...]}}, got {entry!r}")  # fmt: skip
    alias = settings.get("group_alias")
    metadata = settings.get("metadata")
    version = metadata.get("version") if isinstance(metadata, dict) else None
    aggregates = _aggregates(settings.get("aggregate_metric_list"), f"{where}: aggregate_metric_list")
    return Group(name, "group", tuple(members), aggregates, None if alias is None else str(alias), source, version)


def _reference(entry: Any, found: TaskIndex, at: tuple[str, ...]) -> tuple[str, Settings] | None:
    """The name a ``{task: NAME, ...}`` or ``{group: NAME, ...}`` member entry references with the settings it
    gives; None for an inline subgroup (a ``group`` with its own ``task`` list, not a registered group) or an entry
    of another shape."""
    if not isinstance(entry, dict):
        return None
    key = "group" if "group" in entry else "task"
    named = entry.get(key)
    if not isinstance(named, str) or (key == "group" and "task" in entry and named not in found.groups):
        return None
    extra = {k: v for k, v in entry.items() if k != key}
    if key == "task" and extra and all(named not in names for names in (found.tasks, found.groups, found.tags)):
        raise BadInput(": ".join((*at, "task")), f"an inline task definition ({named!r} with {', '.join(extra)}): "
                                                 "no YAML here defines that task, and evalrun runs a group's tasks "
                                                 "from their own YAMLs: write it as a YAML of its own")  # fmt: skip
    return named, _task_settings(extra, at)


def _task_settings(settings: Mapping[str, Any], at: tuple[str, ...]) -> dict[str, Any]:
    """A group's or a member entry's settings of its tasks: lm-eval's task settings, as plain data (the index keys,
    ``tag``, left out as lm-eval's builder drops them)."""
    allowed = overridable()
    given = {}
    for key, value in settings.items():
        if key in STRUCTURAL_KEYS:
            continue
        if key not in allowed:
            raise BadInput(": ".join((*at, key)), f"neither a group's key ({', '.join(GROUP_KEYS)}) nor a setting "
                                                  "of its tasks (a key of lm-eval's TaskConfig)")  # fmt: skip
        if _has_function(value):
            raise BadInput(": ".join((*at, key)), "a !function among a group's settings of its tasks: evalrun "
                                                  "carries them to each task as data; write it into the tasks' "
                                                  "YAMLs")  # fmt: skip
        given[key] = value
    return given


def _has_function(value: Any) -> bool:
    if isinstance(value, Function):
        return True
    if isinstance(value, dict):
        return any(_has_function(v) for v in value.values())
    return isinstance(value, list) and any(_has_function(v) for v in value)


def _aggregates(spec: Any, where: str) -> tuple[Aggregate, ...]:
    if spec is None:
        return ()
    entries = [spec] if isinstance(spec, dict) else spec
    if not isinstance(entries, list):
        raise BadInput(where, f"a list of {{metric: NAME, ...}} entries, got {spec!r}")
    parsed = []
    for position, entry in enumerate(entries):
        at = f"{where}[{position}]"
        if not isinstance(entry, dict) or not isinstance(entry.get("metric"), str):
            raise BadInput(at, f"an entry with a metric name (metric: acc), got {entry!r}")
        for key in entry:
            if key not in AGGREGATE_KEYS:
                raise BadInput(f"{at}.{key}", f"not implemented by evalrun (it reads {', '.join(AGGREGATE_KEYS)})")
        aggregation = entry.get("aggregation", "mean")
        if aggregation != "mean" and not isinstance(aggregation, Function):
            raise BadInput(f"{at}.aggregation", f"mean, or a !function (which lm-eval 0.4.13 takes and still "
                                                f"aggregates by the mean), got {aggregation!r}")  # fmt: skip
        # lm-eval reads weight_by_size by its truth (its shipped agieval group's "truez" weighs by size)
        weight = bool(entry.get("weight_by_size", True))
        filters = entry.get("filter_list")
        filters = [filters] if isinstance(filters, str) else filters
        if filters is not None and (not isinstance(filters, list) or not all(isinstance(f, str) for f in filters)):
            raise BadInput(f"{at}.filter_list", f"a filter name or a list of them, got {entry['filter_list']!r}")
        parsed.append(Aggregate(entry["metric"], None if filters is None else tuple(filters), weight,
                                aggregation if isinstance(aggregation, str) else aggregation.reference))  # fmt: skip
    return tuple(parsed)
