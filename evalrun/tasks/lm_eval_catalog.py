"""lm-eval's task library as lm-eval itself indexes and loads it: what a directory of task YAMLs defines (``evalrun
tasks list``) and, for every task and group, whether it loads and every reason it does not (``evalrun tasks check``,
the counterpart of lm-eval's ``validate``), with no model and no data.

A task loads when lm-eval reads its YAML (includes merged, every ``!function`` imported), builds its ``TaskConfig``,
resolves its metrics and aggregations and builds its filters (``ConfigurableTask`` up to the point where it would
read its data), and evalrun can serve what it asks of a model. The reasons are gathered, not stopped at: a helper
module that does not import (naming the missing package and the lm-eval extra that brings it), keys lm-eval does
not know, metrics and filters it cannot find, and what evalrun does not run (an output type, images or audio,
model-written code). One task's failure never hides its neighbours': each is loaded on its own, so a helper that
does not import refuses only the tasks that name it.

lm-eval is imported here and only when a command asks for it (it costs about a second).
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.metadata
import logging
import os
import re
import threading
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from evalrun.errors import BadInput

LM_EVAL = "lm-eval"  # the distribution; its version is recorded by every run that reads a task through it
# what evalrun's engines serve of lm-eval's output types (the others are refused by name)
SERVED_OUTPUT_TYPES = ("generate_until", "multiple_choice", "loglikelihood", "loglikelihood_rolling")
STRUCTURAL_KEYS = ("tag", "group", "task_list", "class")  # index keys, not TaskConfig fields (lm-eval drops them)
# modules whose import name is not their distribution's (for naming the package a helper misses)
DISTRIBUTION_OF = {"sklearn": "scikit-learn", "yaml": "pyyaml", "PIL": "pillow", "Levenshtein": "levenshtein",
                   "fuzzywuzzy": "fuzzywuzzy", "rouge_score": "rouge-score"}  # fmt: skip


def lm_eval_version() -> str:
    """The installed lm-eval's version (a BadInput when it is not installed)."""
    try:
        return importlib.metadata.version(LM_EVAL)
    except importlib.metadata.PackageNotFoundError:
        raise BadInput("task", "lm-eval tasks are read by lm-evaluation-harness, which is not installed: "
                               "scripts/setup.sh installs it (pip install 'evalrun[lm-eval]')") from None  # fmt: skip


def library_dir() -> Path:
    """lm-eval's own shipped task YAMLs (``lm_eval/tasks`` of the installed package)."""
    lm_eval_version()
    import lm_eval.tasks

    return Path(lm_eval.tasks.__file__).parent


@contextlib.contextmanager
def quiet() -> Iterator[None]:
    """lm-eval's own logging (a warning per defaulted setting) and what helper modules print as they import held
    back, and nothing fetched: a metric lm-eval does not register is looked up on the Hugging Face hub by
    ``evaluate``, which must fail here. A helper that exits as it imports (SystemExit) is a reason, not an end."""
    logger = logging.getLogger("lm_eval")
    level = logger.level
    saved = {k: os.environ.get(k) for k in ("HF_HUB_OFFLINE", "HF_EVALUATE_OFFLINE", "HF_DATASETS_OFFLINE")}
    logger.setLevel(logging.CRITICAL)
    os.environ.update(dict.fromkeys(saved, "1"))
    try:  # helper modules print at import (a missing optional package, a solver not on PATH)
        if threading.current_thread() is not threading.main_thread():
            yield  # sys.stdout is the process's: a scoring thread leaves the run's own output alone
        else:
            with open(os.devnull, "w") as sink, contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink):
                yield
    finally:
        logger.setLevel(level)
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


@dataclass(frozen=True)
class Definition:
    """One name a directory defines: a task (``kind`` task, or python for a ``class:`` task), a group or a tag,
    with the YAML that defines it (None for a tag) and, for a tag or a group, its members' names."""

    name: str
    kind: str
    path: Path | None
    members: tuple[str, ...] = ()

    def as_record(self) -> dict[str, Any]:
        return {"name": self.name, "kind": self.kind, "path": None if self.path is None else str(self.path),
                **({"members": list(self.members)} if self.kind in ("group", "tag") else {})}  # fmt: skip


