"""Chat formatting: chat messages turned into a model's prompt by its chat template.

A model's chat template is a Jinja program in its directory (``chat_template.jinja``, where
transformers now saves it, else ``chat_template`` in ``tokenizer_config.json``); it reads the
messages, ``add_generation_prompt``, the tools (JSON Schema) and the tokenizer's special tokens
(``bos_token``, ``eos_token``, ...), plus any ``chat_template_kwargs`` a task passes
(``enable_thinking``). :class:`ModelChat` is what rendering needs of a model: the template's text and
the special tokens. A run records it in its manifest (``model.chat``), so that a run whose model
directory has since gone still renders, replays and verifies.

Rendering is transformers' own (``render_jinja_template``, the function ``apply_chat_template``
calls, with the special tokens as ``apply_chat_template`` passes them): a prompt rendered here is
the prompt lm-evaluation-harness ``--apply_chat_template`` and vLLM's chat endpoint build.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from evalrun.errors import BadInput
from evalrun.records.canonical import sha256_hex

# The tokenizer attributes transformers passes to every chat template (``special_tokens_map``)
SPECIAL_TOKEN_NAMES = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")
TEMPLATE_FILE = "chat_template.jinja"
TOKENIZER_CONFIG = "tokenizer_config.json"
SPECIAL_TOKENS_MAP = "special_tokens_map.json"
TOOL_PROBE = "evalrun_probe_tool"  # the name of the tool a template is asked to render (ChatFormat.renders_tools)

Message = Mapping[str, Any]


@dataclass(frozen=True)
class ModelChat:
    """What rendering chat messages needs of a model: its chat template (None: it has none) and the
    special tokens a template may read."""

    template: str | None
    special_tokens: Mapping[str, str] = field(default_factory=dict)

    @property
    def template_sha256(self) -> str | None:
        return sha256_hex(self.template) if self.template is not None else None

    def as_record(self) -> dict[str, Any]:
        """The manifest's ``model.chat``: the template's text (what a replay renders with) and its hash."""
        return {"template": self.template, "template_sha256": self.template_sha256,
                "special_tokens": dict(sorted(self.special_tokens.items()))}  # fmt: skip

    @classmethod
    def recorded(cls, record: Any, where: str = "manifest.json: model.chat") -> ModelChat:
        """The chat of a recorded run (:meth:`as_record`); a record that does not hold together is a BadInput."""
        if not isinstance(record, dict) or not isinstance(record.get("special_tokens"), dict):
            raise BadInput(where, "expected template, template_sha256 and special_tokens")
        template = record.get("template")
        if template is not None and (not isinstance(template, str) or sha256_hex(template) != record.get(
                "template_sha256")):  # fmt: skip
            raise BadInput(where, "the recorded chat template does not match its recorded sha256")
        tokens = record["special_tokens"]
        if not all(isinstance(k, str) and isinstance(v, str) for k, v in tokens.items()):
            raise BadInput(f"{where}.special_tokens", "expected a mapping of token names to strings")
        return cls(template, dict(tokens))

    @classmethod
    def of_directory(cls, directory: Path) -> ModelChat:
        """The chat template and special tokens of a model (or tokenizer) directory, read from its files."""
        config = _json(directory / TOKENIZER_CONFIG)
        template: Any = None
        if (directory / TEMPLATE_FILE).is_file():
            template = _read(directory / TEMPLATE_FILE)
        else:
            template = config.get("chat_template")
            if isinstance(template, list):  # several named templates: the default one, as transformers picks it
                named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
                template = named.get("default")
        if template is not None and not isinstance(template, str):
            raise BadInput(str(directory / TOKENIZER_CONFIG), "chat_template: expected the template's text")
        tokens = {**_json(directory / SPECIAL_TOKENS_MAP), **config}
        special = {name: _token_text(tokens[name]) for name in SPECIAL_TOKEN_NAMES if tokens.get(name) is not None}
        return cls(template, {k: v for k, v in special.items() if v is not None})


@dataclass(frozen=True)
class ModelFiles:
    """What planning reads of a model without loading it: its directory when it is here (its tokenizer), and
    its chat template and special tokens (a replay's are the recorded ones, so that a run whose model
    directory has gone still renders its prompts)."""

    directory: Path | None
    chat: ModelChat | None
    where: str = "model.path"  # the field or record it comes from, for error messages
    judge: ModelFiles | None = None  # a rubric's judges' model when it is another (judge_model)
    user: ModelFiles | None = None  # the model playing a world's simulated user when it is another (user_model)
    # what the manifest's identity records of the model (id, revision, files by sha256, pinned); None where not known
    pins: Mapping[str, Any] | None = None

    @property
    def judges(self) -> ModelFiles:
        """The model a rubric's judges run on: the judge model, or this one."""
        return self.judge or self


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise BadInput(str(path), f"cannot read the chat template ({exc})") from exc


def _json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise BadInput(str(path), f"not readable JSON ({exc})") from exc
    return data if isinstance(data, dict) else {}


def _token_text(value: Any) -> str | None:
    """A special token as tokenizer files write it: its text, or an AddedToken record holding it."""
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and isinstance(value.get("content"), str):
        return value["content"]
    return None


