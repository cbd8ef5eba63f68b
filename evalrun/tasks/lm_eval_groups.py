"""Several lm-eval tasks in one run: a ``group:`` YAML, a ``tag``, or a comma-separated list of names, resolved as
lm-eval 0.4.13 resolves them (``lm_eval/tasks/_factory.py``) into a tree of groups over leaf tasks.

A group's ``task:`` lists names (a task, a group or a tag of the same directory), ``{task: NAME}`` and
``{group: NAME}`` entries, and inline subgroups (``{group: NAME, task: [...]}``, named ``PARENT::NAME`` as lm-eval
names them); a tag stands for its tasks in name order. Its ``aggregate_metric_list`` says which metrics the group
reports over its leaf tasks (``mean``, weighted by each task's size unless ``weight_by_size: false``; evalrun.stats.
groups computes them). What lm-eval also allows and evalrun does not implement is refused by name: a member's or a
group's overrides of task settings (``{task: NAME, num_fewshot: 5}``; write the setting into a task YAML instead),
inline task definitions, any other group key.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from evalrun.errors import BadInput
from evalrun.records.canonical import file_sha256
from evalrun.tasks.lm_eval_catalog import Catalog, catalog, quiet

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


def read_yaml(path: Path) -> dict[str, Any]:
    """A group YAML as lm-eval's loader reads it (includes merged, functions unresolved)."""
    from lm_eval.tasks._yaml_loader import load_yaml

    try:
        with quiet():
            return load_yaml(path, resolve_func=False)
    except Exception as error:
        raise BadInput(str(path), f"lm-eval does not read it ({type(error).__name__}: {error})") from error


@dataclass(frozen=True)
class Aggregate:
    """One ``aggregate_metric_list`` entry: the metric, the filter pipelines it is reported for (None: each
    pipeline a leaf task reports it under, as lm-eval discovers them), and whether tasks weigh by their size."""

    metric: str
    filters: tuple[str, ...] | None = None
    weight_by_size: bool = True

    def as_record(self) -> dict[str, Any]:
        return {"metric": self.metric, "filter_list": None if self.filters is None else list(self.filters),
                "aggregation": "mean", "weight_by_size": self.weight_by_size}  # fmt: skip


@dataclass(frozen=True)
class Leaf:
    """A task of the suite: its name and the YAML that defines it."""

    name: str
    path: Path


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
        record["members"] = [m.as_record() if isinstance(m, Group) else {"task": m.name} for m in self.members]
        return record

    @classmethod
    def from_record(cls, record: Mapping[str, Any]) -> Group:
        """The group :meth:`as_record` recorded (its tree and aggregates; the YAMLs' paths are not recorded)."""
        members = tuple(cls.from_record(m) if "members" in m else Leaf(str(m["task"]), Path()) for m in
                        record["members"])  # fmt: skip
        aggregates = tuple(Aggregate(a["metric"], None if a["filter_list"] is None else tuple(a["filter_list"]),
                                     bool(a["weight_by_size"])) for a in record["aggregate_metric_list"])  # fmt: skip
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
        return _group(settings["group"], settings, path, index(path.parent), ())
    if name is None:
        return None
    found = index(path)
    names = [n.strip() for n in name.split(",")] if "," in name else [name]
    if len(names) == 1:
        return None if name in found.tasks else _member(name, found, "", ("task.name",), ())  # type: ignore[return-value]
    if not all(names):
        raise BadInput("task.name", f"a comma-separated list of task, group or tag names, got {name!r}")
    members = tuple(_member(n, found, "", ("task.name",), ()) for n in names)
    return Group(name, "tasks", members)


def group_refusal(name: str, found: TaskIndex) -> str | None:
    """Why evalrun does not run the group ``name`` of ``found`` as its tasks (what ``task.name=NAME`` over that
    directory would refuse, before any task loads), or None."""
    try:
        _member(name, found, "", ("task.name",), ())
    except BadInput as refused:
        return f"{refused.where}: {refused.message}"
    return None


