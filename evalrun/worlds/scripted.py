"""``agent=scripted``: a deterministic reference policy for ``invoice-desk`` (``shift-planner``: see
:mod:`evalrun.worlds.scripted_planner`; ``support-desk``: :mod:`evalrun.worlds.scripted_support`), and a driver
to run it.

The policy is a pure function of what an agent sees, the task text and the turns so far, so it can
stand in for a model anywhere (the harness, replay tests) and its episodes are training transcripts
for a tiny chat model. It solves both families with the fewest turns: ``today`` and
``list_invoices``; every invoice (parallel calls); for price differences every purchase order
(parallel calls); then the report. It works out the answer from the observations with its own
code, not the world's, so a disagreement between the two shows up as a failed episode.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from evalrun.worlds.actions import MAX_CALLS, Step, ToolCall
from evalrun.worlds.base import Effects, World, WorldTask
from evalrun.worlds.guard import world_guard
from evalrun.worlds.invoice_desk import DUPLICATES, GOALS, PRICE_DIFFERENCES
from evalrun.worlds.scripted_planner import PlanKind, is_planner_task, planner_policy
from evalrun.worlds.scripted_support import is_support_task, support_policy

Policy = Callable[[str, Sequence[Step]], list[ToolCall]]
MAX_STEPS = 12


def task_family(task_text: str) -> str:
    """The invoice-desk family a task text asks about (its goal sentence)."""
    for family, goal in GOALS.items():
        if goal in task_text:
            return family
    raise ValueError("not an invoice-desk task: no known goal in the task text")


def _seen(history: Sequence[Step]) -> tuple[set[str], list[str] | None, dict[str, Any], dict[str, Any]]:
    """Tools called (with their main argument), invoice ids listed, invoices and POs fetched."""
    asked: set[str] = set()
    listed: list[str] | None = None
    invoices: dict[str, Any] = {}
    orders: dict[str, Any] = {}
    for step in history:
        for call, result in zip(step.calls, step.results, strict=True):
            args = call.arguments
            asked.add(f"{call.name}:{args.get('invoice_id', args.get('po_id', ''))}")
            if result.status != "ok":
                continue
            if call.name == "list_invoices":
                listed = [row["id"] for row in result.content["invoices"]]
            elif call.name == "get_invoice":
                invoices[result.content["id"]] = result.content
            elif call.name == "get_purchase_order":
                orders[result.content["id"]] = result.content
    return asked, listed, invoices, orders


def _number(invoice_id: str) -> int:
    digits = "".join(ch for ch in invoice_id if ch.isdigit())
    return int(digits or 0)


def repeated_lines(invoices: Mapping[str, Any]) -> list[tuple[str, int]]:
    """Lines whose (po, sku, qty, price) was billed before, in invoice then line order."""
    seen: set[str] = set()
    found = []
    for invoice_id in sorted(invoices, key=_number):
        invoice = invoices[invoice_id]
        for line in sorted(invoice["lines"], key=lambda ln: ln["line"]):
            key = json.dumps([invoice["po"], line["sku"], line["qty"], line["price"]])
            if key in seen:
                found.append((invoice_id, line["line"]))
            seen.add(key)
    return found


def lines_above_agreed(invoices: Mapping[str, Any], orders: Mapping[str, Any]) -> list[tuple[str, int]]:
    """Lines billed above the price their purchase order agrees for the sku."""
    found = []
    for invoice_id in sorted(invoices, key=_number):
        invoice = invoices[invoice_id]
        agreed = {ln["sku"]: ln["price"] for ln in orders.get(invoice["po"], {}).get("lines", [])}
        for line in invoice["lines"]:
            if line["sku"] in agreed and line["price"] > agreed[line["sku"]]:
                found.append((invoice_id, line["line"]))
    return found


def _report(refs: Sequence[tuple[str, int]]) -> list[ToolCall]:
    return [ToolCall("submit_report", {"lines": [{"invoice_id": i, "line_no": n} for i, n in refs]})]


def scripted_policy(task_text: str, history: Sequence[Step], *, ask_vendor: bool = False,
                    plan: PlanKind = "optimal") -> list[ToolCall]:  # fmt: skip
    """The next calls. ``ask_vendor=True`` asks the vendor about the first flagged line before
    reporting (one more turn, and a random draw of the simulated person to record). A shift-planner
    task goes to :func:`~evalrun.worlds.scripted_planner.planner_policy` with ``plan``, a support-desk task to
    :func:`~evalrun.worlds.scripted_support.support_policy`."""
    if is_planner_task(task_text):
        return planner_policy(task_text, history, plan=plan)
    if is_support_task(task_text):
        return support_policy(task_text, history)
    family = task_family(task_text)
    asked, listed, invoices, orders = _seen(history)
    if "list_invoices:" not in asked:
        return [ToolCall("today"), ToolCall("list_invoices")]
    if listed is None:
        return _report([])  # nothing to go on: report nothing rather than loop
    missing = [i for i in listed if f"get_invoice:{i}" not in asked]
    if missing:
        return [ToolCall("get_invoice", {"invoice_id": i}) for i in missing[:MAX_CALLS]]
    if family == PRICE_DIFFERENCES:
        pos = sorted({inv["po"] for inv in invoices.values()} - set(orders))
        pos = [po for po in pos if f"get_purchase_order:{po}" not in asked]
        if pos:
            return [ToolCall("get_purchase_order", {"po_id": po}) for po in pos[:MAX_CALLS]]
    flagged = repeated_lines(invoices) if family == DUPLICATES else lines_above_agreed(invoices, orders)
    if ask_vendor and flagged and "ask_vendor:" not in asked:
        invoice_id, line_no = flagged[0]
        invoice = invoices[invoice_id]
        sku = next(ln["sku"] for ln in invoice["lines"] if ln["line"] == line_no)
        question = f"Is line {line_no} of {invoice_id} ({sku}) billed correctly?"
        return [ToolCall("ask_vendor", {"vendor": invoice["vendor"], "question": question})]
    return _report(flagged)


@dataclass(frozen=True)
class Transcript:
    """A whole episode: the task, what the agent was told, every turn, the final state and scores."""

    task: WorldTask
    task_text: str
    steps: tuple[Step, ...]
    final_state: dict[str, Any]
    scores: dict[str, float]
    world_hash: str
    versions: dict[str, str]

    def as_json(self) -> dict[str, Any]:
        return {
            "task": self.task.as_json(),
            "task_text": self.task_text,
            "steps": [step.as_json() for step in self.steps],
            "final_state": self.final_state,
            "scores": self.scores,
            "world_hash": self.world_hash,
            "versions": self.versions,
        }


def run_scripted(
    world: World, task: WorldTask, effects: Effects, policy: Policy = scripted_policy, max_steps: int = MAX_STEPS
) -> Transcript:
    """Run one episode of ``policy`` in ``world``, calls in order, under the world guard.

    A simple driver for tests and transcripts; the harness records episodes its own way."""
    steps: list[Step] = []
    with world_guard():
        text = world.reset(task, effects)
        while not world.done and len(steps) < max_steps:
            calls = policy(text, steps)
            results = tuple(world.call(call.name, dict(call.arguments)) for call in calls)
            steps.append(Step(tuple(calls), results))
    final = world.final_state()
    return Transcript(
        task, text, tuple(steps), final, type(world).verifier(final), world.world_hash(), world.versions()
    )