@dataclass(frozen=True)
class Conversation:
    """What a chat-formatted prompt was rendered from: the messages, the tools (JSON Schema; None: none) and the
    template's extra variables. A chat endpoint (``engine.api=chat``) is sent these and renders them itself; the
    prompt evalrun rendered stays the record, and the server's own rendering must equal it."""

    messages: tuple[Message, ...]
    tools: tuple[Mapping[str, Any], ...] | None = None
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    continue_final: bool = False  # rendered to continue the last message (ChatFormat.render's), not after it


@dataclass(frozen=True)
class ChatFormat:
    """How a run turns messages into prompts: a chat template (the model's or a file's), the special
    tokens it reads and the task's extra template variables."""

    template: str
    special_tokens: Mapping[str, str]
    kwargs: Mapping[str, Any]
    origin: Literal["model", "file"]

    def render(self, messages: Sequence[Message], tools: Sequence[Mapping[str, Any]] | None = None,
               continue_final: bool = False) -> str:  # fmt: skip
        """The prompt of ``messages`` with the generation prompt added (the model's turn comes next), or with
        ``continue_final`` cut at the end of the last message, which the model continues (transformers'
        ``continue_final_message``: an answer's start, lm-eval's ``gen_prefix``)."""
        from transformers.utils.chat_template_utils import render_jinja_template

        variables = {**self.special_tokens, **self.kwargs}  # as apply_chat_template: kwargs win over tokens
        try:
            rendered, _ = render_jinja_template([list(messages)], tools=list(tools) if tools is not None else None,
                                                chat_template=self.template, add_generation_prompt=not continue_final,
                                                continue_final_message=continue_final, **variables)  # fmt: skip
        except Exception as exc:  # jinja2 errors and the template's own raise_exception
            raise BadInput(f"chat template ({self.origin})", f"cannot render the messages: {exc}") from exc
        return str(rendered[0])

    def conversation(self, messages: Sequence[Message], tools: Sequence[Mapping[str, Any]] | None = None,
                     continue_final: bool = False) -> Conversation:  # fmt: skip
        """What :meth:`render` renders, for an engine that takes the chat itself."""
        return Conversation(tuple(messages), tuple(tools) if tools is not None else None, dict(self.kwargs),
                            continue_final)  # fmt: skip

    def renders_tools(self) -> bool:
        """Whether the template puts the tools it is given into the prompt (a template may read ``tools`` and still
        drop them, or never read them): a probe tool rendered, and looked for by its name."""
        probe = {"type": "function", "function": {"name": TOOL_PROBE, "description": "A probe.",
                                                  "parameters": {"type": "object", "properties": {}}}}  # fmt: skip
        try:
            return TOOL_PROBE in self.render([{"role": "user", "content": "Hello."}], tools=[probe])
        except BadInput:  # a template that refuses tools (its raise_exception) does not render them either
            return False

    def unread_variables(self) -> list[str]:
        """The task's template variables (``kwargs``) the template never reads: settings that cannot take effect."""
        import jinja2.meta
        from transformers.utils.chat_template_utils import _compile_jinja_template

        environment = _compile_jinja_template(self.template).environment
        read = jinja2.meta.find_undeclared_variables(environment.parse(self.template))
        return sorted(k for k in self.kwargs if k not in read)

    @property
    def customised(self) -> bool:
        """Another template than the model's, or template variables of the task's."""
        return self.origin != "model" or bool(self.kwargs)

    def as_record(self) -> dict[str, Any]:
        """What the prompt-pack digest part covers of it: the template by hash, tokens and kwargs by value."""
        return {
            "template_sha256": sha256_hex(self.template),
            "origin": self.origin,
            "special_tokens": dict(sorted(self.special_tokens.items())),
            "kwargs": dict(sorted(self.kwargs.items())),
        }


def chat_format(mode: str | None, model: ModelChat | None, template_file: Path | None,
                kwargs: Mapping[str, Any] | None, model_where: str) -> ChatFormat | None:  # fmt: skip
    """The chat format a task asks for (``task.chat_format``: auto, chat or plain; None is auto), or None
    for plain text prompts. ``auto`` is chat when there is a template, the model's or ``template_file``."""
    mode = mode or "auto"
    if mode == "plain":
        return None
    tokens = model.special_tokens if model is not None else {}
    if template_file is not None:
        return _read_by_template(ChatFormat(_read(template_file), tokens, dict(kwargs or {}), "file"), template_file)
    if model is None or model.template is None:
        if mode == "chat":
            raise BadInput("task.chat_format", f"chat, but the model ({model_where}) has no chat template: give "
                                               "task.chat_template=FILE, or task.chat_format=plain")  # fmt: skip
        return None
    return _read_by_template(ChatFormat(model.template, tokens, dict(kwargs or {}), "model"), model_where)


def _read_by_template(chat: ChatFormat, where: str | Path) -> ChatFormat:
    """``chat``, whose template reads every variable the task gives it (a BadInput naming the first it never reads,
    and the template: a setting that cannot take effect is refused before the model loads)."""
    unread = chat.unread_variables()
    if unread:
        why = (
            f"the chat template ({chat.origin}: {where}) never reads {', '.join(unread)}, so it would change "
            "nothing: give a template that does (task.chat_template=FILE), or leave it out"
        )
        raise BadInput(f"task.chat_template_kwargs.{unread[0]}", why)
    return chat
