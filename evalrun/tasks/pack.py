"""Prompt packs: versioned prompt templates, a few-shot pool and decoding settings, as files.

A pack is a directory holding ``pack.yaml``::

    name: addition-fewshot
    version: "1.0"
    system: system.jinja            # optional
    user: user.jinja                # required
    fewshot:                        # optional
      file: fewshot.jsonl           # the pool, in fixed order; every line has an ``id``
      k: 3
      stratify: label               # optional: balance the chosen examples over this field
    decoding:                       # optional: wins over the decoding config group
      max_tokens: 8
      stop: ["\\n"]

Templates are Jinja with strict undefined variables. A plain prompt is the rendered system template
followed by the rendered user template; a chat prompt (``task.chat_format``, evalrun/chat) is a system
message, the user message and, with ``fewshot.as_multiturn: true`` and ``fewshot.assistant:
answer.jinja``, each few-shot example as a user turn and an assistant turn before it, turned into
text by the model's chat template. The pack hash covers name, version, both templates, the
few-shot file and settings, and the effective decoding settings: a change to any of them is a new
prompt pack. A task given only ``task.template`` has a pack of that one user template.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Literal

import yaml
from jinja2 import Environment, StrictUndefined, Template, TemplateSyntaxError
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from evalrun.chat import Conversation
from evalrun.config.jsonl import objects, read_utf8
from evalrun.errors import BadInput
from evalrun.records.canonical import canonical_hash, file_sha256, sha256_hex

PACK_FILE = "pack.yaml"
_JINJA = Environment(undefined=StrictUndefined, keep_trailing_newline=True, autoescape=False)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


class _FewshotSpec(_Strict):
    file: str
    k: int = Field(ge=1)
    stratify: str | None = None
    id_field: str = "id"
    # chat format: the examples as user/assistant turns before the item's (lm-eval's fewshot_as_multiturn),
    # the user turn the user template of the example, the assistant turn this template of it
    as_multiturn: bool = False
    assistant: str | None = None


class _DecodingSpec(_Strict):
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    max_tokens: int | None = None
    stop: list[str] | None = None
    logprobs: bool | None = None


class _PackSpec(_Strict):
    name: str = Field(min_length=1)
    version: str = Field(min_length=1)
    system: str | None = None
    user: str
    fewshot: _FewshotSpec | None = None
    decoding: _DecodingSpec = _DecodingSpec()
    kind: Literal["task", "judge"] = "task"


def parse_yaml_model(path: Path, model: type[BaseModel]) -> Any:
    """Parse a YAML file into ``model``; any problem is a BadInput naming the file and the field."""
    try:
        data = yaml.safe_load(read_utf8(path))
    except OSError as exc:
        raise BadInput(str(path), f"cannot read ({exc.strerror})") from exc
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark is not None else str(path)
        raise BadInput(where, f"not valid YAML ({getattr(exc, 'problem', exc)})") from exc
    try:
        return model.model_validate(data if data is not None else {})
    except ValidationError as exc:
        error = exc.errors()[0]
        field = ".".join(str(part) for part in error["loc"]) or "(top level)"
        raise BadInput(f"{path}: field {field}", f"{error['msg']} (got {error.get('input')!r})") from None


@dataclass(frozen=True)
class FewshotPool:
    path: Path
    sha256: str
    ids: tuple[str, ...]
    examples: tuple[Mapping[str, Any], ...]
    k: int
    stratify: str | None
    assistant: str | None = None  # as_multiturn: the template of an example's assistant turn

    def as_record(self) -> dict[str, Any]:
        record = {"file_sha256": self.sha256, "k": self.k, "stratify": self.stratify, "ids": list(self.ids)}
        if self.assistant is not None:  # only then: the record of a pack without turns is as it always was
            record["as_multiturn"] = {"assistant": sha256_hex(self.assistant)}
        return record


@dataclass(frozen=True)
class PromptPack:
    name: str | None
    version: str | None
    path: Path  # pack.yaml, or the single template file
    system: str  # template text; "" for none
    user: str
    fewshot: FewshotPool | None
    decoding: Mapping[str, Any]  # the pack's own settings, applied over the decoding group

    def as_record(self, decoding: Mapping[str, Any]) -> dict[str, Any]:
        """What the pack hash covers, with ``decoding`` the effective settings."""
        return {
            "name": self.name,
            "version": self.version,
            "templates": {"system": sha256_hex(self.system), "user": sha256_hex(self.user)},
            "fewshot": self.fewshot.as_record() if self.fewshot is not None else None,
            "decoding": {k: v for k, v in decoding.items() if k != "name"},
        }

    def hash(self, decoding: Mapping[str, Any]) -> str:
        return canonical_hash(self.as_record(decoding))

    def prompt_of(self, item_id: str) -> str | None:
        """An item's prompt when the pack holds it made (None: rendered from the templates)."""
        return None

    def examples_of(self, item_id: str) -> tuple[str, ...] | None:
        """The ids of the few-shot examples in an item's prompt when the pack made it (None: drawn from the pool)."""
        return None

    def conversation_of(self, item_id: str) -> Conversation | None:
        """The chat a prompt the pack made was rendered from (None: a plain prompt, or one rendered here)."""
        return None

    def render(self, variables: Mapping[str, Any]) -> str:
        """The plain prompt: the system template's text, then the user template's."""
        return _compiled(self.system).render(**variables) + _compiled(self.user).render(**variables)

    def messages(self, variables: Mapping[str, Any]) -> list[dict[str, str]]:
        """The chat prompt: a system message (when the pack has a system template), the few-shot examples
        as user/assistant turns (``fewshot.as_multiturn``: each example's user template, then its assistant
        template; the item's own user template then sees no ``examples``), the item's user message."""
        messages = [{"role": "system", "content": _compiled(self.system).render(**variables)}] if self.system else []
        pool = self.fewshot
        if pool is not None and pool.assistant is not None:
            for example in variables["examples"]:
                shown = {"choices": [], "letters": [], **example, "examples": []}
                messages.append({"role": "user", "content": _compiled(self.user).render(**shown)})
                messages.append({"role": "assistant", "content": _compiled(pool.assistant).render(**shown)})
            variables = {**variables, "examples": []}
        messages.append({"role": "user", "content": _compiled(self.user).render(**variables)})
        return messages


