"""``support-desk``: a customer-service desk where the agent talks with a simulated customer and changes orders.

Everything is generated from the task seed at reset: a written store policy (returns and exchanges
within ``window`` days of delivery, drawn from 7, 14 or 30), 5-7 products of 3 variants each (an
item id per variant, an integer price, in stock or not), 2-3 customers (name, email, zip code,
address), their 1-3 orders (status ``pending``, ``shipped`` or ``delivered``, dates before the
task's start, 1-3 lines of distinct products, a shipping address), and the customer who writes in
with a goal. Five families, one goal kind each:

- ``return``: return 1-2 unused items of a delivered order within the window (refund: their prices);
- ``exchange``: exchange an unused item of a delivered order within the window for another variant
  of the same product that is in stock (the price difference is charged, or refunded when negative);
- ``cancel``: cancel a pending order (refund: the order total);
- ``address-change``: change the shipping address of a pending order;
- ``refuse``: a request the policy forbids, one of: a return after the window (``late``), a return of
  a used item (``used``), an exchange for another product (``other-product``), the cancellation of an
  order that has shipped (``not-pending``), an address change after shipping (``shipped``).

The customer (:class:`ScriptedCustomer`) is a simulated person written as seeded code, like
invoice-desk's vendor contact: its replies are what the ``send_message`` tool returns. It opens
with its request (the task text quotes it) and reveals identifying facts (email, or name and zip
code; the order id; the items; whether they were used; the wanted variant or address) only when a
question of the agent's asks for them. It ends the conversation, and so the episode, when its goal
is met (it sees the order change), when the agent refuses, or when its patience
(:data:`PATIENCE` messages) runs out; ``transfer_to_human`` ends it too, and the harness's budget
(``max_steps``, ``max_tokens``) stops a runaway one.

The tools answer from the database and do what they are told as long as the records allow it (an
id that exists, an item of the order not yet returned or exchanged, a variant in stock, an order
not cancelled); the policy is the agent's to follow, so an action the policy forbids (a refund
after the window) goes through and shows in the final database.

The expected outcome is computed by a reference solver (:func:`solve`) from the generated world
and the policy: the orders as they must end (the goal applied when the policy allows it, else
unchanged), the facts the customer must be told (the refund or price difference, the new status,
the new zip code, or a refusal) and the customer's own view at the end (``done`` or ``refused``).
It is frozen under ``references/support-desk/<version>/`` like invoice-desk's ground truths. The
verifier (:func:`verify_support_desk`) is pure: ``database`` (the final orders equal the expected
ones: 0/1), ``facts`` (the share of required facts found in the agent's messages), ``ended`` (the
customer ended the conversation satisfied or refused, not a transfer, not out of patience or
budget: 0/1), ``credit`` (their mean: partial credit) and ``pass`` (all three at 1).
"""

from __future__ import annotations

import copy
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import date, timedelta
from pathlib import Path
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
    UserTurn,
    World,
    WorldTask,
    format_date,
    object_schema,
    register_world,
)

NAME = "support-desk"
RETURN = "return"
EXCHANGE = "exchange"
CANCEL = "cancel"
ADDRESS = "address-change"
REFUSE = "refuse"
FAMILIES = (RETURN, EXCHANGE, CANCEL, ADDRESS, REFUSE)

# goal kinds (what the customer asks for; family refuse asks for one of them against the policy)
KINDS = (RETURN, EXCHANGE, CANCEL, ADDRESS)
# why the policy forbids a refuse-family request (the reference solver's reason codes)
LATE, USED, OTHER_PRODUCT, NOT_PENDING, SHIPPED_ALREADY = "late", "used", "other-product", "not-pending", "shipped"
REFUSALS = {LATE: RETURN, USED: RETURN, OTHER_PRODUCT: EXCHANGE, NOT_PENDING: CANCEL, SHIPPED_ALREADY: ADDRESS}

PENDING, SHIPPED, DELIVERED, CANCELLED = "pending", "shipped", "delivered", "cancelled"
RETURN_REQUESTED, EXCHANGE_REQUESTED = "return requested", "exchange requested"
ORDERED, RETURNED, EXCHANGED = "ordered", "returned", "exchanged"  # an order line's status
WINDOWS = (7, 14, 30)  # days after delivery a return or an exchange is allowed
PATIENCE = 10  # messages the customer answers before giving up

INTRO = "You work at the customer-service desk of an online store."
OUTRO = (
    "Talk to the customer with send_message: their reply is its result (a reply of yours that calls no tool is sent "
    "to the customer as your message). The conversation ends when the customer says goodbye, or when you hand it "
    "over with transfer_to_human."
)

PRODUCTS = (  # name, what its variants differ in, variants, lowest and highest base price
    ("Desk Lamp", "color", ("black", "white", "brass"), 25, 60),
    ("Water Bottle", "color", ("blue", "green", "grey"), 10, 30),
    ("T-Shirt", "size", ("size S", "size M", "size L"), 12, 30),
    ("Running Shoes", "size", ("size 8", "size 9", "size 10"), 50, 120),
    ("Backpack", "color", ("black", "navy", "olive"), 35, 90),
    ("Headphones", "color", ("black", "silver", "red"), 40, 150),
    ("Coffee Mug", "color", ("red", "white", "blue"), 8, 20),
    ("Yoga Mat", "color", ("purple", "teal", "black"), 20, 45),
    ("Kettle", "finish", ("steel", "black", "cream"), 25, 70),
    ("Phone Case", "color", ("clear", "black", "pink"), 10, 25),
)
FIRST_NAMES = ("Ana", "Ben", "Cara", "Dev", "Eva", "Finn", "Gia", "Hugo", "Iris", "Jon")
LAST_NAMES = ("Ruiz", "Hill", "Lund", "Patel", "Moreau", "Okafor", "Sato", "Novak", "Weber", "Costa")
STREETS = ("Oak St", "Maple Ave", "Pine Rd", "Cedar Ln", "Elm St", "Birch Way", "Lake Dr", "Hill Rd")
CITIES = ("Springfield", "Riverton", "Fairview", "Lakewood", "Greenville", "Ashford")


