"""The scripted agent's policy for ``support-desk``: identify the customer, ask for the details, check the
policy, act or refuse, and tell the customer the outcome.

It reads only what an agent sees (the task text with the policy and the customer's opening, and the
observations) and works out the policy's answer with its own code, never the world's solver, so a
disagreement between the two shows up as a failed episode. Turns: ``today`` and a question for the
customer's email or name and zip code; the lookup; a question for the order id and what the request
needs (items, whether unused, the wanted variant, the new address); ``get_order`` (and for an exchange
``get_product``); the change, or a refusal saying which rule forbids it; a message with the outcome
(the refund, the price difference, the new status or address), after which the customer says goodbye.

``obey_policy=False`` carries out every request it can (a refund after the return window included):
the wrong agent the verifier's tests need.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import date
from typing import Any

from evalrun.worlds.actions import Step, ToolCall

SUPPORT_INTRO = "You work at the customer-service desk of an online store."
ASK_IDENTITY = (
    "Hello, I can help with that. To find your account, could you tell me your email address, "
    "or your full name and zip code?"
)
ASK_DETAILS = {
    "return": "Thank you. Which order is it (the order id), which items would you like to return, and are they unused?",
    "exchange": "Thank you. Which order is it (the order id), which item would you like to exchange, is it unused, "
    "and which variant would you like instead?",
    "cancel": "Thank you. Which order would you like to cancel (the order id)?",
    "address": "Thank you. Which order is it (the order id), and what is the new shipping address?",
}
WRITES = ("cancel_order", "return_items", "exchange_items", "change_address")


def is_support_task(task_text: str) -> bool:
    return task_text.startswith(SUPPORT_INTRO)


def request_kind(task_text: str) -> str:
    """What the customer's opening asks for: return, exchange, cancel or address."""
    opening = opening_message(task_text).casefold()
    for word, kind in (("return", "return"), ("exchange", "exchange"), ("cancel", "cancel"), ("address", "address")):
        if word in opening:
            return kind
    raise ValueError("not a support-desk request: no known request in the customer's opening")


def opening_message(task_text: str) -> str:
    found = re.search(r'The customer writes: "(.*)"', task_text)
    return found.group(1) if found else ""


def return_window(task_text: str) -> int:
    found = re.search(r"within (\d+) days of its delivery date", task_text)
    if found is None:
        raise ValueError("not a support-desk policy: no return window")
    return int(found.group(1))


@dataclass
class _Seen:
    """What the conversation and the observations have told the agent so far."""

    today: str | None = None
    replies: list[str] = field(default_factory=list)
    sent: list[str] = field(default_factory=list)
    customer: dict[str, Any] | None = None
    lookups: int = 0
    order: dict[str, Any] | None = None
    product: dict[str, Any] | None = None
    acted: dict[str, Any] | None = None  # the write's result: {"status": ..., "content": ...}
    ended: bool = False

    @property
    def said(self) -> str:
        return " ".join(self.replies)


def _seen(history: Sequence[Step]) -> _Seen:
    seen = _Seen()
    for step in history:
        for call, result in zip(step.calls, step.results, strict=True):
            ok, content = result.status == "ok", result.content
            if call.name == "today" and ok:
                seen.today = content["date"]
            elif call.name == "send_message":
                seen.sent.append(str(call.arguments.get("message", "")))
                if ok:
                    seen.replies.append(content["reply"])
                    seen.ended = seen.ended or bool(content.get("ended"))
            elif call.name.startswith("find_customer"):
                seen.lookups += 1
                if ok:
                    seen.customer = content
            elif call.name == "get_order" and ok:
                seen.order = content
            elif call.name == "get_product" and ok:
                seen.product = content
            elif call.name in WRITES:
                seen.acted = result.as_json()
    return seen


@dataclass(frozen=True)
class _Details:
    order_id: str | None
    items: list[tuple[str, str]]  # (product name, variant) the customer named
    used: bool | None
    wanted: tuple[str | None, str] | None  # (another product's name or None for the same product, variant)
    address: tuple[str, str, str] | None


