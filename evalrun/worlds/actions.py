"""The text format in which an agent calls tools and sees their results.

A reply is one JSON object and nothing else::

    {"tool_calls":[{"name":"get_invoice","arguments":{"invoice_id":"I1"}},
                   {"name":"get_invoice","arguments":{"invoice_id":"I2"}}]}

One or more calls per reply; the calls of one reply are parallel calls. It is the shape chat models
know from function calling, and a tiny model trained on :func:`format_calls` output learns it
exactly. Parsing is strict (no text around the object, no code fence, no duplicate or unknown key,
``arguments`` always an object), and every violation is a :class:`ParseError` whose message the
harness returns to the agent as an error observation.

Results are rendered one per line, in call order: ``{"ok":...}`` or ``{"error":"..."}``. Every
rendering here is canonical JSON (keys sorted, numbers in one notation), so the text depends only
on the JSON values: a result served from a recorded schedule renders exactly as it did live.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from evalrun.records.canonical import canonical_json
from evalrun.worlds.base import ToolResult, ToolSpec

MAX_CALLS = 8  # parallel calls per reply

REPLY_FORMAT = (
    'Reply with one JSON object and nothing else: {"tool_calls":[{"name":"TOOL","arguments":{...}}]}. '
    "Several calls in one reply run in parallel. "
    'Results come back one per line, in call order: {"ok":RESULT} or {"error":"MESSAGE"}.'
)


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: Mapping[str, Any] = field(default_factory=dict)

    def as_json(self) -> dict[str, Any]:
        return {"name": self.name, "arguments": dict(self.arguments)}


@dataclass(frozen=True)
class ParseError:
    """Why a reply is not a valid tool-call reply; ``message`` is shown to the agent."""

    message: str

    def as_result(self) -> ToolResult:
        return ToolResult.error(self.message)


@dataclass(frozen=True)
class Step:
    """One turn: the calls of a reply and their results, in call (join) order. ``reply`` is the raw
    reply text where it is not :func:`format_calls` of ``calls`` (a model's own, or unparseable, text)."""

    calls: tuple[ToolCall, ...]
    results: tuple[ToolResult, ...]
    reply: str | None = None

    def as_json(self) -> dict[str, Any]:
        return {
            "calls": [call.as_json() for call in self.calls],
            "results": [result.as_json() for result in self.results],
            "reply": self.reply,
        }


class _DuplicateKey(ValueError):
    pass


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for key, value in pairs:
        if key in result:
            raise _DuplicateKey(key)
        result[key] = value
    return result


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def parse_reply(text: str) -> list[ToolCall] | ParseError:
    """The tool calls of a reply, or a ParseError saying what is wrong with it."""
    try:
        value = json.loads(text, object_pairs_hook=_no_duplicates, parse_constant=_no_constant)
    except _DuplicateKey as exc:
        return ParseError(f"the key {exc.args[0]!r} appears twice in one object")
    except ValueError as exc:  # JSONDecodeError included
        return ParseError(f"the reply must be one JSON object and nothing else: {exc}. {REPLY_FORMAT}")
    if not isinstance(value, dict) or set(value) != {"tool_calls"}:
        return ParseError(f'the reply must be an object with the one key "tool_calls". {REPLY_FORMAT}')
    calls = value["tool_calls"]
    if not isinstance(calls, list) or not calls:
        return ParseError('"tool_calls" must be a list of one or more calls')
    if len(calls) > MAX_CALLS:
        return ParseError(f"at most {MAX_CALLS} calls per reply, got {len(calls)}")
    parsed = []
    for i, call in enumerate(calls):
        where = f"tool_calls[{i}]"
        if not isinstance(call, dict) or set(call) != {"name", "arguments"}:
            return ParseError(f'{where} must be an object with exactly the keys "name" and "arguments"')
        if not isinstance(call["name"], str) or not call["name"]:
            return ParseError(f"{where}.name must be a tool name (a non-empty string)")
        if not isinstance(call["arguments"], dict):
            return ParseError(f"{where}.arguments must be an object (use {{}} for none)")
        parsed.append(ToolCall(call["name"], call["arguments"]))
    return parsed


def format_calls(calls: Sequence[ToolCall]) -> str:
    """The reply text of ``calls``: ``name`` before ``arguments`` (the order a model writes them),
    arguments in canonical JSON. ``parse_reply(format_calls(calls)) == calls``."""
    inner = ",".join(
        f'{{"name":{canonical_json(call.name)},"arguments":{canonical_json(dict(call.arguments))}}}' for call in calls
    )
    return f'{{"tool_calls":[{inner}]}}'


def format_observation(result: ToolResult) -> str:
    """One result as the agent sees it: ``{"ok":CONTENT}`` or ``{"error":"MESSAGE"}``, canonical JSON."""
    return canonical_json({"ok" if result.status == "ok" else "error": result.content})


def format_results(results: Sequence[ToolResult]) -> str:
    """The results of one turn, one per line in call order."""
    return "\n".join(format_observation(result) for result in results)


def _type_text(schema: Mapping[str, Any]) -> str:
    kind = schema.get("type", "object")
    if kind == "array":
        return f"[{_type_text(schema.get('items', {}))}]" if "items" in schema else "array"
    if kind == "object" and "properties" in schema:
        required = set(schema.get("required", ()))
        parts = [
            f"{name}{'' if name in required else '?'}: {_type_text(sub)}" for name, sub in schema["properties"].items()
        ]
        return "{" + ", ".join(parts) + "}"
    return str(kind)


def tool_signature(spec: ToolSpec) -> str:
    """``name(arg: type, optional?: type)``, the way the tools are listed to the agent."""
    return f"{spec.name}({_type_text(spec.parameters)[1:-1]})"


def system_prompt(specs: Sequence[ToolSpec]) -> str:
    """The tool list and the reply format, the system message of an agent episode."""
    lines = ["Tools:"] + [f"- {tool_signature(spec)}: {spec.description}" for spec in specs]
    return "\n".join([*lines, REPLY_FORMAT])


def chat_messages(specs: Sequence[ToolSpec], task_text: str, steps: Sequence[Step]) -> list[dict[str, str]]:
    """An episode as chat messages: system (tools, format), user (task), then per turn the assistant's
    reply and one ``tool`` message with the turn's results. The model agent and the training
    transcripts use this one rendering."""
    messages = [{"role": "system", "content": system_prompt(specs)}, {"role": "user", "content": task_text}]
    for step in steps:
        reply = step.reply if step.reply is not None else format_calls(step.calls)
        messages.append({"role": "assistant", "content": reply})
        messages.append({"role": "tool", "content": format_results(step.results)})
    return messages


# --- the native format: tools through the model's chat template --------------------------------


def tool_schemas(specs: Sequence[ToolSpec]) -> list[dict[str, Any]]:
    """The tools as chat templates take them (``apply_chat_template(tools=...)``, the OpenAI tools list):
    ``{"type": "function", "function": {name, description, parameters}}``, in the order given."""
    return [{"type": "function", "function": spec.as_json()} for spec in specs]


def call_id(turn: int, index: int) -> str:
    """The id of the ``index``-th call of turn ``turn``: the model never writes it, the harness assigns it, so
    the same history always renders the same."""
    return f"call_{turn}_{index}"


def native_messages(task_text: str, steps: Sequence[Step]) -> list[dict[str, Any]]:
    """An episode as chat messages for a template that takes tools: the task as the user message, then per
    turn the assistant's message with its ``tool_calls`` (ids from :func:`call_id`, arguments as objects) and
    one ``tool`` message per call with its result and call id; a reply with no calls (a parse error) is the
    assistant's text, and the error comes back as a user message. The tools go to the template separately
    (:func:`tool_schemas`)."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": task_text}]
    for turn, step in enumerate(steps):
        if not step.calls:
            messages.append({"role": "assistant", "content": step.reply or ""})
            messages.append({"role": "user", "content": format_results(step.results)})
            continue
        ids = [call_id(turn, i) for i in range(len(step.calls))]
        messages.append({"role": "assistant", "content": "", "tool_calls": [
            {"id": i, "type": "function", "function": {"name": c.name, "arguments": dict(c.arguments)}}
            for i, c in zip(ids, step.calls, strict=True)
        ]})  # fmt: skip
        for i, call, result in zip(ids, step.calls, step.results, strict=True):
            messages.append({"role": "tool", "tool_call_id": i, "name": call.name,
                             "content": format_observation(result)})  # fmt: skip
    return messages
