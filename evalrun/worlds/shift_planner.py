"""``shift-planner``: staff a week's shifts at the lowest wage cost, scored against a frozen CP-SAT reference.

Everything is generated from the task seed at reset: 3-5 workers (skills, days available, most
shifts in the week, an hourly rate) and 5-7 shifts (day, early or late slot, hours, the skill
needed, how many workers). The rules, checked by :func:`plan_violations` (the world's own checker,
used by the verifier and by ``evalrun references check``):

- every shift gets exactly ``need`` different workers, each with the shift's skill and available that day;
- nobody works two shifts on one day, nor more than their ``max_shifts`` in the week;
- family ``rest`` only: nobody works a late shift and the next day's early shift.

The cost of a plan is the sum of ``rate * hours`` over its assignments (:func:`plan_cost`). A
feasible plan is planted while generating, so every instance has one. Two families: ``cost`` and
``rest`` (the same rules plus the rest rule).

The reference objective is never computed here: the world reads it at reset from the frozen
reference files (:mod:`evalrun.rundir.references`, docs/design.md "Frozen references") and puts it
in the final state, so the verifier is pure and evaluation never runs a solver. The verifier's
metrics: ``feasible`` (0/1), ``gap`` = (cost - reference) / max(reference, 1), capped at 1.0 (an
infeasible or missing plan scores the cap, so it is never better than a feasible one), and
``pass`` = feasible and gap <= 0 (gap 0 against an OPTIMAL reference).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from evalrun.errors import BadInput
from evalrun.records.canonical import canonical_hash
from evalrun.records.seeds import derive_rng
from evalrun.rundir import references
from evalrun.worlds.base import (
    JSON,
    TODAY,
    Handler,
    ToolError,
    ToolSpec,
    World,
    WorldTask,
    object_schema,
    register_world,
)

NAME = "shift-planner"
COST = "cost"
REST = "rest"
FAMILIES = (COST, REST)
DAYS = ("Mon", "Tue", "Wed", "Thu", "Fri")
EARLY, LATE = "early", "late"
SKILLS = ("till", "stock", "door")
NAMES = ("Ada", "Ben", "Cleo", "Dev", "Eli", "Fay", "Gus", "Hana")
GAP_CAP = 1.0

INTRO = "You plan the shifts of a small shop for one week."
GOAL = (
    "Goal: assign workers to every shift so that all rules hold and the total cost (rate * hours over "
    "all assignments) is as low as possible. Read the workers, shifts and rules first."
)
REST_GOAL = "This week the rest rule applies."
OUTRO = "Submit the plan with submit_plan, once."

Assignment = tuple[str, str]  # (shift id, worker id)


@dataclass(frozen=True)
class Worker:
    id: str
    name: str
    skills: tuple[str, ...]
    days: tuple[str, ...]
    max_shifts: int
    rate: int

    def as_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "name": self.name,
            "skills": list(self.skills),
            "days": list(self.days),
            "max_shifts": self.max_shifts,
            "rate": self.rate,
        }


@dataclass(frozen=True)
class Shift:
    id: str
    day: str
    slot: str
    hours: int
    skill: str
    need: int

    def as_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "day": self.day,
            "slot": self.slot,
            "hours": self.hours,
            "skill": self.skill,
            "need": self.need,
        }


@dataclass(frozen=True)
class Instance:
    """One generated week: what a plan is checked against."""

    family: str
    workers: tuple[Worker, ...]
    shifts: tuple[Shift, ...]

    @property
    def rest_rule(self) -> bool:
        return self.family == REST

    def worker(self, worker_id: str) -> Worker | None:
        return next((w for w in self.workers if w.id == worker_id), None)

    def shift(self, shift_id: str) -> Shift | None:
        return next((s for s in self.shifts if s.id == shift_id), None)

    def eligible(self, shift: Shift, worker: Worker) -> bool:
        return shift.skill in worker.skills and shift.day in worker.days

    def as_json(self) -> dict[str, Any]:
        return {
            "family": self.family,
            "workers": [w.as_json() for w in self.workers],
            "shifts": [s.as_json() for s in self.shifts],
            "rules": rules_json(self.rest_rule),
        }


def rules_json(rest_rule: bool) -> dict[str, Any]:
    rules = [
        "Every shift gets exactly `need` different workers.",
        "A worker on a shift has the shift's skill and is available on its day.",
        "Nobody works two shifts on one day.",
        "Nobody works more than their max_shifts shifts in the week.",
    ]
    if rest_rule:
        rules.append("Rest rule: nobody works a late shift and the early shift of the next day.")
    return {"rules": rules, "rest_rule": rest_rule, "cost": "sum of rate * hours over all assignments"}


def instance_from_json(data: Mapping[str, Any]) -> Instance:
    """The instance a final state or reference file carries; BadInput when it is not one."""
    try:
        workers = tuple(
            Worker(
                str(w["id"]), str(w["name"]), tuple(w["skills"]), tuple(w["days"]), int(w["max_shifts"]), int(w["rate"])
            )
            for w in data["workers"]
        )
        shifts = tuple(
            Shift(str(s["id"]), str(s["day"]), str(s["slot"]), int(s["hours"]), str(s["skill"]), int(s["need"]))
            for s in data["shifts"]
        )
        family = str(data["family"])
    except (KeyError, TypeError, ValueError) as exc:
        raise BadInput("instance", f"not a shift-planner instance: {exc!r}") from None
    return Instance(family, workers, shifts)


def generate_instance(seed: int, family: str) -> Instance:
    """The week of ``seed`` and ``family``. A plan is planted first (each shift's workers drawn among
    those still free that day, and under the rest rule for ``rest``), then skills, days and
    ``max_shifts`` are widened around it, so the instance is always feasible."""
    if family not in FAMILIES:
        raise BadInput("task.family", f"expected one of {FAMILIES}, got {family!r}")
    rng = derive_rng(seed, "world", NAME, family)
    count = rng.randint(3, 5)
    days = DAYS[: rng.randint(3, 5)]
    slots = [(day, slot) for day in days for slot in (EARLY, LATE)]
    picked = sorted(rng.sample(range(len(slots)), min(len(slots), rng.randint(5, 7))))
    shifts: list[Shift] = []
    for number, index in enumerate(picked, start=1):
        day, slot = slots[index]
        need = 2 if rng.random() < 0.25 else 1
        shifts.append(Shift(f"S{number}", day, slot, rng.randint(4, 8), rng.choice(SKILLS), need))

    planted: dict[int, list[str]] = {w: [] for w in range(count)}  # worker -> shift ids
    on_day: dict[tuple[int, str], str] = {}  # (worker, day) -> slot
    for i, shift in enumerate(shifts):
        previous_day = DAYS[DAYS.index(shift.day) - 1] if shift.day != DAYS[0] else None
        free = [
            w
            for w in range(count)
            if (w, shift.day) not in on_day
            and not (family == REST and shift.slot == EARLY and on_day.get((w, previous_day or "")) == LATE)
        ]
        need = min(shift.need, len(free))
        shifts[i] = Shift(shift.id, shift.day, shift.slot, shift.hours, shift.skill, need)
        for w in rng.sample(free, need):
            planted[w].append(shift.id)
            on_day[(w, shift.day)] = shift.slot

    by_id = {s.id: s for s in shifts}
    workers = []
    for w in range(count):
        skills = {by_id[s].skill for s in planted[w]} | set(rng.sample(SKILLS, rng.randint(1, 2)))
        available = {by_id[s].day for s in planted[w]} | set(rng.sample(days, rng.randint(1, len(days))))
        most = max(1, len(planted[w]) + rng.randint(0, 1))
        workers.append(
            Worker(
                f"W{w + 1}",
                NAMES[w],
                tuple(s for s in SKILLS if s in skills),
                tuple(d for d in days if d in available),
                most,
                rng.randint(10, 30),
            )
        )
    return Instance(family, tuple(workers), tuple(shifts))


def plan_violations(instance: Instance, plan: Sequence[Assignment]) -> list[str]:
    """Every rule ``plan`` breaks, as messages (empty: the plan is feasible). The world's own checker."""
    problems: list[str] = []
    for (shift_id, worker_id), times in sorted(Counter(plan).items()):
        if times > 1:
            problems.append(f"{worker_id} is assigned to {shift_id} {times} times")
    worked: dict[str, list[Shift]] = {}
    for shift_id, worker_id in sorted(set(plan)):
        shift, worker = instance.shift(shift_id), instance.worker(worker_id)
        if shift is None or worker is None:
            problems.append(f"unknown {'shift ' + shift_id if shift is None else 'worker ' + worker_id}")
            continue
        if shift.skill not in worker.skills:
            problems.append(f"{worker_id} lacks the skill {shift.skill} of {shift_id}")
        if shift.day not in worker.days:
            problems.append(f"{worker_id} is not available on {shift.day} ({shift_id})")
        worked.setdefault(worker_id, []).append(shift)
    staffed = Counter(shift_id for shift_id, _ in set(plan))
    for shift in instance.shifts:
        if staffed[shift.id] != shift.need:
            problems.append(f"{shift.id} needs {shift.need} worker(s), got {staffed[shift.id]}")
    for worker_id, shifts in sorted(worked.items()):
        worker = instance.worker(worker_id)
        assert worker is not None
        if len(shifts) > worker.max_shifts:
            problems.append(f"{worker_id} works {len(shifts)} shifts, more than max_shifts {worker.max_shifts}")
        days = Counter(s.day for s in shifts)
        problems += [f"{worker_id} works {n} shifts on {day}" for day, n in sorted(days.items()) if n > 1]
        if instance.rest_rule:
            lates = {s.day for s in shifts if s.slot == LATE}
            for s in shifts:
                if s.slot == EARLY and s.day != DAYS[0] and DAYS[DAYS.index(s.day) - 1] in lates:
                    problems.append(f"{worker_id} works the late shift before the early shift {s.id} (rest rule)")
    return problems