def policy_text(window: int) -> str:
    """The store's written policy, part of the task text the agent sees."""
    rules = [
        "Identify the customer first: find them by email, or by full name and zip code.",
        "Cancel an order only while its status is pending; the refund is the order total.",
        "Change the shipping address of an order only before it ships (status pending).",
        f"Return items only from a delivered order, within {window} days of its delivery date, and only unused "
        "items; the refund is the sum of the returned items' prices.",
        f"Exchange an item only from a delivered order, within {window} days of its delivery date, only an unused "
        "one, and only for another variant of the same product that is in stock; the price difference (new price "
        "minus old price) is charged, or refunded when it is negative.",
        "Politely refuse any request these rules do not allow. Transfer to a human agent only a request these "
        "rules do not cover.",
        "Tell the customer the outcome: the refund or price difference, or the order's new status or address.",
    ]
    return "Store policy:\n" + "\n".join(f"{i}. {rule}" for i, rule in enumerate(rules, start=1))


# ------------------------------------------------------------------------------------------ the world


@dataclass(frozen=True)
class Variant:
    item_id: str
    variant: str
    price: int
    in_stock: bool

    def as_json(self) -> dict[str, Any]:
        return {"item_id": self.item_id, "variant": self.variant, "price": self.price, "in_stock": self.in_stock}


@dataclass(frozen=True)
class Product:
    id: str
    name: str
    dimension: str  # what its variants differ in: color, size, finish
    variants: tuple[Variant, ...]

    def as_json(self) -> dict[str, Any]:
        return {"id": self.id, "name": self.name, "dimension": self.dimension,
                "variants": [v.as_json() for v in self.variants]}  # fmt: skip


@dataclass(frozen=True)
class Customer:
    id: str
    first: str
    last: str
    email: str
    zip: str
    address: dict[str, str]
    orders: tuple[str, ...]
    knows_email: bool  # persona: remembers the email of the account (else gives name and zip code)
    style: str  # persona: casual or formal

    @property
    def name(self) -> str:
        return f"{self.first} {self.last}"

    def record(self) -> dict[str, Any]:
        """What the lookup tools show of the customer (the persona stays hidden)."""
        return {"customer_id": self.id, "name": self.name, "email": self.email, "zip": self.zip,
                "address": dict(self.address), "orders": list(self.orders)}  # fmt: skip

    def as_json(self) -> dict[str, Any]:
        return {**self.record(), "persona": {"knows_email": self.knows_email, "style": self.style}}


@dataclass(frozen=True)
class Goal:
    """What the customer writes in for: a request of ``kind`` on ``order_id`` (items, a new variant or
    address), whether the items were used, and for family ``refuse`` the rule it breaks (``reason``)."""

    kind: str
    customer_id: str
    order_id: str
    item_ids: tuple[str, ...] = ()
    new_item_ids: tuple[str, ...] = ()
    new_address: dict[str, str] | None = None
    used: bool = False
    reason: str | None = None

    def as_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "customer_id": self.customer_id, "order_id": self.order_id,
                "item_ids": list(self.item_ids), "new_item_ids": list(self.new_item_ids),
                "new_address": None if self.new_address is None else dict(self.new_address),
                "used": self.used, "reason": self.reason}  # fmt: skip


@dataclass(frozen=True)
class Shop:
    """One generated world: the policy's window, products, customers, their orders, and the customer's goal."""

    window: int
    today: str
    products: tuple[Product, ...]
    customers: tuple[Customer, ...]
    orders: tuple[dict[str, Any], ...]  # order records as JSON (the database's starting state)
    goal: Goal

    def product(self, product_id: str) -> Product | None:
        return next((p for p in self.products if p.id == product_id), None)

    def variant(self, item_id: str) -> tuple[Product, Variant] | None:
        for product in self.products:
            for variant in product.variants:
                if variant.item_id == item_id:
                    return product, variant
        return None

    def customer(self, customer_id: str) -> Customer:
        return next(c for c in self.customers if c.id == customer_id)

    def as_json(self) -> dict[str, Any]:
        return {
            "policy": {"window_days": self.window},
            "today": self.today,
            "products": [p.as_json() for p in self.products],
            "customers": [c.as_json() for c in self.customers],
            "orders": copy.deepcopy(list(self.orders)),
            "goal": self.goal.as_json(),
        }


def order_total(order: Mapping[str, Any]) -> int:
    return sum(int(line["price"]) for line in order["lines"])


def _address(rng: Random) -> dict[str, str]:
    return {"street": f"{rng.randint(1, 999)} {rng.choice(STREETS)}", "city": rng.choice(CITIES),
            "zip": str(rng.randint(10000, 99999))}  # fmt: skip


def _lines(rng: Random, products: Sequence[Product], count: int) -> list[dict[str, Any]]:
    lines = []
    for product in rng.sample(list(products), count):
        variant = rng.choice(product.variants)
        lines.append({"item_id": variant.item_id, "product_id": product.id, "name": product.name,
                      "variant": variant.variant, "price": variant.price, "status": ORDERED})  # fmt: skip
    return lines


def _order(rng: Random, customer: str, status: str, days_ago: int, lines: list[dict[str, Any]],
           address: dict[str, str], today: date) -> dict[str, Any]:  # fmt: skip
    """An order of ``status``: delivered ``days_ago`` days before today, or placed then (pending, shipped)."""
    if status == DELIVERED:
        delivered: str | None = (today - timedelta(days=days_ago)).isoformat()
        placed = (today - timedelta(days=days_ago + rng.randint(2, 5))).isoformat()
    else:
        delivered, placed = None, (today - timedelta(days=days_ago)).isoformat()
    return {"id": "", "customer_id": customer, "status": status, "placed": placed, "delivered": delivered,
            "address": dict(address), "lines": lines, "refunded": 0, "charged": 0}  # fmt: skip


def _noise_order(rng: Random, customer: str, products: Sequence[Product], address: dict[str, str],
                 today: date) -> dict[str, Any]:  # fmt: skip
    status = rng.choice((PENDING, SHIPPED, DELIVERED, DELIVERED))
    days = rng.randint(1, 60) if status == DELIVERED else rng.randint(0, 2) if status == PENDING else rng.randint(1, 5)
    return _order(rng, customer, status, days, _lines(rng, products, rng.randint(1, 3)), address, today)