@dataclass(frozen=True)
class Catalog:
    """What lm-eval's ``TaskManager`` indexes under a directory, and the YAML files it passed over (a YAML that is
    neither a task nor a group, e.g. a template others include, is not listed; one that does not parse is, with
    lm-eval's reason)."""

    root: Path
    definitions: Mapping[str, Definition]
    unreadable: Mapping[Path, str]

    def of_kind(self, *kinds: str) -> list[Definition]:
        return [d for d in self.definitions.values() if d.kind in kinds]

    def listing(self) -> str:
        """The names, grouped by kind, for a message that asks the user to pick one."""
        named = [f"{kind}s {', '.join(sorted(d.name for d in self.of_kind(kind)))}"
                 for kind in ("task", "group", "tag") if self.of_kind(kind)]  # fmt: skip
        return "one of the " + "; ".join(named) if named else "it defines no lm-eval task"


def catalog(root: Path) -> Catalog:
    """The tasks, groups and tags lm-eval's ``TaskManager(include_path=root, include_defaults=False)`` finds."""
    if not root.exists():
        raise BadInput("PATH", f"{root}: no such file or directory (expected a directory of lm-eval task YAMLs)")
    lm_eval_version()
    from lm_eval.tasks import TaskManager
    from lm_eval.tasks._index import Kind, TaskIndex
    from lm_eval.tasks._yaml_loader import load_yaml

    with quiet():
        manager = TaskManager(include_path=str(root), include_defaults=False)
        kinds = {Kind.TASK: "task", Kind.PY_TASK: "python", Kind.GROUP: "group", Kind.TAG: "tag"}
        definitions = {}
        for name, entry in sorted(manager.task_index.items()):
            members: tuple[str, ...] = tuple(sorted(entry.tags)) if entry.kind == Kind.TAG else ()
            if entry.kind == Kind.GROUP:
                members = tuple(_member_name(m) for m in _as_list((entry.cfg or {}).get("task")))
            definitions[name] = Definition(name, kinds.get(entry.kind, "unknown"), entry.yaml_path, members)
        indexed = {d.path for d in definitions.values() if d.path is not None}
        unreadable = {}
        files = [root] if root.is_file() else TaskIndex._iter_yaml_files(root)
        for path in files:  # lm-eval's index skips a YAML it cannot read, silently: say which, and why
            if path not in indexed:
                try:
                    load_yaml(path, resolve_func=False)
                except (Exception, SystemExit) as error:
                    unreadable[path] = reason_of(error)
    return Catalog(root, definitions, unreadable)


@dataclass(frozen=True)
class Checked:
    """Whether one task or group loads, and every reason it does not."""

    name: str
    kind: str
    path: Path | None
    reasons: tuple[str, ...]

    @property
    def loads(self) -> bool:
        return not self.reasons

    def as_record(self) -> dict[str, Any]:
        return {"name": self.name, "kind": self.kind, "path": None if self.path is None else str(self.path),
                "loads": self.loads, "reasons": list(self.reasons)}  # fmt: skip


def check(root: Path, names: Sequence[str] = ()) -> tuple[Catalog, list[Checked]]:
    """Every task and group under ``root`` (or those ``names`` pick; a tag stands for its tasks) checked."""
    found = catalog(root)
    unknown = [n for n in names if n not in found.definitions]
    if unknown:
        raise BadInput("NAMES", f"{', '.join(unknown)}: not defined under {root} ({found.listing()})")
    picked: list[Definition] = []
    for name in names or [d.name for d in found.definitions.values() if d.kind != "tag"]:
        definition = found.definitions[name]
        expanded = [found.definitions[m] for m in definition.members] if definition.kind == "tag" else [definition]
        picked.extend(d for d in expanded if d not in picked)
    # evalrun's own reading of a group (which members it runs, and how) is lm_eval_groups', which reads a
    # directory through this module: imported here, not at the top
    from evalrun.tasks.lm_eval_groups import group_refusal, index_of

    members = index_of(found)
    with quiet():
        tasks = {d.name: Checked(d.name, d.kind, d.path, tuple(task_reasons(d.path)))
                 for d in picked if d.kind in ("task", "python") and d.path is not None}  # fmt: skip
        checked = []
        for definition in picked:
            if definition.name in tasks:
                checked.append(tasks[definition.name])
            elif definition.kind == "group":
                reasons = group_reasons(definition, found, tasks)
                refusal = group_refusal(definition.name, members) if not reasons else None
                reasons += [f"evalrun does not run it as its tasks: {refusal}"] if refusal else []
                checked.append(Checked(definition.name, "group", definition.path, tuple(reasons)))
    return found, checked


def counts(checked: Sequence[Checked]) -> dict[str, Any]:
    """How many of each kind load, and how many tasks and groups each kind of reason refuses (a reason's kind: its
    text up to the first colon, so that every missing package, output type or key is counted apart)."""
    loads = {}
    for kind, label in (("task", "tasks"), ("python", "python tasks"), ("group", "groups")):
        of_kind = [c for c in checked if c.kind == kind]
        if of_kind:
            loads[label] = (sum(c.loads for c in of_kind), len(of_kind))
    reasons: dict[str, int] = {}
    for c in checked:
        for kind in dict.fromkeys(_reason_kind(r) for r in c.reasons):
            reasons[kind] = reasons.get(kind, 0) + 1
    return {"loads": loads, "reasons": dict(sorted(reasons.items(), key=lambda kv: (-kv[1], kv[0])))}


