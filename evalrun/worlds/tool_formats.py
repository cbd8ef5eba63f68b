"""How a model agent is shown the world's tools and how its replies become tool calls (``task.world.tool_format``).

- ``json``: evalrun's own protocol (:mod:`evalrun.worlds.actions`): the tools and the reply format as prose
  in the system message, a reply is one JSON object, parsed strictly; works with any model.
- ``native``: the model's own function calling: the tools as JSON Schema through its chat template's
  ``tools`` variable, results as ``tool`` messages with their call ids, and replies parsed by the vLLM tool
  parser named by ``task.world.tool_parser`` (``hermes``, ``llama3_json``, ``mistral``, ...), as ``vllm serve``
  parses them. The raw reply stays in the chain; a replay parses it again the same way.

A format is a factory registered with ``@tool_format("NAME")`` that checks the run's settings and builds it; the
episode carries the format, so a worker and a replay render and parse alike.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any, Protocol, TypeVar

from evalrun.chat import ChatFormat, Conversation
from evalrun.chat.reasoning import vllm_version
from evalrun.config.registry import Registry
from evalrun.errors import BadInput
from evalrun.worlds.actions import (
    MAX_CALLS,
    ParseError,
    Step,
    ToolCall,
    chat_messages,
    native_messages,
    parse_reply,
    tool_schemas,
)
from evalrun.worlds.base import ToolSpec


class ToolFormat(Protocol):
    name: str

    def prompt(self, chat: ChatFormat | None, specs: Sequence[ToolSpec], task_text: str,
               steps: Sequence[Step]) -> tuple[str, Conversation | None]:  # fmt: skip
        """The prompt of the agent's next reply (``chat`` None: the model has no chat template)."""
        ...

    def parse(self, text: str) -> list[ToolCall] | ParseError:
        """The tool calls of a reply, or why it has none."""
        ...

    def as_record(self) -> dict[str, Any] | None:
        """What the manifest and the prompt-pack digest part record of it (None: nothing, the json format)."""
        ...


# A format's factory: (task.world.tool_parser, the chat format, the tokenizer's directory (None: not here), where
# the model comes from, for messages) -> the format, checked before any model loads (a BadInput names the field)
ToolFormatFactory = Callable[[str | None, ChatFormat | None, Path | None, str], ToolFormat]
F = TypeVar("F", bound=ToolFormatFactory)
TOOL_FORMATS: Registry[ToolFormatFactory] = Registry("tool format", "task.world.tool_format")


def tool_format(name: str) -> Callable[[F], F]:
    """Register a tool format's factory as ``name`` (``task.world.tool_format=NAME``)."""

    def register(factory: F) -> F:
        TOOL_FORMATS.add(name, factory)
        return factory

    return register


def resolve_tool_format(name: str | None, parser: str | None, chat: ChatFormat | None, tokenizer: Path | None,
                        where: str) -> ToolFormat:  # fmt: skip
    """A model agent's tool format (``task.world.tool_format``; None or auto: native when the chat template
    renders the tools it is given, else json), built by its registered factory."""
    if name in (None, "auto"):
        name = "native" if chat is not None and chat.renders_tools() else "json"
    return TOOL_FORMATS.get(name)(parser, chat, tokenizer, where)


def plain_chat(messages: Sequence[Mapping[str, Any]]) -> str:
    """A rendering for models without a chat template: ``role: content`` lines, then ``assistant:``."""
    return "".join(f"{m['role']}: {m['content']}\n" for m in messages) + "assistant:"


@dataclass(frozen=True)
class JsonToolFormat:
    name = "json"

    def prompt(self, chat: ChatFormat | None, specs: Sequence[ToolSpec], task_text: str,
               steps: Sequence[Step]) -> tuple[str, Conversation | None]:  # fmt: skip
        messages = chat_messages(specs, task_text, steps)
        if chat is None:
            return plain_chat(messages), None
        return chat.render(messages), chat.conversation(messages)

    def parse(self, text: str) -> list[ToolCall] | ParseError:
        return parse_reply(text)

    def as_record(self) -> dict[str, Any] | None:
        return None


JSON_TOOLS = JsonToolFormat()  # the format of every scripted agent, and of runs recorded before the setting


@tool_format("json")
def json_tools(parser: str | None, chat: ChatFormat | None, tokenizer: Path | None, where: str) -> ToolFormat:
    return JSON_TOOLS