def generate_shop(seed: int, family: str, today: date) -> Shop:
    """The world of ``seed`` and ``family`` as of ``today``. The customer's target order is planted to fit
    the family (allowed by the policy, or for ``refuse`` broken by exactly one rule), and the reference
    solver must agree: the generator checks it."""
    if family not in FAMILIES:
        raise BadInput("task.family", f"expected one of {FAMILIES}, got {family!r}")
    rng = derive_rng(seed, "world", NAME, family)
    window = rng.choice(WINDOWS)
    products = []
    for number, (name, dimension, variants, lo, hi) in enumerate(rng.sample(PRODUCTS, rng.randint(5, 7)), start=1):
        base = rng.randint(lo, hi)
        offsets = rng.sample(range(0, 9), len(variants))  # distinct: an exchange always has a price difference
        products.append(Product(f"P{number}", name, dimension, tuple(
            Variant(f"P{number}-{k}", variant, base + offset, rng.random() < 0.75)
            for k, (variant, offset) in enumerate(zip(variants, offsets, strict=True), start=1)
        )))  # fmt: skip

    count = rng.randint(2, 3)
    people = list(zip(rng.sample(FIRST_NAMES, count), rng.sample(LAST_NAMES, count), strict=True))
    zips = rng.sample(range(10000, 100000), count)
    addresses = [{**_address(rng), "zip": str(z)} for z in zips]
    owners: list[list[dict[str, Any]]] = [
        [_noise_order(rng, f"C{i + 1}", products, addresses[i], today) for _ in range(rng.randint(0, 2))]
        for i in range(count)
    ]
    who = rng.randrange(count)
    reason = rng.choice(sorted(REFUSALS)) if family == REFUSE else None
    kind = REFUSALS[reason] if reason is not None else family
    target, extra = _plant(rng, kind, reason, f"C{who + 1}", products, addresses[who], window, today)
    owners[who].append(target)

    orders = [order for mine in owners for order in mine]
    rng.shuffle(orders)
    for number, order in enumerate(orders, start=1):
        order["id"] = f"W{number}"
    customers = []
    for i, ((first, last), address) in enumerate(zip(people, addresses, strict=True)):
        cid = f"C{i + 1}"
        mine = tuple(o["id"] for o in orders if o["customer_id"] == cid)
        customers.append(Customer(cid, first, last, f"{first}.{last}@example.com".lower(), address["zip"], address,
                                  mine, rng.random() < 0.6, rng.choice(("casual", "formal"))))  # fmt: skip
    goal = Goal(kind, f"C{who + 1}", target["id"], **extra, reason=reason)
    shop = Shop(window, today.isoformat(), tuple(products), tuple(customers), tuple(orders), goal)
    problem = policy_problem(shop, goal)
    assert problem == reason, f"seed {seed} {family}: the solver finds {problem!r}, {reason!r} was planted"
    return shop


def _plant(rng: Random, kind: str, reason: str | None, customer: str, products: list[Product],
           address: dict[str, str], window: int, today: date) -> tuple[dict[str, Any], dict[str, Any]]:  # fmt: skip
    """The customer's target order and the goal's details (items, new variant or address, used)."""
    if kind in (CANCEL, ADDRESS):
        if reason is None:
            status, days = PENDING, rng.randint(0, 2)
        else:
            status = rng.choice((SHIPPED, DELIVERED))
            days = rng.randint(1, 5) if status == SHIPPED else rng.randint(1, 20)
        order = _order(rng, customer, status, days, _lines(rng, products, rng.randint(1, 3)), address, today)
        if kind == CANCEL:
            return order, {}
        new = _address(rng)
        while new["zip"] == address["zip"] or new["street"] == address["street"]:
            new = _address(rng)
        return order, {"new_address": new}
    days = rng.randint(window + 2, window + 40) if reason == LATE else rng.randint(1, window - 1)
    lines = _lines(rng, products, rng.randint(2, 3) if kind == RETURN else rng.randint(1, 3))
    order = _order(rng, customer, DELIVERED, days, lines, address, today)
    if kind == RETURN:
        items = rng.sample([line["item_id"] for line in lines], rng.randint(1, min(2, len(lines))))
        return order, {"item_ids": tuple(sorted(items)), "used": reason == USED}
    line = rng.choice(lines)
    product = next(p for p in products if p.id == line["product_id"])
    if reason == OTHER_PRODUCT:
        others = [p for p in products if p.id not in {ln["product_id"] for ln in lines}]
        wanted_product = rng.choice(others)
    else:
        wanted_product = product
    choices = [v for v in wanted_product.variants if v.item_id != line["item_id"]]
    wanted = rng.choice(choices)
    if not wanted.in_stock:  # the wanted variant is in stock: out of stock is not this goal's problem
        index = products.index(wanted_product)
        variants = tuple(Variant(v.item_id, v.variant, v.price, True) if v == wanted else v
                         for v in wanted_product.variants)  # fmt: skip
        products[index] = Product(wanted_product.id, wanted_product.name, wanted_product.dimension, variants)
    return order, {"item_ids": (line["item_id"],), "new_item_ids": (wanted.item_id,)}


# ------------------------------------------------------------------------- records and the policy


def cancel_order(order: Mapping[str, Any]) -> tuple[dict[str, Any], int]:
    """The order cancelled and its refund (the total). ToolError when it cannot be (already cancelled)."""
    if order["status"] == CANCELLED:
        raise ToolError(f"order {order['id']} is already cancelled")
    new = copy.deepcopy(dict(order))
    refund = order_total(order)
    new["status"], new["refunded"] = CANCELLED, int(order["refunded"]) + refund
    return new, refund


def _open_lines(order: Mapping[str, Any], item_ids: Sequence[str]) -> list[int]:
    """The indexes of the order's lines of ``item_ids`` that are still as ordered; ToolError otherwise."""
    if order["status"] == CANCELLED:
        raise ToolError(f"order {order['id']} is cancelled")
    if not item_ids:
        raise ToolError("give at least one item id")
    if len(set(item_ids)) != len(item_ids):
        raise ToolError("an item id is listed twice")
    found = []
    for item_id in item_ids:
        index = next((i for i, ln in enumerate(order["lines"]) if ln["item_id"] == item_id), None)
        if index is None:
            raise ToolError(f"order {order['id']} has no item {item_id!r}; get_order lists its items")
        if order["lines"][index]["status"] != ORDERED:
            raise ToolError(f"item {item_id} of order {order['id']} is already {order['lines'][index]['status']}")
        found.append(index)
    return found