def plan_cost(instance: Instance, plan: Sequence[Assignment]) -> int:
    """Sum of rate * hours over the plan's assignments (unknown ids cost nothing; the checker flags them)."""
    total = 0
    for shift_id, worker_id in plan:
        shift, worker = instance.shift(shift_id), instance.worker(worker_id)
        if shift is not None and worker is not None:
            total += worker.rate * shift.hours
    return total


def optimality_gap(cost: int, reference: int) -> float:
    return min(GAP_CAP, (cost - reference) / max(reference, 1))


def parse_plan(value: Any, where: str) -> list[Assignment]:
    try:
        return [(str(pair[0]), str(pair[1])) for pair in value]
    except (TypeError, IndexError, KeyError) as exc:
        raise BadInput(where, f"expected a list of [shift id, worker id] pairs: {exc!r}") from None


def verify_shift_planner(final_state: Mapping[str, Any]) -> dict[str, float]:
    """Feasible, gap (capped at 1.0) and pass of the submitted plan against the frozen reference objective."""
    try:
        instance = instance_from_json(final_state["instance"])
        reference = int(final_state["reference"]["objective"])
        submitted = final_state["submitted"]
    except (KeyError, TypeError, ValueError) as exc:
        raise BadInput("final_state", f"not a shift-planner final state: {exc!r}") from None
    if submitted is None:
        return {"feasible": 0.0, "gap": GAP_CAP, "pass": 0.0}
    plan = parse_plan(submitted, "final_state.submitted")
    if plan_violations(instance, plan):
        return {"feasible": 0.0, "gap": GAP_CAP, "pass": 0.0}
    gap = optimality_gap(plan_cost(instance, plan), reference)
    return {"feasible": 1.0, "gap": gap, "pass": 1.0 if gap <= 0 else 0.0}


