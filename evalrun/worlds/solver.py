"""CP-SAT model and solve of a ``shift-planner`` instance, with settings that make the search repeatable.

Only ``evalrun references build`` and ``check`` use this module; ``ortools`` is imported inside the
functions that need it, so importing evalrun (or running an evaluation) never loads it. Repeatable
search (docs/design.md "Frozen references"): a deterministic time limit (``max_deterministic_time``,
work units, not seconds, so a slower machine stops at the same point), one search worker, a fixed
``random_seed``. The model's hash is the sha256 of its text-format proto, which depends only on the
instance (variables and constraints are added in a fixed order).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from evalrun.records.canonical import sha256_hex
from evalrun.worlds.shift_planner import DAYS, EARLY, LATE, Assignment, Instance


@dataclass(frozen=True)
class SolverSettings:
    """Every CP-SAT parameter the build sets; the rest are the pinned OR-Tools version's defaults."""

    max_deterministic_time: float = 10.0
    num_workers: int = 1
    random_seed: int = 0

    def as_record(self) -> dict[str, Any]:
        return {
            "max_deterministic_time": self.max_deterministic_time,
            "num_workers": self.num_workers,
            "random_seed": self.random_seed,
            "log_search_progress": False,
        }

    @classmethod
    def from_record(cls, record: dict[str, Any]) -> SolverSettings:
        return cls(float(record["max_deterministic_time"]), int(record["num_workers"]), int(record["random_seed"]))


@dataclass(frozen=True)
class Solved:
    status: str  # OPTIMAL, FEASIBLE, INFEASIBLE, MODEL_INVALID, UNKNOWN
    objective: int | None  # None without a solution
    best_bound: float
    solution: list[Assignment]
    parameters_text: str  # the solver's parameters in protobuf text format, as set
    model_sha256: str


def ortools_version() -> str:
    import ortools

    return str(ortools.__version__)


def build_model(instance: Instance) -> tuple[Any, dict[Assignment, Any]]:
    """The CP-SAT model: one boolean per eligible (shift, worker), the rules as linear constraints,
    the cost as the objective."""
    from ortools.sat.python import cp_model

    model = cp_model.CpModel()
    chosen: dict[Assignment, Any] = {}
    for shift in instance.shifts:
        for worker in instance.workers:
            if instance.eligible(shift, worker):
                chosen[(shift.id, worker.id)] = model.new_bool_var(f"x_{shift.id}_{worker.id}")
    for shift in instance.shifts:
        model.add(sum(v for (s, _), v in chosen.items() if s == shift.id) == shift.need)
    for worker in instance.workers:
        mine = {s: v for (s, w), v in chosen.items() if w == worker.id}
        model.add(sum(mine.values()) <= worker.max_shifts)
        for day in DAYS:
            on_day = [v for s, v in mine.items() if _shift_day(instance, s) == day]
            if len(on_day) > 1:
                model.add(sum(on_day) <= 1)
        if instance.rest_rule:
            for late in instance.shifts:
                if late.slot != LATE or late.day == DAYS[-1] or late.id not in mine:
                    continue
                next_day = DAYS[DAYS.index(late.day) + 1]
                for early in instance.shifts:
                    if early.slot == EARLY and early.day == next_day and early.id in mine:
                        model.add(mine[late.id] + mine[early.id] <= 1)
    rates = {w.id: w.rate for w in instance.workers}
    hours = {s.id: s.hours for s in instance.shifts}
    model.minimize(sum(rates[w] * hours[s] * v for (s, w), v in chosen.items()))
    return model, chosen


def _shift_day(instance: Instance, shift_id: str) -> str:
    shift = instance.shift(shift_id)
    assert shift is not None
    return shift.day


def model_sha256(instance: Instance) -> str:
    """sha256 of the instance's model in protobuf text format (deterministic for one OR-Tools version)."""
    model, _ = build_model(instance)
    return sha256_hex(str(model.Proto()))


def solve(instance: Instance, settings: SolverSettings) -> Solved:
    from ortools.sat.python import cp_model

    model, chosen = build_model(instance)
    solver = cp_model.CpSolver()
    solver.parameters.max_deterministic_time = settings.max_deterministic_time
    solver.parameters.num_workers = settings.num_workers
    solver.parameters.random_seed = settings.random_seed
    solver.parameters.log_search_progress = False
    status = solver.status_name(solver.solve(model))
    has_solution = status in ("OPTIMAL", "FEASIBLE")
    solution = sorted(pair for pair, v in chosen.items() if has_solution and solver.boolean_value(v))
    objective = round(solver.objective_value) if has_solution else None
    return Solved(
        status,
        objective,
        float(solver.best_objective_bound),
        solution,
        str(solver.parameters),
        sha256_hex(str(model.Proto())),
    )