def return_items(order: Mapping[str, Any], item_ids: Sequence[str]) -> tuple[dict[str, Any], int]:
    """The order with the items returned (status ``return requested``) and the refund: their prices."""
    indexes = _open_lines(order, item_ids)
    new = copy.deepcopy(dict(order))
    refund = sum(int(new["lines"][i]["price"]) for i in indexes)
    for i in indexes:
        new["lines"][i]["status"] = RETURNED
    new["status"], new["refunded"] = RETURN_REQUESTED, int(order["refunded"]) + refund
    return new, refund


def exchange_items(order: Mapping[str, Any], item_ids: Sequence[str], new_item_ids: Sequence[str],
                   price_of: Callable[[str], int | None], in_stock: Callable[[str], bool]
                   ) -> tuple[dict[str, Any], int]:  # fmt: skip
    """The order with each item exchanged for its new item (status ``exchange requested``) and the price
    difference (new minus old; a positive one is charged, a negative one refunded)."""
    if len(item_ids) != len(new_item_ids):
        raise ToolError(f"give one new item per item: {len(item_ids)} items, {len(new_item_ids)} new items")
    indexes = _open_lines(order, item_ids)
    new = copy.deepcopy(dict(order))
    difference = 0
    for index, new_id in zip(indexes, new_item_ids, strict=True):
        line = new["lines"][index]
        price = price_of(new_id)
        if price is None:
            raise ToolError(f"no item {new_id!r}; get_product lists a product's item ids")
        if new_id == line["item_id"]:
            raise ToolError(f"item {new_id} is the item ordered: an exchange needs another one")
        if not in_stock(new_id):
            raise ToolError(f"item {new_id} is out of stock")
        difference += price - int(line["price"])
        line["status"], line["exchanged_for"] = EXCHANGED, new_id
    new["status"] = EXCHANGE_REQUESTED
    if difference > 0:
        new["charged"] = int(order["charged"]) + difference
    else:
        new["refunded"] = int(order["refunded"]) - difference
    return new, difference


def change_address(order: Mapping[str, Any], address: Mapping[str, str]) -> dict[str, Any]:
    """The order shipping to ``address`` (whitespace collapsed)."""
    if order["status"] == CANCELLED:
        raise ToolError(f"order {order['id']} is cancelled")
    new = copy.deepcopy(dict(order))
    new["address"] = {key: " ".join(str(address[key]).split()) for key in ("street", "city", "zip")}
    return new


def _days_since(day: str | None, today: str) -> int | None:
    return None if day is None else (date.fromisoformat(today) - date.fromisoformat(day)).days


def policy_problem(shop: Shop, goal: Goal) -> str | None:
    """The rule of the policy ``goal`` breaks in ``shop`` (a reason code), or None when it is allowed."""
    order = next(o for o in shop.orders if o["id"] == goal.order_id)
    if goal.kind == CANCEL:
        return None if order["status"] == PENDING else NOT_PENDING
    if goal.kind == ADDRESS:
        return None if order["status"] == PENDING else SHIPPED_ALREADY
    if order["status"] != DELIVERED:
        return "not-delivered"
    days = _days_since(order["delivered"], shop.today)
    if days is None or days > shop.window:
        return LATE
    if goal.used:
        return USED
    if goal.kind == EXCHANGE:
        for item_id, new_id in zip(goal.item_ids, goal.new_item_ids, strict=True):
            old, new = shop.variant(item_id), shop.variant(new_id)
            if old is None or new is None or old[0].id != new[0].id:
                return OTHER_PRODUCT
            if old[1] == new[1]:
                return "same-variant"
            if not new[1].in_stock:
                return "out-of-stock"
    return None


@dataclass(frozen=True)
class Expected:
    """The reference solver's answer: the orders as they must end, the facts to tell, the customer's view."""

    orders: tuple[dict[str, Any], ...]
    facts: tuple[dict[str, Any], ...]
    outcome: str  # done (the request was carried out) or refused

    def as_json(self) -> dict[str, Any]:
        return {"orders": copy.deepcopy(list(self.orders)), "facts": [dict(f) for f in self.facts],
                "outcome": self.outcome}  # fmt: skip


def _price_of(shop: Shop) -> Callable[[str], int | None]:
    def price(item_id: str) -> int | None:
        found = shop.variant(item_id)
        return None if found is None else found[1].price

    return price


def _in_stock(shop: Shop) -> Callable[[str], bool]:
    def stocked(item_id: str) -> bool:
        found = shop.variant(item_id)
        return found is not None and found[1].in_stock

    return stocked


def apply_goal(shop: Shop, orders: Sequence[Mapping[str, Any]], goal: Goal) -> tuple[list[dict[str, Any]], int]:
    """``orders`` with ``goal`` carried out (the record rules apply, the policy is not checked), and the
    amount it moves: the refund, the price difference, or 0 for an address change."""
    out = [copy.deepcopy(dict(o)) for o in orders]
    index = next(i for i, o in enumerate(out) if o["id"] == goal.order_id)
    amount = 0
    if goal.kind == CANCEL:
        out[index], amount = cancel_order(out[index])
    elif goal.kind == RETURN:
        out[index], amount = return_items(out[index], goal.item_ids)
    elif goal.kind == EXCHANGE:
        out[index], amount = exchange_items(out[index], goal.item_ids, goal.new_item_ids, _price_of(shop),
                                            _in_stock(shop))  # fmt: skip
    else:
        assert goal.new_address is not None
        out[index] = change_address(out[index], goal.new_address)
    return out, amount


def solve(shop: Shop) -> Expected:
    """The reference solution of ``shop``: its goal carried out when the policy allows it (with the facts
    the policy says to tell), else the orders unchanged and a refusal to tell."""
    goal = shop.goal
    if policy_problem(shop, goal) is not None:
        return Expected(tuple(copy.deepcopy(list(shop.orders))), ({"fact": "refusal", "kind": "refusal"},), "refused")
    orders, amount = apply_goal(shop, shop.orders, goal)
    facts: list[dict[str, Any]]
    if goal.kind == RETURN:
        facts = [{"fact": "refund", "kind": "amount", "value": amount}]
    elif goal.kind == EXCHANGE:
        facts = [{"fact": "price difference", "kind": "amount", "value": abs(amount)}]
    elif goal.kind == CANCEL:
        facts = [{"fact": "refund", "kind": "amount", "value": amount},
                 {"fact": "status", "kind": "word", "value": CANCELLED}]  # fmt: skip
    else:
        assert goal.new_address is not None
        facts = [{"fact": "new zip code", "kind": "text", "value": goal.new_address["zip"]}]
    return Expected(tuple(orders), tuple(facts), "done")