def task_text(family: str) -> str:
    return " ".join([INTRO, GOAL, *([REST_GOAL] if family == REST else []), OUTRO])


TOOLS = (
    ToolSpec(
        "list_workers", "All workers: id, name, skills, days available, max_shifts, hourly rate.", object_schema({})
    ),
    ToolSpec(
        "list_shifts", "All shifts: id, day, slot (early/late), hours, skill needed, workers needed.", object_schema({})
    ),
    ToolSpec("get_rules", "The rules a plan must follow and how its cost is counted.", object_schema({})),
    TODAY,
    ToolSpec(
        "submit_plan",
        "Submit the plan: one entry per worker on a shift; ends the episode.",
        object_schema(
            {
                "assignments": {
                    "type": "array",
                    "items": object_schema(
                        {"shift_id": {"type": "string"}, "worker_id": {"type": "string"}}, ["shift_id", "worker_id"]
                    ),
                }
            },
            ["assignments"],
        ),
    ),
)


def reference_item(family: str, seed: int) -> str:
    """The item id (and reference file stem) of an instance: the suite's ``<family>-<seed>``."""
    return f"{family}-{seed}"


@register_world
class ShiftPlanner(World):
    """``shift-planner`` version 1."""

    name: ClassVar[str] = NAME
    version: ClassVar[str] = "1"
    tools_version: ClassVar[str] = "1"
    verifier_version: ClassVar[str] = "1"
    families: ClassVar[tuple[str, ...]] = FAMILIES
    verifier = staticmethod(verify_shift_planner)

    def __init__(self) -> None:
        super().__init__()
        self._instance: Instance | None = None
        self._reference: dict[str, Any] | None = None
        self._submitted: list[Assignment] | None = None

    # -- frozen references

    @classmethod
    def check_references(cls, tasks: Sequence[WorldTask], root: Path | None = None) -> dict[str, str] | None:
        """Every task's frozen reference is there, untouched, and made for the instance the task
        generates (BadInput otherwise); the reference set's record for the manifest."""
        index = references.load_index(cls.name, cls.version, root)
        for task in tasks:
            instance = generate_instance(task.seed, task.family)
            references.load_reference(index, reference_item(task.family, task.seed), canonical_hash(instance.as_json()))
        return index.record()

    # -- World

    def generate(self, task: WorldTask) -> str:
        self._instance = generate_instance(task.seed, task.family)
        index = references.load_index(self.name, self.version)
        stored = references.load_reference(
            index, reference_item(task.family, task.seed), canonical_hash(self._instance.as_json())
        )
        self._reference = {
            "objective": stored["objective"],
            "status": stored["status"],
            "sha256": index.files[reference_item(task.family, task.seed)],
            "index_sha256": index.sha256,
        }
        self._submitted = None
        return task_text(task.family)

    def tools(self) -> list[ToolSpec]:
        return list(TOOLS)

    def handlers(self) -> Mapping[str, Handler]:
        return {
            "list_workers": self.list_workers,
            "list_shifts": self.list_shifts,
            "get_rules": self.get_rules,
            "today": self.today,
            "submit_plan": self.submit_plan,
        }

    def generated(self) -> JSON:
        return {"seed": self.task.seed, "instance": self.instance.as_json(), "reference": self._reference}

    def final_state(self) -> dict[str, Any]:
        return {
            **self.state_identity(),
            "instance": self.instance.as_json(),
            "reference": self._reference,
            "submitted": None if self._submitted is None else [list(pair) for pair in self._submitted],
        }

    @property
    def instance(self) -> Instance:
        if self._instance is None:
            raise RuntimeError("shift-planner: no world before reset")
        return self._instance

    # -- tools

    def list_workers(self) -> JSON:
        return {"workers": [w.as_json() for w in self.instance.workers]}

    def list_shifts(self) -> JSON:
        return {"shifts": [s.as_json() for s in self.instance.shifts]}

    def get_rules(self) -> JSON:
        return rules_json(self.instance.rest_rule)

    def submit_plan(self, assignments: list[dict[str, Any]]) -> JSON:
        if not assignments:
            raise ToolError("an empty plan staffs no shift: give one entry per worker on a shift")
        self._submitted = sorted((str(a["shift_id"]).upper(), str(a["worker_id"]).upper()) for a in assignments)
        self.finish()
        return {"received": len(self._submitted)}