@lru_cache(maxsize=64)
def _compiled(text: str) -> Template:
    return _JINJA.from_string(text)


def _template(path: Path, field: str) -> str:
    if not path.is_file():
        raise BadInput(field, f"{path} does not exist or is not a file")
    text = read_utf8(path)
    try:
        _JINJA.parse(text)
    except TemplateSyntaxError as exc:
        raise BadInput(f"{path}:{exc.lineno}", f"template syntax error: {exc.message}") from exc
    return text


def template_pack(path: Path) -> PromptPack:
    """The pack of a task given as one template file (``task.template``)."""
    return PromptPack(None, None, path, "", _template(path, "task.template"), None, {})


def load_pack(directory: Path, field: str = "task.prompt_pack") -> PromptPack:
    """Read and check a pack directory; every error names the file and the field."""
    path = directory / PACK_FILE
    if not path.is_file():
        raise BadInput(field, f"{directory} is not a prompt pack (no {PACK_FILE})")
    spec: _PackSpec = parse_yaml_model(path, _PackSpec)
    system = _template(directory / spec.system, f"{path}: field system") if spec.system else ""
    user = _template(directory / spec.user, f"{path}: field user")
    fewshot = _fewshot_pool(directory, path, spec.fewshot) if spec.fewshot else None
    decoding = {k: v for k, v in spec.decoding.model_dump().items() if v is not None}
    return PromptPack(spec.name, spec.version, path, system, user, fewshot, decoding)


def _fewshot_pool(directory: Path, pack_path: Path, spec: _FewshotSpec) -> FewshotPool:
    path = directory / spec.file
    if not path.is_file():
        raise BadInput(f"{pack_path}: field fewshot.file", f"{path} does not exist or is not a file")
    ids: list[str] = []
    examples: list[Mapping[str, Any]] = []
    for where, example in objects(path):
        if spec.id_field not in example:
            raise BadInput(where, f"missing field {spec.id_field!r} (fewshot.id_field)")
        if spec.stratify is not None and spec.stratify not in example:
            raise BadInput(where, f"missing field {spec.stratify!r} (fewshot.stratify)")
        if str(example[spec.id_field]) in ids:
            raise BadInput(where, f"duplicate example id {example[spec.id_field]!r}")
        ids.append(str(example[spec.id_field]))
        examples.append(example)
    if len(examples) <= spec.k:
        message = f"expected k below the pool size ({len(examples)} examples in {path}), got {spec.k}"
        raise BadInput(f"{pack_path}: field fewshot.k", message)
    if spec.as_multiturn != (spec.assistant is not None):
        raise BadInput(f"{pack_path}: field fewshot.assistant",
                       "as_multiturn: true and an assistant template (the examples' answers) go together")  # fmt: skip
    assistant = None
    if spec.assistant is not None:
        assistant = _template(directory / spec.assistant, f"{pack_path}: field fewshot.assistant")
    return FewshotPool(path, file_sha256(path), tuple(ids), tuple(examples), spec.k, spec.stratify, assistant)