def _reason_kind(reason: str) -> str:
    if reason.startswith("member "):
        return "a member does not load"
    if reason.startswith("evalrun does not run it as its tasks"):
        return "evalrun does not run it as its tasks"
    if ": package " in reason:  # the missing package and its extra, not the module that missed it
        return reason.split(" [")[0]
    head = reason.partition(": ")[0]
    return head if len(head) < 120 else head[:117] + "..."


def task_reasons(path: Path, overrides: Mapping[str, Any] | None = None) -> list[str]:
    """Every reason the task YAML at ``path`` (with ``overrides`` of its settings) does not load (empty: it
    loads)."""
    from lm_eval.config.task import TaskConfig
    from lm_eval.filters import build_filter_ensemble
    from lm_eval.tasks._yaml_loader import load_yaml

    try:
        raw = {**load_yaml(path, resolve_func=False), **(overrides or {})}
    except (Exception, SystemExit) as error:
        return [f"its YAML does not read: {reason_of(error)}"]
    reasons = []
    known = task_setting_names()
    unknown = [] if "class" in raw else sorted(k for k in raw if k not in known and k not in STRUCTURAL_KEYS)
    if unknown:
        reasons.append(f"keys lm-eval's TaskConfig does not have: {', '.join(unknown)}")
    reasons.extend(served_reasons(raw))
    try:
        config = {**load_yaml(path, resolve_func=True), **(overrides or {})}
    except (Exception, SystemExit) as error:
        return [*reasons, f"a helper it names does not import: {reason_of(error)}"]
    if "class" in config:  # a Python task class: lm-eval builds it; nothing more to check without its data
        return reasons
    for key in STRUCTURAL_KEYS:
        config.pop(key, None)
    if unknown:
        return reasons

    try:
        defined_task(config)
    except (Exception, SystemExit) as error:
        return [*reasons, f"lm-eval does not build it: {reason_of(error)}"]
    settings = TaskConfig(**config)
    if settings.process_results is None and settings.output_type == "generate_until":  # the one type that calls them
        for metric in settings.metric_list or ():
            name = metric.get("metric") if isinstance(metric, dict) else None
            if isinstance(name, str) and not _metric_found(name, bool(metric.get("hf_evaluate"))):
                reasons.append(f"metric {name!r} is neither lm-eval's nor importable offline from evaluate")
    for pipeline in settings.filter_list or () if isinstance(settings.filter_list, list) else ():
        try:
            build_filter_ensemble(pipeline["name"], [[f["function"], {k: v for k, v in f.items() if k != "function"}]
                                                     for f in pipeline["filter"]])  # fmt: skip
        except (Exception, SystemExit) as error:
            reasons.append(f"filter {pipeline.get('name')!r}: {reason_of(error)}")
    return reasons


def task_setting_names() -> frozenset[str]:
    """The settings of lm-eval's ``TaskConfig``: what a task YAML may set."""
    from lm_eval.config.task import TaskConfig

    return frozenset(f.name for f in dataclasses.fields(TaskConfig))


GIVEN_BY_EVALRUN = ("task", "custom_dataset")  # a task's name and its documents are not a setting given over a YAML


def overridable() -> frozenset[str]:
    """The settings a group's settings of its tasks and ``task.overrides`` may give over a task's YAML: lm-eval's
    task settings but its name, its dataset object (evalrun hands the task its documents) and the index keys (tag,
    which lm-eval's builder drops)."""
    return task_setting_names() - {*GIVEN_BY_EVALRUN, *STRUCTURAL_KEYS}


class _Defined(Exception):
    """Raised where ConfigurableTask would read its data: everything before it was built."""


def defined_task(config: Mapping[str, Any]) -> Any:
    """lm-eval's ``ConfigurableTask`` of a resolved config, built up to where it would read its data: its metrics,
    aggregations and filters, with no data (lm-eval's own errors raised)."""
    from lm_eval.api.task import ConfigurableTask

    defined: list[Any] = []

    class Defined(ConfigurableTask):
        def download(self, *args: Any, **kwargs: Any) -> None:
            defined.append(self)
            raise _Defined

    try:
        Defined(config=dict(config))
    except _Defined:
        return defined[0]
    raise AssertionError("lm-eval's ConfigurableTask did not read its data")  # it always does, in 0.4.13


