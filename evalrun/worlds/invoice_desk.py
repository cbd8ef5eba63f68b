"""``invoice-desk``: an accounts-payable desk with vendors, purchase orders and invoices to check.

Everything is generated from the task seed at reset: 2-3 vendors (each with a contact person and
one purchase order of 2-4 agreed lines), 3-5 invoices of 1-4 lines, dated before the task's start
and numbered in date order. Two families:

- ``duplicates``: some lines are billed twice: a line with the same PO, sku, qty and price as an
  earlier line (an earlier invoice, or above it in the same invoice). The answer is the repeats.
- ``price-differences``: some lines are billed above the unit price agreed in the PO.

Noise that is not an answer: the same sku billed again with another quantity (a partial delivery)
and lines billed *below* the agreed price (a discount). The ground truth is computed from the
generated data by the family's rule (:func:`duplicated_lines`, :func:`overpriced_lines`), so the
noise can never make it disagree with the task text; each task has 1-3 answer lines.

The world is kept small so a whole episode fits the context of a tiny model: short ids, integer
prices, compact observations. Version "2" differs in one observable way: ``get_invoice`` also
returns the invoice currency, read from the world's environment (``currency``, default EUR).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import date, timedelta
from random import Random
from typing import Any, ClassVar

from evalrun.errors import BadInput
from evalrun.records.canonical import canonical_hash
from evalrun.records.seeds import derive_rng
from evalrun.rundir import references
from evalrun.worlds.base import (
    JSON,
    TODAY,
    ComputedReferences,
    Handler,
    ToolError,
    ToolSpec,
    World,
    WorldTask,
    format_date,
    object_schema,
    register_world,
    set_scores,
)

NAME = "invoice-desk"
DUPLICATES = "duplicates"
PRICE_DIFFERENCES = "price-differences"
FAMILIES = (DUPLICATES, PRICE_DIFFERENCES)

INTRO = "You check a vendor's invoices at an accounts-payable desk. Invoices are numbered in date order."
GOALS = {
    DUPLICATES: (
        "Goal: find the invoice lines billed twice: a line with the same po, sku, qty and price as an earlier "
        "line (in an earlier invoice, or above it in the same invoice). Report only the repeats."
    ),
    PRICE_DIFFERENCES: "Goal: find the invoice lines whose price is above the price agreed in their purchase order.",
}
OUTRO = "Report them with submit_report, once."

VENDORS = (
    ("Acme", "Dana Reyes"),
    ("Borel", "Tom Hill"),
    ("Cato", "Mia Lund"),
    ("Dorn", "Raj Patel"),
    ("Elko", "Ana Ruiz"),
    ("Fenn", "Lee Wong"),
)
CATALOGUE = (  # sku, description, lowest and highest agreed unit price
    ("BOLT", "hex bolt M8", 2, 9),
    ("NUT", "hex nut M8", 1, 5),
    ("PIPE", "steel pipe 1m", 12, 40),
    ("TAPE", "duct tape", 3, 9),
    ("GLUE", "wood glue", 4, 12),
    ("SAW", "hand saw", 15, 45),
    ("WIRE", "copper wire 10m", 20, 60),
    ("LAMP", "work lamp", 25, 80),
    ("FAN", "desk fan", 18, 50),
    ("DRILL", "drill bit set", 10, 35),
)
GREETINGS = ("Hi, {first} here.", "Hello, {first} from {vendor}.", "{first} here, thanks for asking.")
CLOSINGS = ("", " Best regards.", " Let me know if anything else is unclear.")
MAX_LINES = 4


@dataclass(frozen=True)
class Line:
    line: int
    sku: str
    qty: int
    price: int


@dataclass
class Invoice:
    id: str
    vendor: str
    po: str
    date: str
    lines: list[Line]

    @property
    def total(self) -> int:
        return sum(line.qty * line.price for line in self.lines)


@dataclass(frozen=True)
class PoLine:
    sku: str
    desc: str
    qty: int
    price: int


@dataclass(frozen=True)
class PurchaseOrder:
    id: str
    vendor: str
    lines: tuple[PoLine, ...]

    def price(self, sku: str) -> int | None:
        return next((line.price for line in self.lines if line.sku == sku), None)


@dataclass(frozen=True)
class Vendor:
    name: str
    contact: str
    po: str


@dataclass(frozen=True)
class Desk:
    """One generated world: vendors, their purchase orders, the invoices."""

    vendors: tuple[Vendor, ...]
    orders: tuple[PurchaseOrder, ...]
    invoices: tuple[Invoice, ...]

    def order(self, po_id: str) -> PurchaseOrder | None:
        return next((po for po in self.orders if po.id == po_id), None)

    def as_json(self) -> JSON:
        return {
            "vendors": [{"name": v.name, "contact": v.contact, "po": v.po} for v in self.vendors],
            "purchase_orders": [purchase_order_json(po) for po in self.orders],
            "invoices": [invoice_json(inv) for inv in self.invoices],
        }


LineRef = tuple[str, int]  # (invoice id, line number)


def invoice_number(invoice_id: str) -> int:
    return int(invoice_id[1:])


def duplicated_lines(invoices: Sequence[Invoice]) -> list[LineRef]:
    """The repeats: every line whose (po, sku, qty, price) occurred earlier (invoice order, then line order)."""
    seen: set[tuple[str, str, int, int]] = set()
    repeats: list[LineRef] = []
    for invoice in sorted(invoices, key=lambda inv: invoice_number(inv.id)):
        for line in sorted(invoice.lines, key=lambda ln: ln.line):
            key = (invoice.po, line.sku, line.qty, line.price)
            if key in seen:
                repeats.append((invoice.id, line.line))
            seen.add(key)
    return repeats


def overpriced_lines(invoices: Sequence[Invoice], orders: Sequence[PurchaseOrder]) -> list[LineRef]:
    """Lines billed above their PO's agreed price (a sku not on the PO has no agreed price: not counted)."""
    by_id = {po.id: po for po in orders}
    flagged: list[LineRef] = []
    for invoice in sorted(invoices, key=lambda inv: invoice_number(inv.id)):
        for line in invoice.lines:
            agreed = by_id[invoice.po].price(line.sku) if invoice.po in by_id else None
            if agreed is not None and line.price > agreed:
                flagged.append((invoice.id, line.line))
    return flagged


