"""A world's reference sets for ``evalrun references build`` and ``check`` (docs/design.md "Frozen references"):
CP-SAT reference solutions for a planning world (shift-planner), or the ground truth a world's own code
computes (invoice-desk, status COMPUTED), frozen and re-validated without trusting them.

A reference file records the instance (family, seed, item, the instance's canonical hash, the CP-SAT
model's hash), the solver (OR-Tools version, every parameter set), and the result (status,
objective, best bound, the solution). A build refuses a status other than OPTIMAL unless
``allow_feasible`` (then a FEASIBLE reference records why it was accepted); no solution at all is
always refused. The check recomputes everything it can from the world's own code: instance hash,
model hash, feasibility under the world's checker, the objective; ``resolve`` solves again with the
recorded settings and compares status and objective.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from evalrun.errors import BadInput, CheckFailed
from evalrun.records.canonical import canonical_hash, sha256_hex
from evalrun.rundir import references
from evalrun.worlds.base import World, WorldTask, world_class
from evalrun.worlds.shift_planner import (
    NAME,
    Instance,
    generate_instance,
    parse_plan,
    plan_cost,
    plan_violations,
    reference_item,
)
from evalrun.worlds.solver import Solved, SolverSettings, model_sha256, ortools_version, solve

DEFAULT_SETTINGS = SolverSettings()
SOLVER_WORLDS = (NAME,)  # worlds whose references a solver computes
BOUND_TOLERANCE = 1e-9  # CP-SAT reports the bound as a double (e.g. 424.99999999999994 for 425), stored as given


@dataclass(frozen=True)
class Problem:
    """One way a stored reference is wrong: which instance (item, or the index), which field, what."""

    item: str
    field: str
    message: str

    def line(self) -> str:
        return f"{self.item}: {self.field}: {self.message}"

    def as_json(self) -> dict[str, str]:
        return {"item": self.item, "field": self.field, "message": self.message}


def _check_world(name: str, version: str) -> bool:
    """True for a world whose references a solver computes, False for one whose own code does
    (:meth:`World.frozen_reference`); BadInput for an unknown world or one without references."""
    cls = world_class(name, version)  # BadInput naming the known worlds
    if name in SOLVER_WORLDS:
        return True
    if cls.frozen_reference is World.frozen_reference:
        raise BadInput("world", f"{name} has no frozen references")
    return False


def reference_record(
    task: WorldTask, instance: Instance, solved: Solved, settings: SolverSettings, accepted: str | None
) -> dict[str, Any]:
    return {
        "format": references.REFERENCE_FORMAT,
        "world": {"name": task.world, "version": task.version},
        "family": task.family,
        "seed": task.seed,
        "item": reference_item(task.family, task.seed),
        "instance_sha256": canonical_hash(instance.as_json()),
        "model_sha256": solved.model_sha256,
        "solver": {
            "name": "cp-sat",
            "ortools": ortools_version(),
            "parameters": settings.as_record(),
            "parameters_text": solved.parameters_text,
        },
        "status": solved.status,
        "objective": solved.objective,
        "best_bound": solved.best_bound,
        "solution": [list(pair) for pair in solved.solution],
        "accepted": accepted,  # None for OPTIMAL; why a FEASIBLE reference was frozen all the same
    }


@dataclass(frozen=True)
class BuildReport:
    index: references.ReferenceIndex
    statuses: dict[str, str]  # item -> status

    def as_json(self) -> dict[str, Any]:
        return {
            "references": self.index.record(),
            "directory": str(self.index.directory),
            "built": len(self.statuses),
            "statuses": self.statuses,
        }


def build_references(
    tasks: Sequence[WorldTask],
    settings: SolverSettings = DEFAULT_SETTINGS,
    allow_feasible: bool = False,
    root: Path | None = None,
) -> BuildReport:
    """Solve every task's instance and freeze the results. Nothing is written when one is refused."""
    if not tasks:
        raise BadInput("task.world", "no world tasks to build references for")
    name, version = tasks[0].world, tasks[0].version
    if not _check_world(name, version):  # a ground truth the world computes: frozen as it is now
        cls = world_class(name, version)
        computed = {task.item_id: cls.frozen_reference(task) for task in tasks}
        index = references.write_set(name, version, computed, root)
        return BuildReport(index, dict.fromkeys(sorted(computed), "COMPUTED"))
    records: dict[str, Any] = {}
    refused: list[str] = []
    for task in tasks:
        instance = generate_instance(task.seed, task.family)
        solved = solve(instance, settings)
        item = reference_item(task.family, task.seed)
        accepted = None
        if solved.status != "OPTIMAL":
            if solved.status != "FEASIBLE" or not allow_feasible:
                refused.append(f"{item}: {solved.status}")
                continue
            accepted = (
                f"--allow-feasible: status FEASIBLE after max_deterministic_time "
                f"{settings.max_deterministic_time}, best bound {solved.best_bound}"
            )
        records[item] = reference_record(task, instance, solved, settings, accepted)
    if refused:
        raise CheckFailed(
            f"refusing to freeze references that are not OPTIMAL ({len(refused)}): "
            f"{'; '.join(refused[:5])} (--allow-feasible freezes FEASIBLE ones, saying why)"
        )
    index = references.write_set(name, version, records, root)
    return BuildReport(index, {item: r["status"] for item, r in sorted(records.items())})


@dataclass(frozen=True)
class CheckReport:
    index: references.ReferenceIndex
    checked: int
    resolved: bool
    problems: tuple[Problem, ...]

    def as_json(self) -> dict[str, Any]:
        return {
            "references": self.index.record(),
            "checked": self.checked,
            "resolved": self.resolved,
            "problems": [p.as_json() for p in self.problems],
        }