def served_reasons(config: Mapping[str, Any]) -> list[str]:
    """What the task asks of a model that evalrun does not serve."""
    reasons = []
    output_type = config.get("output_type", "generate_until")
    if "class" in config:
        reasons.append("class: a Python task reads its own data; evalrun hands its pinned data to YAML tasks only")
    elif output_type not in SERVED_OUTPUT_TYPES:
        reasons.append(f"output_type {output_type!r}: evalrun's engines serve {', '.join(SERVED_OUTPUT_TYPES)}")
    for key in ("doc_to_image", "doc_to_audio"):
        if config.get(key) is not None:
            reasons.append(f"{key}: evalrun's engines take text only")
    if config.get("unsafe_code"):
        reasons.append("unsafe_code: it runs model-written code, which evalrun does not run yet")
    return reasons


def group_reasons(group: Definition, found: Catalog, tasks: Mapping[str, Checked]) -> list[str]:
    """A group loads when lm-eval reads its YAML and every member it names loads."""
    from lm_eval.config.group import GroupConfig
    from lm_eval.tasks._yaml_loader import load_yaml

    assert group.path is not None
    try:
        raw = load_yaml(group.path, resolve_func=True)
        GroupConfig(**{k: v for k, v in raw.items() if k in {f.name for f in dataclasses.fields(GroupConfig)}})
    except (Exception, SystemExit) as error:
        return [f"lm-eval does not read it: {reason_of(error)}"]
    reasons = []
    for member in group.members:
        definition = found.definitions.get(member)
        if definition is None:
            continue  # an inline task or subgroup, defined in the group itself
        leaves = [found.definitions[m] for m in definition.members] if definition.kind == "tag" else [definition]
        for leaf in leaves:
            if leaf.kind == "group":
                failing = group_reasons(leaf, found, tasks)
            else:
                checked = tasks.get(leaf.name)
                failing = list(checked.reasons) if checked is not None else task_reasons(leaf.path or Path())
            if failing:
                reasons.append(f"member {leaf.name} does not load")
    return reasons


def _metric_found(name: str, hf_evaluate: bool) -> bool:
    from lm_eval.api.registry import get_metric

    return get_metric(name, hf_evaluate) is not None


def _as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [] if value is None else [value]


def _member_name(member: Any) -> str:
    if isinstance(member, dict):
        return str(member.get("group") or member.get("task"))
    return str(member)


MISSING_MODULE = re.compile(r"No module named '([^'.]+)")
HELPER_MODULE = re.compile(r"Cannot import module '([^']+)' for function")  # lm-eval's loader's words


def reason_of(error: BaseException) -> str:
    """An exception as one line, the missing package and the lm-eval extra that brings it named where a module
    did not import."""
    cause: BaseException | None = error
    while cause is not None and not isinstance(cause, ModuleNotFoundError):
        cause = cause.__cause__ or cause.__context__
    if isinstance(cause, ModuleNotFoundError):
        module = (cause.name or "").split(".")[0] or next(iter(MISSING_MODULE.findall(str(cause))), "")
        named = HELPER_MODULE.match(str(error))
        if named and named.group(1).split(".")[0] == module:  # the !function's module itself, not what it imports
            return (f"no helper file {named.group(1).replace('.', '/')}.py beside the YAML, and no installed module "
                    f"{named.group(1)!r} [{' '.join(str(error).split())[:300]}]")  # fmt: skip
        if not module:  # a helper's own ImportError, its message saying what to install
            return "a package is not installed: " + " ".join(str(cause).split())[:400]
        package = DISTRIBUTION_OF.get(module, module)
        extras = extras_providing(package)
        brought = (f"lm-eval's extra {' or '.join(extras)} brings it: pip install 'lm-eval[{extras[0]}]'"
                   if extras else "no lm-eval extra brings it")  # fmt: skip
        return f"package {package!r} is not installed; {brought} [{' '.join(str(error).split())[:300]}]"
    text = " ".join(str(error).split()) or type(error).__name__
    return f"{type(error).__name__}: {text}"[:400]


def extras_providing(package: str) -> list[str]:
    """The extras of the installed lm-eval that require ``package`` (normalised as distributions are named)."""
    wanted = _normalised(package)
    extras = set()
    for requirement in importlib.metadata.requires(LM_EVAL) or ():
        name = re.split(r"[\s;<>=!\[~(]", requirement, maxsplit=1)[0]
        marker = re.search(r"""extra\s*==\s*["']([^"']+)["']""", requirement)
        if marker and _normalised(name) == wanted:
            extras.add(marker.group(1))
    return sorted(extras)


def _normalised(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()