def _member(name: str, found: TaskIndex, parent: str, where: tuple[str, ...], seen: tuple[str, ...]) -> Group | Leaf:
    """The task, group or tag ``name`` names in ``found`` (a BadInput at ``where`` when none)."""
    if name in found.tasks:
        return Leaf(name, found.tasks[name])
    if name in found.groups:
        if name in seen:
            raise BadInput(": ".join(where), f"group {name!r} contains itself (through {' -> '.join(seen)})")
        settings = read_yaml(found.groups[name])
        return _group(name, settings, found.groups[name], found, seen)
    if name in found.tags:
        return Group(name, "tag", tuple(Leaf(t, found.tasks[t]) for t in found.tags[name]))
    inside = f" (in group {parent!r})" if parent else ""
    raise BadInput(": ".join(where), f"no task, group or tag {name!r}{inside}: {found.listing()}")


def _group(name: str, settings: Mapping[str, Any], source: Path | None, found: TaskIndex,
           seen: tuple[str, ...]) -> Group:  # fmt: skip
    where = str(source) if source is not None else f"group {name!r}"
    for key in settings:
        if key not in GROUP_KEYS:
            raise BadInput(f"{where}: {key}", f"evalrun does not implement a group's overrides of its tasks' "
                                              f"settings (a group reads {', '.join(GROUP_KEYS)}); write {key} into "
                                              "the tasks' YAMLs")  # fmt: skip
    listed = settings.get("task")
    listed = [listed] if isinstance(listed, str) else listed
    if not isinstance(listed, list) or not listed:
        raise BadInput(f"{where}: task", f"the group's members: a name or a list of them, got {listed!r}")
    members: list[Group | Leaf] = []
    for position, entry in enumerate(listed):
        at = (where, f"task[{position}]")
        named = entry if isinstance(entry, str) else _reference(entry, found, at)
        if named is not None:
            member = _member(named, found, name, at, (*seen, name))
            # a tag's tasks are the group's own members (lm-eval adds them one by one), not a subgroup
            members.extend(member.members if isinstance(member, Group) and member.kind == "tag" else [member])
        elif isinstance(entry, dict) and isinstance(entry.get("group"), str) and "task" in entry:
            inline = f"{name}::{entry['group']}"  # an inline subgroup, named as lm-eval names it
            members.append(_group(inline, {**entry, "group": inline}, None, found, (*seen, name)))
        else:
            raise BadInput(": ".join(at), f"a task, group or tag name, or {{task: NAME}} / {{group: NAME, task: "
                                          f"[...]}}, got {entry!r}")  # fmt: skip
    alias = settings.get("group_alias")
    metadata = settings.get("metadata")
    version = metadata.get("version") if isinstance(metadata, dict) else None
    aggregates = _aggregates(settings.get("aggregate_metric_list"), f"{where}: aggregate_metric_list")
    return Group(name, "group", tuple(members), aggregates, None if alias is None else str(alias), source, version)


def _reference(entry: Any, found: TaskIndex, at: tuple[str, ...]) -> str | None:
    """The name a ``{task: NAME}`` or ``{group: NAME}`` member entry references; None for an inline subgroup (a
    ``group`` with its own ``task`` list, not a registered group) or an entry of another shape."""
    if not isinstance(entry, dict):
        return None
    key = "group" if "group" in entry else "task"
    named = entry.get(key)
    if not isinstance(named, str) or (key == "group" and "task" in entry and named not in found.groups):
        return None
    extra = sorted(set(entry) - {key})
    if extra:
        kind = "an inline task definition" if key == "task" and named not in found.tasks else "a member's overrides"
        raise BadInput(": ".join((*at, extra[0])), f"evalrun does not implement {kind} ({', '.join(extra)}); "
                                                   "write the task as a YAML of its own")  # fmt: skip
    return named


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
        if entry.get("aggregation", "mean") != "mean":
            raise BadInput(f"{at}.aggregation", f"mean (lm-eval's one aggregation of a group), got "
                                                f"{entry['aggregation']!r}")  # fmt: skip
        weight = entry.get("weight_by_size", True)
        if not isinstance(weight, bool):
            raise BadInput(f"{at}.weight_by_size", f"true or false, got {weight!r}")
        filters = entry.get("filter_list")
        filters = [filters] if isinstance(filters, str) else filters
        if filters is not None and (not isinstance(filters, list) or not all(isinstance(f, str) for f in filters)):
            raise BadInput(f"{at}.filter_list", f"a filter name or a list of them, got {entry['filter_list']!r}")
        parsed.append(Aggregate(entry["metric"], None if filters is None else tuple(filters), weight))
    return tuple(parsed)