def _details(said: str) -> _Details:
    order = re.search(r"It's order (W\d+)", said)
    items: list[tuple[str, str]] = []
    listed = re.search(r"It's (the .+?)\.(?:\s|$)", said)
    if listed:
        for part in listed.group(1).split(" and "):
            one = re.fullmatch(r"the (.+) \((.+)\)", part.strip())
            if one:
                items.append((one.group(1), one.group(2)))
    used = True if re.search(r"\bI have used\b", said) else False if "unused" in said else None
    wanted = re.search(r"I'd like (?:it|the (.+?)) in (.+?) instead\.", said)
    address = re.search(r"Please ship it to ([^,]+), ([^,]+), (\d{5})\.", said)
    return _Details(
        order.group(1) if order else None,
        items,
        used,
        (wanted.group(1), wanted.group(2)) if wanted else None,
        (address.group(1), address.group(2), address.group(3)) if address else None,
    )


def _lookup(said: str) -> ToolCall | None:
    email = re.search(r"My email is (\S+@\S+?)\.(?:\s|$)", said)
    if email:
        return ToolCall("find_customer_by_email", {"email": email.group(1)})
    name = re.search(r"My name is (\S+) (\S+) and my zip code is (\d{5})", said)
    if name:
        return ToolCall("find_customer_by_name_zip",
                        {"first_name": name.group(1), "last_name": name.group(2), "zip": name.group(3)})  # fmt: skip
    return None


def _say(message: str) -> list[ToolCall]:
    return [ToolCall("send_message", {"message": message})]


def _transfer(summary: str) -> list[ToolCall]:
    return [ToolCall("transfer_to_human", {"summary": summary})]


def _lines(order: Mapping[str, Any], items: Sequence[tuple[str, str]]) -> list[Mapping[str, Any]]:
    wanted = {(name.casefold(), variant.casefold()) for name, variant in items}
    return [ln for ln in order["lines"] if (ln["name"].casefold(), ln["variant"].casefold()) in wanted]


def _refusal(kind: str, order: Mapping[str, Any], details: _Details, today: str, window: int,
             product: Mapping[str, Any] | None) -> str | None:  # fmt: skip
    """Why the policy forbids the request (a message for the customer), or None when it allows it."""
    oid, status = order["id"], order["status"]
    if kind == "cancel":
        return None if status == "pending" else (
            f"I'm sorry, but I cannot cancel order {oid}: its status is {status}, and only pending orders can be "
            "cancelled.")  # fmt: skip
    if kind == "address":
        return None if status == "pending" else (
            f"I'm sorry, but I cannot change the shipping address of order {oid}: its status is {status}, and an "
            "address can only be changed before the order ships.")  # fmt: skip
    what = "returned" if kind == "return" else "exchanged"
    if status != "delivered" or not order.get("delivered"):
        return f"I'm sorry, but items can only be {what} from a delivered order, and order {oid} is {status}."
    days = (date.fromisoformat(today) - date.fromisoformat(order["delivered"])).days
    if days > window:
        return (f"I'm sorry, but I cannot accept this: order {oid} was delivered on {order['delivered']}, "
                f"{days} days ago, and items can only be {what} within {window} days of delivery.")  # fmt: skip
    if details.used:
        return f"I'm sorry, but I cannot accept this: only unused items can be {what}."
    if kind == "exchange":
        assert details.wanted is not None and product is not None
        other, variant = details.wanted
        if other is not None and other.casefold() != product["name"].casefold():
            return ("I'm sorry, but I cannot make this exchange: an item can only be exchanged for another "
                    "variant of the same product.")  # fmt: skip
        target = next((v for v in product["variants"] if v["variant"].casefold() == variant.casefold()), None)
        if target is None or not target["in_stock"]:
            return f"I'm sorry, but I cannot make this exchange: {variant} is not in stock."
    return None