@dataclass(frozen=True)
class NativeToolFormat:
    parser: str  # a vLLM tool parser (vllm.tool_parsers.ToolParserManager)
    tokenizer: str  # the directory of the tokenizer the parser is built with (the model's)

    name = "native"

    def prompt(self, chat: ChatFormat | None, specs: Sequence[ToolSpec], task_text: str,
               steps: Sequence[Step]) -> tuple[str, Conversation | None]:  # fmt: skip
        if chat is None:
            raise BadInput("task.world.tool_format", "native tools go through the model's chat template: it has none")
        messages, tools = native_messages(task_text, steps), tool_schemas(specs)
        return chat.render(messages, tools=tools), chat.conversation(messages, tools)

    def parse(self, text: str) -> list[ToolCall] | ParseError:
        parser, request = _vllm_parser(self.parser, self.tokenizer)
        info = parser.extract_tool_calls(text, request)
        if not info.tools_called or not info.tool_calls:
            return ParseError(f"no tool call the {self.parser} parser could read in the reply")
        if len(info.tool_calls) > MAX_CALLS:
            return ParseError(f"at most {MAX_CALLS} calls per reply, got {len(info.tool_calls)}")
        calls = []
        for i, call in enumerate(info.tool_calls):
            try:
                arguments = json.loads(call.function.arguments or "{}")
            except ValueError as exc:
                return ParseError(f"tool call {i}: its arguments are not JSON ({exc})")
            if not isinstance(arguments, dict) or not call.function.name:
                return ParseError(f"tool call {i} must name a tool and give its arguments as an object")
            calls.append(ToolCall(call.function.name, arguments))
        return calls

    def as_record(self) -> dict[str, Any] | None:
        return {"name": self.name, "parser": self.parser, "vllm": vllm_version()}


@tool_format("native")
def native_tools(parser: str | None, chat: ChatFormat | None, tokenizer: Path | None, where: str) -> ToolFormat:
    """Native tools need a chat template to pass them through, a vLLM tool parser, and the tokenizer it reads with."""
    if chat is None:
        raise BadInput("task.world.tool_format", f"native: the model ({where}) has no chat template to pass the "
                                                 "tools through: expected task.world.tool_format=json")  # fmt: skip
    if not chat.renders_tools():
        template = "task.chat_template's file" if chat.origin == "file" else f"the model's ({where})"
        raise BadInput("task.world.tool_format", f"native: the chat template, {template}, does not render the "
                                                 "tools it is given, so no prompt would name a tool: give one "
                                                 "that does (task.chat_template=FILE), or "
                                                 "task.world.tool_format=json")  # fmt: skip
    if parser is None:
        raise BadInput("task.world.tool_parser", "native tool calls are read by a vLLM tool parser: name the one for "
                                                 "the model's format (hermes, llama3_json, mistral, ...), or "
                                                 "task.world.tool_format=json")  # fmt: skip
    check_tool_parser(parser)
    if tokenizer is None:
        raise BadInput("model.path", f"the {parser} tool parser reads replies with the model's tokenizer, and the "
                                     f"model's directory ({where}) is not here")  # fmt: skip
    return NativeToolFormat(parser, str(tokenizer))


@cache
def _vllm_parser(name: str, tokenizer_dir: str) -> tuple[Any, Any]:
    """vLLM's tool parser ``name`` over the tokenizer in ``tokenizer_dir``, and the chat request it parses for
    (its tools are not needed to parse a complete reply). Built once per process; parsing keeps no state
    between non-streamed replies."""
    from transformers import AutoTokenizer
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
    from vllm.tool_parsers import ToolParserManager

    parser = ToolParserManager.get_tool_parser(name)(AutoTokenizer.from_pretrained(tokenizer_dir))
    request = ChatCompletionRequest(model="evalrun", messages=[{"role": "user", "content": ""}])
    return parser, request


def check_tool_parser(name: str) -> None:
    """``task.world.tool_parser`` names a parser of the installed vLLM (a BadInput lists them)."""
    from vllm.tool_parsers import ToolParserManager

    known = ToolParserManager.list_registered()
    if name not in known:
        raise BadInput("task.world.tool_parser", f"expected one of vLLM's tool parsers ({', '.join(known)}), "
                                                 f"got {name!r}")  # fmt: skip
