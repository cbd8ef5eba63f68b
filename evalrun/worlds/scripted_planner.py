"""The scripted agent's policies for ``shift-planner``: read the week, then submit an optimal or a greedy plan.

``plan="optimal"`` searches every plan (branch and bound over the shifts, cheapest choices first,
pruned by a lower bound) with this module's own code, never the world's checker or a solver, so its
gap 0 against the frozen CP-SAT reference cross-checks the reference. ``plan="greedy"`` takes the
shifts most constrained first and gives each its cheapest workers still allowed: on the test split
84 of 100 plans are feasible, 51 of them dearer than the optimum (a positive gap), and the other 16
infeasible where it runs out of workers. Both read the observations only.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from itertools import combinations
from typing import Any, Literal

from evalrun.worlds.actions import Step, ToolCall

PlanKind = Literal["optimal", "greedy"]
PLANS: tuple[PlanKind, ...] = ("optimal", "greedy")
PLANNER_INTRO = "You plan the shifts of a small shop for one week."
READ = ("list_workers", "list_shifts", "get_rules")
WEEK = ("Mon", "Tue", "Wed", "Thu", "Fri")


def is_planner_task(task_text: str) -> bool:
    return task_text.startswith(PLANNER_INTRO)


@dataclass
class _State:
    """What a partial plan has used: shifts per worker, and the (worker, day) pairs worked, early and late."""

    count: dict[str, int] = field(default_factory=dict)
    early: set[tuple[str, str]] = field(default_factory=set)
    late: set[tuple[str, str]] = field(default_factory=set)

    def allows(self, worker: Mapping[str, Any], shift: Mapping[str, Any], rest: bool) -> bool:
        wid, day = worker["id"], shift["day"]
        if shift["skill"] not in worker["skills"] or day not in worker["days"]:
            return False
        if self.count.get(wid, 0) >= worker["max_shifts"] or (wid, day) in self.early | self.late:
            return False
        if not rest or day not in WEEK:
            return True
        index = WEEK.index(day)
        if shift["slot"] == "early":
            return index == 0 or (wid, WEEK[index - 1]) not in self.late
        return index + 1 == len(WEEK) or (wid, WEEK[index + 1]) not in self.early

    def take(self, workers: Sequence[Mapping[str, Any]], shift: Mapping[str, Any], on: bool) -> None:
        slot = self.early if shift["slot"] == "early" else self.late
        for worker in workers:
            wid = worker["id"]
            self.count[wid] = self.count.get(wid, 0) + (1 if on else -1)
            if on:
                slot.add((wid, shift["day"]))
            else:
                slot.discard((wid, shift["day"]))


def _cost(workers: Sequence[Mapping[str, Any]], shift: Mapping[str, Any]) -> int:
    return sum(w["rate"] * shift["hours"] for w in workers)


def optimal_plan(
    workers: Sequence[Mapping[str, Any]], shifts: Sequence[Mapping[str, Any]], rest: bool
) -> list[tuple[str, str]]:
    """A cheapest feasible plan (empty when there is none), by exhaustive branch and bound."""
    options = []
    for shift in shifts:
        eligible = [w for w in workers if shift["skill"] in w["skills"] and shift["day"] in w["days"]]
        combos = sorted(combinations(eligible, shift["need"]), key=lambda c: (_cost(c, shift), [w["id"] for w in c]))
        options.append(combos)
    floor = [min((_cost(c, s) for c in combos), default=0) for s, combos in zip(shifts, options, strict=True)]
    rest_floor = [sum(floor[i:]) for i in range(len(shifts) + 1)]
    best: list[Any] = [None, []]  # cost, plan
    state = _State()
    chosen: list[tuple[str, str]] = []

    def search(i: int, cost: int) -> None:
        if best[0] is not None and cost + rest_floor[i] >= best[0]:
            return
        if i == len(shifts):
            best[0], best[1] = cost, list(chosen)
            return
        shift = shifts[i]
        for combo in options[i]:
            if not all(state.allows(w, shift, rest) for w in combo):
                continue
            state.take(combo, shift, True)
            chosen.extend((shift["id"], w["id"]) for w in combo)
            search(i + 1, cost + _cost(combo, shift))
            del chosen[len(chosen) - len(combo) :]
            state.take(combo, shift, False)

    search(0, 0)
    return sorted(best[1])


def greedy_plan(
    workers: Sequence[Mapping[str, Any]], shifts: Sequence[Mapping[str, Any]], rest: bool
) -> list[tuple[str, str]]:
    """The shifts with the fewest spare eligible workers first, each given its cheapest workers still
    allowed (fewer than needed when they run out)."""

    def slack(shift: Mapping[str, Any]) -> int:
        return sum(1 for w in workers if shift["skill"] in w["skills"] and shift["day"] in w["days"]) - shift["need"]

    state = _State()
    plan = []
    for shift in sorted(shifts, key=slack):  # a stable sort: ties keep the week's order
        allowed = sorted((w for w in workers if state.allows(w, shift, rest)), key=lambda w: (w["rate"], w["id"]))
        picked = allowed[: shift["need"]]
        state.take(picked, shift, True)
        plan += [(shift["id"], w["id"]) for w in picked]
    return sorted(plan)


def planner_policy(task_text: str, history: Sequence[Step], *, plan: PlanKind = "optimal") -> list[ToolCall]:
    """The next calls: read the week (today, workers, shifts, rules in one turn), then submit the plan."""
    seen: dict[str, Any] = {}
    for step in history:
        for call, result in zip(step.calls, step.results, strict=True):
            if result.status == "ok":
                seen[call.name] = result.content
    if not history:
        return [ToolCall("today"), *(ToolCall(name) for name in READ)]
    if not all(name in seen for name in READ):
        return [ToolCall(name) for name in READ if name not in seen]
    workers, shifts = seen["list_workers"]["workers"], seen["list_shifts"]["shifts"]
    rest = bool(seen["get_rules"]["rest_rule"])
    pairs = optimal_plan(workers, shifts, rest) if plan == "optimal" else greedy_plan(workers, shifts, rest)
    return [ToolCall("submit_plan", {"assignments": [{"shift_id": s, "worker_id": w} for s, w in pairs]})]