def _change(kind: str, order: Mapping[str, Any], details: _Details,
            product: Mapping[str, Any] | None) -> ToolCall | None:  # fmt: skip
    oid = order["id"]
    if kind == "cancel":
        return ToolCall("cancel_order", {"order_id": oid})
    if kind == "address":
        assert details.address is not None
        street, city, zip_code = details.address
        return ToolCall("change_address", {"order_id": oid, "street": street, "city": city, "zip": zip_code})
    lines = _lines(order, details.items)
    if not lines:
        return None
    if kind == "return":
        return ToolCall("return_items", {"order_id": oid, "item_ids": [ln["item_id"] for ln in lines]})
    assert details.wanted is not None and product is not None
    target = next((v for v in product["variants"] if v["variant"].casefold() == details.wanted[1].casefold()), None)
    if target is None:
        return None
    return ToolCall("exchange_items", {"order_id": oid, "item_ids": [lines[0]["item_id"]],
                                       "new_item_ids": [target["item_id"]]})  # fmt: skip


def _outcome(kind: str, order: Mapping[str, Any], details: _Details, product: Mapping[str, Any] | None) -> str:
    """The message that tells the customer what was done, with the amount worked out from the records seen."""
    oid = order["id"]
    if kind == "cancel":
        total = sum(int(ln["price"]) for ln in order["lines"])
        return f"Done: order {oid} is now cancelled, and your refund of {total} is on its way."
    if kind == "address":
        assert details.address is not None
        street, city, zip_code = details.address
        return f"Done: order {oid} will now ship to {street}, {city}, {zip_code}."
    lines = _lines(order, details.items)
    if kind == "return":
        refund = sum(int(ln["price"]) for ln in lines)
        return (f"Done: the return of {len(lines)} item(s) from order {oid} is requested, and your refund of "
                f"{refund} goes back to your original payment method.")  # fmt: skip
    assert details.wanted is not None and product is not None
    target = next(v for v in product["variants"] if v["variant"].casefold() == details.wanted[1].casefold())
    difference = int(target["price"]) - int(lines[0]["price"])
    money = (f"the price difference of {difference} will be charged to your original payment method" if difference > 0
             else f"the price difference of {-difference} will be refunded to you")  # fmt: skip
    return f"Done: your {lines[0]['name']} in order {oid} will be exchanged for {target['variant']}, and {money}."


def support_policy(task_text: str, history: Sequence[Step], *, obey_policy: bool = True) -> list[ToolCall]:
    """The next calls of the scripted support agent (``obey_policy=False``: carry out what the policy forbids too)."""
    kind = request_kind(task_text)
    seen = _seen(history)
    if not history:
        return [ToolCall("today"), *_say(ASK_IDENTITY)]
    if seen.ended:  # the customer said goodbye (the world ends the episode; nothing more to say)
        return _transfer("the customer has left the conversation")
    if seen.customer is None:
        lookup = _lookup(seen.said)
        if lookup is None or seen.lookups >= 2:
            return _transfer(f"could not identify the customer for a {kind} request")
        if seen.lookups == 1 and lookup.name == "find_customer_by_email":
            return _say("I could not find that email. Could you tell me your full name and zip code?")
        return [lookup]
    if ASK_DETAILS[kind] not in seen.sent:
        return _say(ASK_DETAILS[kind])
    details = _details(seen.said)
    if details.order_id is None or details.order_id not in seen.customer["orders"]:
        return _transfer(f"the {kind} request names no order of this customer")
    if seen.order is None or seen.order["id"] != details.order_id:
        return [ToolCall("get_order", {"order_id": details.order_id})]
    order = seen.order
    if kind == "exchange" and seen.product is None:
        lines = _lines(order, details.items)
        if not lines:
            return _transfer("the item to exchange is not in the order")
        return [ToolCall("get_product", {"product_id": lines[0]["product_id"]})]
    if seen.acted is not None:
        if seen.acted["status"] != "ok":
            return _transfer(f"the {kind} could not be recorded: {seen.acted['content']}")
        return _say(_outcome(kind, order, details, seen.product))
    if seen.today is None:
        return [ToolCall("today")]
    refusal = _refusal(kind, order, details, seen.today, return_window(task_text), seen.product)
    other_product = details.wanted is not None and details.wanted[0] is not None  # no item id to exchange for
    if refusal is not None and (obey_policy or other_product):
        if any(refusal == sent for sent in seen.sent):
            return _transfer("the customer did not accept the refusal")
        return _say(refusal)
    change = _change(kind, order, details, seen.product)
    if change is None:
        return _transfer(f"could not work out the {kind} from the conversation")
    return [change]