def ground_truth(family: str, desk: Desk) -> list[LineRef]:
    if family == DUPLICATES:
        return duplicated_lines(desk.invoices)
    return overpriced_lines(desk.invoices, desk.orders)


def generate_desk(seed: int, family: str, start: date) -> Desk:
    """The world of ``seed`` and ``family``; the same for every version of the world (versions differ in
    how they present it). Base lines are unique by (po, sku, qty, price); the family's answers are
    injected after, so the truth has exactly the injected 1-3 lines."""
    rng = derive_rng(seed, "world", NAME, family)
    picked = rng.sample(VENDORS, rng.randint(2, 3))
    orders: list[PurchaseOrder] = []
    vendors: list[Vendor] = []
    for number, (name, contact) in enumerate(picked, start=1):
        items = rng.sample(CATALOGUE, rng.randint(2, 4))
        lines = tuple(PoLine(sku, desc, rng.randint(2, 8) * 5, rng.randint(lo, hi)) for sku, desc, lo, hi in items)
        orders.append(PurchaseOrder(f"P{number}", name, lines))
        vendors.append(Vendor(name, contact, f"P{number}"))

    count = rng.randint(3, 5)
    owners = [*range(len(vendors)), *(rng.randrange(len(vendors)) for _ in range(count - len(vendors)))]
    rng.shuffle(owners)
    days = sorted(rng.sample(range(28), count))
    seen: set[tuple[str, str, int, int]] = set()
    invoices: list[Invoice] = []
    for number, (owner, day) in enumerate(zip(owners, days, strict=True), start=1):
        po = orders[owner]
        items = rng.sample(po.lines, rng.randint(1, min(3, len(po.lines))))
        lines = []
        for item in items:
            price = item.price
            if item.price > 2 and rng.random() < 0.2:  # noise: a discount is not an error
                price = item.price - rng.randint(1, max(1, item.price // 10))
            qty = rng.randint(1, 9)
            while (po.id, item.sku, qty, price) in seen:  # noise must not make duplicates by chance
                qty = rng.randint(1, 9)
            seen.add((po.id, item.sku, qty, price))
            lines.append(Line(len(lines) + 1, item.sku, qty, price))
        when = (start - timedelta(days=28 - day)).isoformat()
        invoices.append(Invoice(f"I{number}", po.vendor, po.id, when, lines))

    answers = rng.randint(1, 3)
    if family == DUPLICATES:
        _inject_duplicates(rng, invoices, answers)
    else:
        _inject_overprices(rng, invoices, orders, answers)
    desk = Desk(tuple(vendors), tuple(orders), tuple(invoices))
    truth = ground_truth(family, desk)
    assert len(truth) == answers, f"seed {seed}: {len(truth)} answer lines, {answers} injected"
    return desk


def _inject_duplicates(rng: Random, invoices: list[Invoice], count: int) -> None:
    for _ in range(count):
        target = rng.choice([i for i, inv in enumerate(invoices) if len(inv.lines) < MAX_LINES])
        po = invoices[target].po
        sources = [line for inv in invoices[: target + 1] if inv.po == po for line in inv.lines]
        source = rng.choice(sources)
        lines = invoices[target].lines
        lines.append(Line(len(lines) + 1, source.sku, source.qty, source.price))


def _inject_overprices(rng: Random, invoices: list[Invoice], orders: list[PurchaseOrder], count: int) -> None:
    by_id = {po.id: po for po in orders}
    places = [(i, j) for i, inv in enumerate(invoices) for j in range(len(inv.lines))]
    for i, j in sorted(rng.sample(places, count)):
        line = invoices[i].lines[j]
        agreed = by_id[invoices[i].po].price(line.sku)
        assert agreed is not None
        invoices[i].lines[j] = Line(line.line, line.sku, line.qty, agreed + rng.randint(1, max(1, agreed // 5)))


def invoice_summary(invoice: Invoice) -> JSON:
    return {"id": invoice.id, "vendor": invoice.vendor, "date": invoice.date, "total": invoice.total}


def invoice_json(invoice: Invoice) -> dict[str, Any]:
    return {
        "id": invoice.id,
        "vendor": invoice.vendor,
        "po": invoice.po,
        "date": invoice.date,
        "lines": [{"line": ln.line, "sku": ln.sku, "qty": ln.qty, "price": ln.price} for ln in invoice.lines],
    }


def purchase_order_json(po: PurchaseOrder) -> dict[str, Any]:
    return {
        "id": po.id,
        "vendor": po.vendor,
        "lines": [{"sku": ln.sku, "desc": ln.desc, "qty": ln.qty, "price": ln.price} for ln in po.lines],
    }


def task_text(family: str) -> str:
    return f"{INTRO} {GOALS[family]} {OUTRO}"


def _string(description: str) -> dict[str, str]:
    return {"type": "string", "description": description}


TOOLS = (
    ToolSpec("list_invoices", "All invoices: id, vendor, date, total.", object_schema({})),
    ToolSpec(
        "search_invoices",
        "Invoices of a vendor and/or with a line of a sku (give at least one).",
        object_schema({"vendor": _string("vendor name"), "sku": _string("sku")}),
    ),
    ToolSpec(
        "get_invoice",
        "One invoice: vendor, po, date and lines (line, sku, qty, price).",
        object_schema({"invoice_id": _string("invoice id, e.g. I1")}, ["invoice_id"]),
    ),
    ToolSpec(
        "get_purchase_order",
        "One purchase order: vendor and agreed lines (sku, desc, qty, price).",
        object_schema({"po_id": _string("purchase order id, e.g. P1")}, ["po_id"]),
    ),
    ToolSpec(
        "ask_vendor",
        "Ask a vendor's contact person a question (mention invoice ids or skus).",
        object_schema({"vendor": _string("vendor name"), "question": _string("your question")}, ["vendor", "question"]),
    ),
    TODAY,
    ToolSpec(
        "submit_report",
        "Submit the flagged invoice lines; ends the episode.",
        object_schema(
            {
                "lines": {
                    "type": "array",
                    "items": object_schema(
                        {"invoice_id": {"type": "string"}, "line_no": {"type": "integer"}}, ["invoice_id", "line_no"]
                    ),
                }
            },
            ["lines"],
        ),
    ),
)


def verify_invoice_desk(final_state: Mapping[str, Any]) -> dict[str, float]:
    """Precision, recall, F1 and pass of the submitted lines against the truth (module-level, pure)."""
    try:
        truth = [(str(ref[0]), int(ref[1])) for ref in final_state["truth"]]
        submitted = final_state["submitted"]
        got = None if submitted is None else [(str(ref[0]), int(ref[1])) for ref in submitted]
    except (KeyError, TypeError, ValueError, IndexError) as exc:
        raise BadInput("final_state", f"not an invoice-desk final state: {exc!r}") from None
    return set_scores(got, truth)


def truth_reference(task: WorldTask) -> dict[str, Any]:
    """The frozen ground truth of ``task``: the lines its family's rule flags in the world its seed
    and start date generate, with the hash of that world (docs/design.md "Frozen references")."""
    desk = generate_desk(task.seed, task.family, date.fromisoformat(format_date(task.start_seconds)))
    return {
        "format": references.REFERENCE_FORMAT,
        "world": {"name": NAME, "version": task.version},
        "family": task.family,
        "seed": task.seed,
        "item": task.item_id,
        "start": task.start,
        "instance_sha256": canonical_hash(desk.as_json()),
        "truth": [list(ref) for ref in ground_truth(task.family, desk)],
    }


@register_world
class InvoiceDesk(ComputedReferences, World):
    """``invoice-desk`` version 1."""

    name: ClassVar[str] = NAME
    version: ClassVar[str] = "1"
    tools_version: ClassVar[str] = "1"
    verifier_version: ClassVar[str] = "1"
    families: ClassVar[tuple[str, ...]] = FAMILIES
    verifier = staticmethod(verify_invoice_desk)
    concurrent_tools: ClassVar[frozenset[str]] = frozenset(
        {"list_invoices", "search_invoices", "get_invoice", "get_purchase_order", "ask_vendor", "today"}
    )  # all but submit_report, which ends the episode

    reference_key: ClassVar[str] = "truth"
    compute_reference = staticmethod(truth_reference)

    def __init__(self) -> None:
        super().__init__()
        self._desk: Desk | None = None
        self._truth: list[LineRef] = []
        self._submitted: list[LineRef] | None = None
        self._report_id: str | None = None

    # -- World

    def generate(self, task: WorldTask) -> str:
        start = date.fromisoformat(format_date(task.start_seconds))
        self._desk = generate_desk(task.seed, task.family, start)
        self._truth = ground_truth(task.family, self._desk)
        self._submitted = self._report_id = None
        return task_text(task.family)

    def tools(self) -> list[ToolSpec]:
        return list(TOOLS)

    def handlers(self) -> Mapping[str, Handler]:
        return {
            "list_invoices": self.list_invoices,
            "search_invoices": self.search_invoices,
            "get_invoice": self.get_invoice,
            "get_purchase_order": self.get_purchase_order,
            "ask_vendor": self.ask_vendor,
            "today": self.today,
            "submit_report": self.submit_report,
        }

    def generated(self) -> JSON:
        return {"family": self.task.family, "seed": self.task.seed, **self.desk.as_json(), "truth": self._truth}

    def final_state(self) -> dict[str, Any]:
        return {
            **self.state_identity(),
            "truth": [list(ref) for ref in self._truth],
            "submitted": None if self._submitted is None else [list(ref) for ref in self._submitted],
            "report_id": self._report_id,
        }

    @property
    def desk(self) -> Desk:
        if self._desk is None:
            raise RuntimeError("invoice-desk: no world before reset")
        return self._desk

    # -- tools

    def list_invoices(self) -> JSON:
        return {"invoices": [invoice_summary(inv) for inv in self.desk.invoices]}

    def search_invoices(self, vendor: str | None = None, sku: str | None = None) -> JSON:
        if vendor is None and sku is None:
            raise ToolError("search_invoices needs a vendor or a sku")
        found = [
            inv
            for inv in self.desk.invoices
            if (vendor is None or inv.vendor.lower() == vendor.lower())
            and (sku is None or any(ln.sku == sku.upper() for ln in inv.lines))
        ]
        return {"invoices": [invoice_summary(inv) for inv in found]}

    def invoice(self, invoice_id: str) -> Invoice:
        found = next((inv for inv in self.desk.invoices if inv.id == invoice_id.upper()), None)
        if found is None:
            raise ToolError(f"no invoice {invoice_id!r}; list_invoices gives the ids")
        return found

    def get_invoice(self, invoice_id: str) -> JSON:
        return invoice_json(self.invoice(invoice_id))

    def get_purchase_order(self, po_id: str) -> JSON:
        po = self.desk.order(po_id.upper())
        if po is None:
            raise ToolError(f"no purchase order {po_id!r}; get_invoice gives an invoice's po")
        return purchase_order_json(po)

    def ask_vendor(self, vendor: str, question: str) -> JSON:
        """The contact answers facts about the invoice ids and skus the question names, in a phrasing
        drawn from the effects (a simulated person: deterministic code, varied wording)."""
        found = next((v for v in self.desk.vendors if v.name.lower() == vendor.lower()), None)
        if found is None:
            raise ToolError(f"no vendor {vendor!r}; the vendors are {[v.name for v in self.desk.vendors]}")
        po = self.desk.order(found.po)
        assert po is not None
        words = {word.upper() for word in re.findall(r"[A-Za-z0-9]+", question)}
        facts = []
        for inv in self.desk.invoices:
            if inv.id in words:
                if inv.vendor == found.name:
                    facts.append(f"{inv.id} bills {len(inv.lines)} line(s) on {inv.po}, total {inv.total}.")
                else:
                    facts.append(f"{inv.id} is not one of our invoices.")
        facts += [f"The agreed price of {ln.sku} is {ln.price}." for ln in po.lines if ln.sku in words]
        draw = self.effects.random("ask_vendor", 8)
        first = found.contact.split()[0]
        greeting = GREETINGS[draw % len(GREETINGS)].format(first=first, vendor=found.name)
        body = " ".join(facts) or "Which invoice or sku do you mean?"
        return {
            "from": f"{found.contact} ({found.name})",
            "reply": f"{greeting} {body}{CLOSINGS[(draw >> 2) % len(CLOSINGS)]}",
        }

    def submit_report(self, lines: list[dict[str, Any]]) -> JSON:
        refs = sorted({(str(ref["invoice_id"]).upper(), ref["line_no"]) for ref in lines})
        self._submitted = refs
        self._report_id = self.effects.uuid()  # a generated id: recorded and replayed like any effect
        self.finish()
        return {"received": len(refs), "report_id": self._report_id}


@register_world
class InvoiceDeskV2(InvoiceDesk):
    """``invoice-desk`` version 2: ``get_invoice`` also says the currency (the world's env ``currency``)."""

    version: ClassVar[str] = "2"

    def get_invoice(self, invoice_id: str) -> JSON:
        return {**invoice_json(self.invoice(invoice_id)), "currency": self.effects.env("currency") or "EUR"}