def check_reference_set(name: str, version: str, resolve: bool = False, root: Path | None = None) -> CheckReport:
    """Re-validate every reference the index lists; a BadInput for an unknown world or a missing set."""
    solved = _check_world(name, version)
    index = references.load_index(name, version, root)
    problems: list[Problem] = []
    for item in sorted(index.files):
        problems += _check_one(index, item, resolve) if solved else _check_computed(index, item)
    return CheckReport(index, len(index.files), resolve, tuple(problems))


def _check_one(index: references.ReferenceIndex, item: str, resolve: bool) -> list[Problem]:
    path = index.path(item)
    try:
        data = path.read_bytes()
    except OSError as exc:
        return [Problem(item, "file", f"{path} unreadable ({exc})")]
    problems = []
    if sha256_hex(data) != index.files[item]:
        problems.append(
            Problem(item, "sha256", f"the file's {sha256_hex(data)} differs from the index's {index.files[item]}")
        )
    try:
        record = references.read_json(path, "reference")[1]
        family, seed = str(record["family"]), int(record["seed"])
    except (BadInput, KeyError, TypeError, ValueError) as exc:
        return [*problems, Problem(item, "family/seed", f"not a reference file: {exc}")]

    def expect(field: str, got: Any, wanted: Any) -> None:
        if got != wanted:
            problems.append(Problem(item, field, f"stored {got!r}, recomputed {wanted!r}"))

    expect("format", record.get("format"), references.REFERENCE_FORMAT)
    expect("world", record.get("world"), {"name": index.name, "version": index.version})
    expect("item", record.get("item"), reference_item(family, seed))
    expect("item", item, reference_item(family, seed))
    instance = generate_instance(seed, family)
    expect("instance_sha256", record.get("instance_sha256"), canonical_hash(instance.as_json()))
    expect("model_sha256", record.get("model_sha256"), model_sha256(instance))
    try:
        plan = parse_plan(record.get("solution"), "solution")
    except BadInput as exc:
        return [*problems, Problem(item, "solution", exc.message)]
    problems += [Problem(item, "solution", f"infeasible: {v}") for v in plan_violations(instance, plan)]
    expect("objective", record.get("objective"), plan_cost(instance, plan))
    status, bound = record.get("status"), record.get("best_bound")
    if status not in ("OPTIMAL", "FEASIBLE"):
        problems.append(Problem(item, "status", f"{status!r} is not a frozen status (OPTIMAL, FEASIBLE)"))
    elif status == "FEASIBLE" and not record.get("accepted"):
        problems.append(Problem(item, "accepted", "a FEASIBLE reference must record why it was accepted"))
    objective = record.get("objective")
    if not isinstance(bound, int | float) or not isinstance(objective, int):
        problems.append(Problem(item, "best_bound", f"expected numbers, got bound {bound!r}, objective {objective!r}"))
    elif status == "OPTIMAL" and abs(bound - objective) > BOUND_TOLERANCE * max(1, abs(objective)):
        problems.append(Problem(item, "best_bound", f"{bound!r} does not prove the objective {objective} optimal"))
    elif bound > objective + BOUND_TOLERANCE * max(1, abs(objective)):
        problems.append(Problem(item, "best_bound", f"{bound!r} is above the objective {objective}"))
    if resolve:
        problems += _resolve(item, record, instance)
    return problems


def _check_computed(index: references.ReferenceIndex, item: str) -> list[Problem]:
    """A ground-truth reference: its file hash, and every field against what the world's code computes now."""
    path = index.path(item)
    try:
        data, record = references.read_json(path, "reference")
        task = WorldTask(index.name, index.version, str(record["family"]), int(record["seed"]), item,
                         str(record["start"]))  # fmt: skip
    except (BadInput, KeyError, TypeError, ValueError) as exc:
        return [Problem(item, "file", f"not a reference file: {exc}")]
    problems = []
    if sha256_hex(data) != index.files[item]:
        problems.append(
            Problem(item, "sha256", f"the file's {sha256_hex(data)} differs from the index's {index.files[item]}")
        )
    recomputed = world_class(index.name, index.version).frozen_reference(task) or {}
    for field in sorted(set(record) | set(recomputed)):
        if record.get(field) != recomputed.get(field):
            problems.append(Problem(item, field, f"stored {record.get(field)!r}, recomputed {recomputed.get(field)!r}"))
    return problems


def _resolve(item: str, record: dict[str, Any], instance: Instance) -> list[Problem]:
    """Solve again with the recorded settings: the same status and objective, else a problem."""
    try:
        settings = SolverSettings.from_record(record["solver"]["parameters"])
    except (KeyError, TypeError, ValueError) as exc:
        return [Problem(item, "solver.parameters", f"unusable: {exc!r}")]
    problems = []
    if record["solver"].get("ortools") != ortools_version():
        problems.append(
            Problem(
                item,
                "solver.ortools",
                f"frozen with {record['solver'].get('ortools')}, re-solving with {ortools_version()}",
            )
        )
    solved = solve(instance, settings)
    for field, got in (("status", solved.status), ("objective", solved.objective)):
        if record.get(field) != got:
            problems.append(Problem(item, field, f"stored {record.get(field)!r}, re-solved {got!r}"))
    return problems


def raise_problems(report: CheckReport) -> None:
    """CheckFailed naming each instance and field, when the check found problems."""
    if report.problems:
        lines = "; ".join(p.line() for p in report.problems[:10])
        more = f" (and {len(report.problems) - 10} more)" if len(report.problems) > 10 else ""
        raise CheckFailed(f"{len(report.problems)} problem(s) in {report.index.directory}: {lines}{more}")