def goal_met(shop: Shop, orders: Iterable[Mapping[str, Any]]) -> bool:
    """Whether the customer sees its request carried out in ``orders`` (what it asked for, whatever else changed)."""
    goal = shop.goal
    order = next((o for o in orders if o["id"] == goal.order_id), None)
    if order is None:
        return False
    if goal.kind == CANCEL:
        return bool(order["status"] == CANCELLED)
    if goal.kind == ADDRESS:
        assert goal.new_address is not None
        return _same_address(order["address"], goal.new_address)
    lines = {ln["item_id"]: ln for ln in order["lines"]}
    if goal.kind == RETURN:
        return all(lines.get(i, {}).get("status") == RETURNED for i in goal.item_ids)
    return all(lines.get(i, {}).get("exchanged_for") == n for i, n in zip(goal.item_ids, goal.new_item_ids,
                                                                            strict=True))  # fmt: skip


def _fold(text: Any) -> str:
    return " ".join(str(text).split()).casefold()


def _same_address(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    return all(_fold(a.get(k, "")) == _fold(b.get(k, "")) for k in ("street", "city", "zip"))


# ---------------------------------------------------------------------------------- the customer

QUESTION_PHRASES = ("please provide", "please give", "please tell", "please share", "please send",
                    "please confirm", "could you", "can you", "would you", "may i", "let me know",
                    "tell me")  # fmt: skip
IDENTITY_BY_EMAIL = ("email", "e-mail")
IDENTITY_BY_NAME = ("name", "zip", "postal code", "postcode", "identify", "verify", "look up your account")
ORDER_WORDS = ("order id", "order number", "which order", "what order", "order #")
ITEM_WORDS = ("which item", "what item", "which product", "what product", "which one", "items")
CONDITION_PATTERN = re.compile(r"\b(used|unused|condition|opened|worn)\b")
VARIANT_WORDS = ("variant", "instead", "which color", "what color", "which size", "what size", "which finish",
                 "what finish", "prefer", "would you like")  # fmt: skip
ADDRESS_WORDS = ("new address", "shipping address", "new shipping", "delivery address", "ship it to",
                 "deliver it to", "where should")  # fmt: skip
CONFIRM_WORDS = ("confirm", "shall i", "should i", "do you want", "would you like me", "proceed", "go ahead",
                 "is that ok", "is that okay", "is that correct", "is this correct", "is that right",
                 "agree")  # fmt: skip
REFUSAL_PATTERN = re.compile(
    r"\b(cannot|can ?not|can't|can’t|unable|not able|not possible|not eligible|ineligible|not allowed|"
    r"won't be able|will not be able|unfortunately|not permitted|must decline|have to decline|refuse)\b"
)
GREETINGS = {"casual": "Hey there!", "formal": "Good morning."}
THANKS = {"casual": "Awesome, thanks so much! That's all I needed. Bye!",
          "formal": "Thank you very much, that is all I needed. Goodbye."}  # fmt: skip
REFUSED = {"casual": "Oh, that's a shame. Thanks anyway, bye.",
           "formal": "I see. That is unfortunate, but thank you for explaining. Goodbye."}  # fmt: skip
GIVE_UP = {"casual": "Sorry, I have to run. I'll try again another time. Bye.",
           "formal": "I am afraid I have to go now. I will contact you again later. Goodbye."}  # fmt: skip


def questions(message: str) -> str:
    """The parts of ``message`` that ask something (sentences ending in '?' or with a request phrase), folded."""
    sentences = re.split(r"(?<=[.!?])\s+|\n+", message.strip())
    asked = [s for s in sentences if s.rstrip().endswith("?") or any(p in s.casefold() for p in QUESTION_PHRASES)]
    return " ".join(asked).casefold()


def refuses(message: str) -> bool:
    """Whether ``message`` says that a request cannot be carried out (the verifier's refusal fact)."""
    return REFUSAL_PATTERN.search(message.casefold()) is not None


def _items_text(lines: Sequence[Mapping[str, Any]]) -> str:
    return " and ".join(f"the {ln['name']} ({ln['variant']})" for ln in lines)


@dataclass
class ScriptedCustomer:
    """The simulated customer: deterministic code from the generated world (persona and goal), no effects.

    :meth:`reply` answers one message of the agent's, given the orders as they stand: the facts each
    question asks for (and nothing it does not ask for); when nothing is asked, it ends the conversation
    if its goal is met (``done``: it sees the order changed) or the agent refused (``refused``), and otherwise
    repeats its request. A question counts only in a sentence that asks (ending in '?' or with a request
    phrase such as "could you"), so an outcome that mentions an email or an order is not one.
    After :data:`PATIENCE` messages it gives up (``gave up``)."""

    shop: Shop
    messages: int = 0
    ended: bool = False
    outcome: str | None = None  # done | refused | gave up, once ended

    @property
    def customer(self) -> Customer:
        return self.shop.customer(self.shop.goal.customer_id)

    @property
    def order(self) -> Mapping[str, Any]:
        return next(o for o in self.shop.orders if o["id"] == self.shop.goal.order_id)

    def _goal_lines(self) -> list[Mapping[str, Any]]:
        goal = self.shop.goal
        if goal.kind in (CANCEL, ADDRESS):
            return list(self.order["lines"])
        return [ln for ln in self.order["lines"] if ln["item_id"] in goal.item_ids]

    def _product_names(self) -> str:
        return " and ".join(f"the {ln['name']}" for ln in self._goal_lines())

    def request(self) -> str:
        """What the customer wants, in its words (no ids, no identifying facts)."""
        goal = self.shop.goal
        if goal.kind == RETURN:
            return f"I'd like to return {self._product_names()} from one of my orders."
        if goal.kind == EXCHANGE:
            (line,) = self._goal_lines()
            product = self.shop.product(line["product_id"])
            assert product is not None
            if goal.reason == OTHER_PRODUCT:
                return f"I'd like to exchange the {line['name']} I received for a different product."
            return f"I'd like to exchange the {line['name']} I received for a different {product.dimension}."
        if goal.kind == CANCEL:
            return f"I'd like to cancel my order with {self._product_names()}."
        return f"I need to change the shipping address of my order with {self._product_names()}."

    def opening(self) -> str:
        return f"{GREETINGS[self.customer.style]} {self.request()}"

    def reply(self, message: str, orders: Iterable[Mapping[str, Any]]) -> str:
        """The customer's answer to ``message``; sets ``ended`` (and ``outcome``) when it says goodbye."""
        self.messages += 1
        met = goal_met(self.shop, orders)
        answer = self._answers(questions(message), settled=met)
        if not answer:
            if met:
                return self._end("done", THANKS)
            if refuses(message):
                return self._end("refused", REFUSED)
            answer = f"So, can you help me? {self.request()}"
        if self.messages >= PATIENCE:
            return f"{answer} {self._end('gave up', GIVE_UP)}"
        return answer

    def _end(self, outcome: str, lines: Mapping[str, str]) -> str:
        self.ended, self.outcome = True, outcome
        return lines[self.customer.style]

    def take_reply(self, said_goodbye: bool, orders: Iterable[Mapping[str, Any]], told: Sequence[str]) -> None:
        """A reply a model playing this customer wrote (``task.world.user=model``), counted like one of its own:
        the conversation ends when the reply says goodbye, the outcome read as the scripted customer reads it
        (``done``: its request carried out; ``refused``: the agent said it cannot be; else ``gave up``), or when
        its patience runs out (``gave up``)."""
        self.messages += 1
        if said_goodbye:
            met = goal_met(self.shop, orders)
            self.ended, self.outcome = True, "done" if met else "refused" if any(map(refuses, told)) else "gave up"
        elif self.messages >= PATIENCE:
            self.ended, self.outcome = True, "gave up"

    def facts(self) -> dict[str, Any]:
        """What a model playing this customer is told of itself (its prompt pack renders them): the persona, the
        request in its words, and the facts it reveals when asked (the goal's order, items, their condition, the
        wanted variant or address); never the policy, nor whether the request is allowed."""
        goal, me = self.shop.goal, self.customer
        wanted = None
        if goal.kind == EXCHANGE:
            found = self.shop.variant(goal.new_item_ids[0])
            assert found is not None
            wanted = f"the {found[0].name} in {found[1].variant}"
        address = goal.new_address
        return {
            "name": me.name, "first_name": me.first, "last_name": me.last,
            "email": me.email if me.knows_email else None, "zip": me.zip, "style": me.style,
            "kind": goal.kind, "request": self.request(), "opening": self.opening(), "order_id": goal.order_id,
            "items": _items_text(self._goal_lines()),
            "used": goal.used if goal.kind in (RETURN, EXCHANGE) else None, "wanted": wanted,
            "new_address": None if address is None else f"{address['street']}, {address['city']}, {address['zip']}",
        }  # fmt: skip

    def _answers(self, asked: str, settled: bool) -> str:
        """The facts the questions in ``asked`` (folded) ask for, in a fixed order; once its request is carried
        out (``settled``), only who it is and which order (a question about the request is a question no more)."""
        goal, me = self.shop.goal, self.customer
        parts: list[str] = []
        if any(w in asked for w in IDENTITY_BY_EMAIL):
            if me.knows_email:
                parts.append(f"My email is {me.email}.")
            else:
                parts.append(f"I don't remember which email I used. My name is {me.name} and my zip code is {me.zip}.")
        elif any(w in asked for w in IDENTITY_BY_NAME):
            parts.append(f"My name is {me.name} and my zip code is {me.zip}.")
        if any(w in asked for w in ORDER_WORDS):
            parts.append(f"It's order {goal.order_id}.")
        if settled:
            return " ".join(parts)
        if any(w in asked for w in ITEM_WORDS):
            parts.append(f"It's {_items_text(self._goal_lines())}.")
        if goal.kind in (RETURN, EXCHANGE) and CONDITION_PATTERN.search(asked):
            many = len(goal.item_ids) > 1
            if goal.used:
                parts.append(f"I have used {'them' if many else 'it'} a few times.")
            else:
                parts.append(f"{'They are' if many else 'It is'} unused, still in the original packaging.")
        if goal.kind == EXCHANGE and any(w in asked for w in VARIANT_WORDS):
            (new_id,) = goal.new_item_ids
            found = self.shop.variant(new_id)
            assert found is not None
            product, variant = found
            (line,) = self._goal_lines()
            if product.id == line["product_id"]:
                parts.append(f"I'd like it in {variant.variant} instead.")
            else:
                parts.append(f"I'd like the {product.name} in {variant.variant} instead.")
        if goal.kind == ADDRESS and any(w in asked for w in ADDRESS_WORDS):
            assert goal.new_address is not None
            new = goal.new_address
            parts.append(f"Please ship it to {new['street']}, {new['city']}, {new['zip']}.")
        if not parts and any(w in asked for w in CONFIRM_WORDS):
            parts.append("Yes, please go ahead.")
        return " ".join(parts)


# ---------------------------------------------------------------------------------- the verifier

AMOUNT = "amount"


def fact_told(fact: Mapping[str, Any], messages: Sequence[str]) -> bool:
    """Whether one of the agent's ``messages`` tells the customer ``fact``: an amount (as a number, cents
    of zero allowed), a status word, a text (word-bounded, any case), or a refusal."""
    text = "\n".join(messages).casefold()
    kind = fact.get("kind")
    if kind == "refusal":
        return refuses(text)
    value = str(fact.get("value")).casefold()
    if kind == AMOUNT:
        return re.search(rf"(?<![\w.])(?<!\d-){re.escape(value)}(?:\.0+)?(?!\.?\d)(?!-\d)", text) is not None
    spellings = {value, "canceled"} if value == CANCELLED else {value}
    return any(re.search(rf"(?<!\w){re.escape(s)}(?!\w)", text) for s in spellings)


def _comparable(orders: Iterable[Mapping[str, Any]]) -> list[Any]:
    """Orders sorted by id, addresses folded (case and spacing are not a wrong address)."""
    out = []
    for order in sorted(orders, key=lambda o: str(o["id"])):
        order = dict(order)
        order["address"] = {k: _fold(v) for k, v in dict(order.get("address") or {}).items()}
        out.append(order)
    return out


def verify_support_desk(final_state: Mapping[str, Any]) -> dict[str, float]:
    """``database``, ``facts``, ``ended``, ``credit`` (their mean) and ``pass`` of a final state (pure)."""
    try:
        expected = final_state["expected"]
        expected_orders, facts = list(expected["orders"]), list(expected["facts"])
        orders = list(final_state["orders"])
        messages = [str(m) for m in final_state["messages"]]
        ended_by, outcome = final_state["ended_by"], final_state["customer_outcome"]
        database = 1.0 if _comparable(orders) == _comparable(expected_orders) else 0.0
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise BadInput("final_state", f"not a support-desk final state: {exc!r}") from None
    told = [fact_told(f, messages) for f in facts]
    facts_score = sum(told) / len(told) if told else 1.0
    ended = 1.0 if ended_by == "customer" and outcome in ("done", "refused") else 0.0
    credit = (database + facts_score + ended) / 3
    passed = 1.0 if database == facts_score == ended == 1.0 else 0.0
    return {"database": database, "facts": facts_score, "ended": ended, "credit": credit, "pass": passed}


# ------------------------------------------------------------------------------ frozen references


def truth_reference(task: WorldTask) -> dict[str, Any]:
    """The frozen expected outcome of ``task``: the reference solver's answer for the world its seed and start
    date generate, with the hash of that world (docs/design.md "Frozen references")."""
    shop = generate_shop(task.seed, task.family, date.fromisoformat(format_date(task.start_seconds)))
    return {
        "format": references.REFERENCE_FORMAT,
        "world": {"name": NAME, "version": task.version},
        "family": task.family,
        "seed": task.seed,
        "item": task.item_id,
        "start": task.start,
        "instance_sha256": canonical_hash(shop.as_json()),
        "expected": solve(shop).as_json(),
    }


def task_text(shop: Shop, opening: str) -> str:
    return f'{INTRO}\n{policy_text(shop.window)}\nThe customer writes: "{opening}"\n{OUTRO}'


def _string(description: str) -> dict[str, str]:
    return {"type": "string", "description": description}


def _strings(description: str) -> dict[str, Any]:
    return {"type": "array", "items": {"type": "string"}, "description": description}


ORDER_ID = _string("order id, e.g. W1")
TOOLS = (
    ToolSpec("find_customer_by_email", "The customer with this email: id, name, zip, address, order ids.",
             object_schema({"email": _string("the customer's email")}, ["email"])),
    ToolSpec("find_customer_by_name_zip", "The customer with this full name and zip code (when they do not know "
             "their email).", object_schema({"first_name": _string("first name"), "last_name": _string("last name"),
                                             "zip": _string("zip code")}, ["first_name", "last_name", "zip"])),
    ToolSpec("get_order", "One order: status, dates, shipping address, lines (item_id, product_id, name, variant, "
             "price, status), total, refunded and charged amounts.", object_schema({"order_id": ORDER_ID},
                                                                                   ["order_id"])),
    ToolSpec("get_product", "One product: name and variants (item_id, variant, price, in_stock).",
             object_schema({"product_id": _string("product id, e.g. P1")}, ["product_id"])),
    TODAY,
    ToolSpec("send_message", "Send the customer a message; their reply is the result (ended: they said goodbye).",
             object_schema({"message": _string("what you tell or ask the customer")}, ["message"])),
    ToolSpec("cancel_order", "Cancel an order; its total is refunded.", object_schema({"order_id": ORDER_ID},
                                                                                       ["order_id"])),
    ToolSpec("return_items", "Return items of an order; their prices are refunded.",
             object_schema({"order_id": ORDER_ID, "item_ids": _strings("the item ids to return")},
                           ["order_id", "item_ids"])),
    ToolSpec("exchange_items", "Exchange items of an order, each for the new item at the same position; the price "
             "difference is charged (or refunded when negative).",
             object_schema({"order_id": ORDER_ID, "item_ids": _strings("the item ids to exchange"),
                            "new_item_ids": _strings("the item ids they are exchanged for")},
                           ["order_id", "item_ids", "new_item_ids"])),
    ToolSpec("change_address", "Change the shipping address of an order.",
             object_schema({"order_id": ORDER_ID, "street": _string("street and number"), "city": _string("city"),
                            "zip": _string("zip code")}, ["order_id", "street", "city", "zip"])),
    ToolSpec("transfer_to_human", "Hand the conversation over to a human agent; ends the episode.",
             object_schema({"summary": _string("what the customer needs")}, ["summary"])),
)  # fmt: skip


@register_world
class SupportDesk(ComputedReferences, World):
    """``support-desk`` version 1."""

    name: ClassVar[str] = NAME
    version: ClassVar[str] = "1"
    tools_version: ClassVar[str] = "2"  # 2: a model agent's plain reply is said to the customer (reply_tool)
    verifier_version: ClassVar[str] = "1"
    families: ClassVar[tuple[str, ...]] = FAMILIES
    verifier = staticmethod(verify_support_desk)
    concurrent_tools: ClassVar[frozenset[str]] = frozenset(
        {"find_customer_by_email", "find_customer_by_name_zip", "get_order", "get_product", "today"}
    )  # the lookups: the rest change the database or the conversation

    reference_key: ClassVar[str] = "expected"
    compute_reference = staticmethod(truth_reference)
    user_tools: ClassVar[frozenset[str]] = frozenset({"send_message"})
    reply_tool: ClassVar[str | None] = "send_message"
    user_pack: ClassVar[Path | None] = Path(__file__).parent / "users" / "support-desk-customer.yaml"

    def __init__(self) -> None:
        super().__init__()
        self._shop: Shop | None = None
        self._expected: Expected | None = None
        self._orders: list[dict[str, Any]] = []
        self._customer: ScriptedCustomer | None = None
        self._messages: list[str] = []
        self._conversation: list[dict[str, str]] = []
        self._actions: list[dict[str, Any]] = []
        self._ended_by: str | None = None

    # -- World

    def generate(self, task: WorldTask) -> str:
        self._shop = generate_shop(task.seed, task.family, date.fromisoformat(format_date(task.start_seconds)))
        self._expected = solve(self._shop)
        self._orders = [copy.deepcopy(o) for o in self._shop.orders]
        self._customer = ScriptedCustomer(self._shop)
        opening = self._customer.opening()
        self._messages, self._actions, self._ended_by = [], [], None
        self._conversation = [{"role": "customer", "text": opening}]
        return task_text(self._shop, opening)

    def tools(self) -> list[ToolSpec]:
        return list(TOOLS)

    def handlers(self) -> Mapping[str, Handler]:
        return {
            "find_customer_by_email": self.find_customer_by_email,
            "find_customer_by_name_zip": self.find_customer_by_name_zip,
            "get_order": self.get_order,
            "get_product": self.get_product,
            "today": self.today,
            "send_message": self.send_message,
            "cancel_order": self.cancel_order,
            "return_items": self.return_items,
            "exchange_items": self.exchange_items,
            "change_address": self.change_address,
            "transfer_to_human": self.transfer_to_human,
        }

    def generated(self) -> JSON:
        return {"family": self.task.family, "seed": self.task.seed, **self.shop.as_json(),
                "expected": self.expected.as_json()}  # fmt: skip

    def final_state(self) -> dict[str, Any]:
        return {
            **self.state_identity(),
            "goal": self.shop.goal.as_json(),
            "expected": self.expected.as_json(),
            "orders": copy.deepcopy(self._orders),
            "messages": list(self._messages),
            "conversation": [dict(turn) for turn in self._conversation],
            "actions": copy.deepcopy(self._actions),
            "ended_by": self._ended_by,
            "customer_outcome": self.customer.outcome,
        }

    @property
    def shop(self) -> Shop:
        if self._shop is None:
            raise RuntimeError("support-desk: no world before reset")
        return self._shop

    @property
    def expected(self) -> Expected:
        if self._expected is None:
            raise RuntimeError("support-desk: no world before reset")
        return self._expected

    @property
    def customer(self) -> ScriptedCustomer:
        if self._customer is None:
            raise RuntimeError("support-desk: no customer before reset")
        return self._customer

    # -- lookups

    def find_customer_by_email(self, email: str) -> JSON:
        found = next((c for c in self.shop.customers if c.email == email.strip().casefold()), None)
        if found is None:
            raise ToolError(f"no customer with the email {email!r}")
        return found.record()

    def find_customer_by_name_zip(self, first_name: str, last_name: str, zip: str) -> JSON:
        found = next((c for c in self.shop.customers if _fold(c.first) == _fold(first_name)
                      and _fold(c.last) == _fold(last_name) and c.zip == zip.strip()), None)  # fmt: skip
        if found is None:
            raise ToolError(f"no customer named {first_name} {last_name} with the zip code {zip!r}")
        return found.record()

    def _order(self, order_id: str) -> int:
        index = next((i for i, o in enumerate(self._orders) if o["id"] == order_id.strip().upper()), None)
        if index is None:
            raise ToolError(f"no order {order_id!r}; a customer's record lists their order ids")
        return index

    def get_order(self, order_id: str) -> JSON:
        order = self._orders[self._order(order_id)]
        return {**copy.deepcopy(order), "total": order_total(order)}

    def get_product(self, product_id: str) -> JSON:
        product = self.shop.product(product_id.strip().upper())
        if product is None:
            raise ToolError(f"no product {product_id!r}; an order's lines give their product_id")
        return product.as_json()

    # -- the conversation

    def send_message(self, message: str) -> JSON:
        if not message.strip():
            raise ToolError("the message is empty")
        self._messages.append(message)
        self._conversation.append({"role": "agent", "text": message})
        reply = self.customer.reply(message, self._orders)
        self._conversation.append({"role": "customer", "text": reply})
        if self.customer.ended:
            self._ended_by = "customer"
            self.finish()
        return {"from": f"{self.customer.customer.name} (customer)", "reply": reply, "ended": self.customer.ended}

    # -- the customer played by a model (task.world.user=model): send_message in two halves

    def user_turn(self, name: str, arguments: dict[str, Any]) -> UserTurn:
        message = str(arguments["message"])
        if not message.strip():
            raise ToolError("the message is empty")
        self._messages.append(message)
        self._conversation.append({"role": "agent", "text": message})
        said = tuple(("user" if turn["role"] == "customer" else "agent", turn["text"]) for turn in self._conversation)
        return UserTurn(self.customer.facts(), said)

    def user_reply(self, text: str, ended: bool) -> JSON:
        self._conversation.append({"role": "customer", "text": text})
        self.customer.take_reply(ended, self._orders, self._messages)
        if self.customer.ended:
            self._ended_by = "customer"
            self.finish()
        return {"from": f"{self.customer.customer.name} (customer)", "reply": text, "ended": self.customer.ended}

    @classmethod
    def user_said(cls, content: JSON) -> str | None:
        return content.get("reply") if isinstance(content, dict) and isinstance(content.get("reply"), str) else None

    def transfer_to_human(self, summary: str) -> JSON:
        self._actions.append({"tool": "transfer_to_human", "summary": summary})
        self._ended_by = "transfer"
        self.finish()
        return {"transferred": True}

    # -- changes

    def _record(self, tool: str, index: int, order: dict[str, Any], **result: Any) -> JSON:
        self._orders[index] = order
        self._actions.append({"tool": tool, "order_id": order["id"], **result})
        return {"order_id": order["id"], "status": order["status"], **result}

    def cancel_order(self, order_id: str) -> JSON:
        index = self._order(order_id)
        order, refund = cancel_order(self._orders[index])
        return self._record("cancel_order", index, order, refund=refund)

    def return_items(self, order_id: str, item_ids: list[str]) -> JSON:
        index = self._order(order_id)
        items = [str(i).strip().upper() for i in item_ids]
        order, refund = return_items(self._orders[index], items)
        return self._record("return_items", index, order, returned=items, refund=refund)

    def exchange_items(self, order_id: str, item_ids: list[str], new_item_ids: list[str]) -> JSON:
        index = self._order(order_id)
        items = [str(i).strip().upper() for i in item_ids]
        new_items = [str(i).strip().upper() for i in new_item_ids]
        order, difference = exchange_items(self._orders[index], items, new_items, _price_of(self.shop),
                                           _in_stock(self.shop))  # fmt: skip
        return self._record("exchange_items", index, order, exchanged=[list(p) for p in zip(items, new_items,
                            strict=True)], price_difference=difference)  # fmt: skip

    def change_address(self, order_id: str, street: str, city: str, zip: str) -> JSON:
        index = self._order(order_id)
        if not all(part.strip() for part in (street, city, zip)):
            raise ToolError("street, city and zip code must not be empty")
        order = change_address(self._orders[index], {"street": street, "city": city, "zip": zip})
        return self._record("change_address", index, order, address=order["address"])
