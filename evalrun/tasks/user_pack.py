"""A user prompt pack: how a model plays a world's simulated user (``task.world.user=model``).

A world that has a simulated user (support-desk's customer) seeds the user's facts (persona and goal) and ships
its own pack beside its module (``World.user_pack``); ``task.world.user_prompt=FILE`` names another. The pack is
one YAML file::

    name: support-desk-customer
    version: "1"
    system: |-                 # Jinja: the user's facts as the world seeds them, and ``end``
      You are {{ name }}, ...
    greeting: "How can I help?"  # optional: the agent's first words, before the user's opening
    end: "###STOP###"          # what the user writes to end the conversation
    decoding: {temperature: 0.0, top_p: 1.0, top_k: 0, max_tokens: 96, stop: []}

The model is shown the system prompt, then the conversation from the user's side: the agent's messages as the
``user`` turns, the user's own (its opening, which the world wrote, and its replies) as the ``assistant`` turns.
A reply holding ``end`` ends the conversation; the marker is cut from what the agent is shown. The pack's file
hash, name and version are recorded with the world (the digest's prompt-pack part), with its decoding settings
as ``task.world.user_decoding`` leaves them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from jinja2 import TemplateError
from pydantic import Field

from evalrun.errors import BadInput
from evalrun.records.canonical import file_sha256
from evalrun.tasks.pack import _compiled, _DecodingSpec, _Strict, parse_yaml_model

USER_DECODING = ("temperature", "top_p", "top_k", "max_tokens", "stop")  # what a pack's decoding may set


class _UserDecodingSpec(_DecodingSpec):
    logprobs: None = None  # a user's replies always record their chosen tokens' logprobs (nondet compares them)


class _UserPackSpec(_Strict):
    name: str = Field(min_length=1)
    version: str = Field(min_length=1)
    system: str = Field(min_length=1)
    greeting: str | None = None
    end: str = Field(min_length=1)
    decoding: _UserDecodingSpec = _UserDecodingSpec()


@dataclass(frozen=True)
class UserPack:
    path: Path
    sha256: str
    name: str
    version: str
    system: str  # a Jinja template of the user's facts and ``end``
    greeting: str | None
    end: str
    decoding: Mapping[str, Any]  # the pack's decoding settings (a subset of USER_DECODING)

    def as_record(self) -> dict[str, Any]:
        """What the world's record (the digest's prompt-pack part) holds of the pack: its file by hash."""
        return {"name": self.name, "version": self.version, "sha256": self.sha256}

    def system_prompt(self, facts: Mapping[str, Any]) -> str:
        """The system prompt of a user with ``facts``; a template that reads a fact the world does not give is
        a BadInput naming the pack."""
        try:
            return _compiled(self.system).render({**facts, "end": self.end})
        except TemplateError as exc:
            raise BadInput(f"{self.path}: system", f"cannot render the user's facts: {exc}") from exc

    def messages(self, facts: Mapping[str, Any], said: Sequence[tuple[str, str]]) -> list[dict[str, str]]:
        """The chat messages a model playing the user is shown, from the conversation ``said`` as ``(speaker,
        text)`` pairs (``user``: the simulated user, ``agent``: the agent), from the user's side."""
        messages = [{"role": "system", "content": self.system_prompt(facts)}]
        if self.greeting is not None:
            messages.append({"role": "user", "content": self.greeting})
        for speaker, text in said:
            messages.append({"role": "assistant" if speaker == "user" else "user", "content": text})
        return messages

    def read_reply(self, text: str) -> tuple[str, bool]:
        """A reply as the agent is shown it (``end`` and what follows it cut, whitespace stripped) and whether the
        user ended the conversation."""
        before, marker, _after = text.partition(self.end)
        return before.strip(), bool(marker)


def load_user_pack(path: Path, field: str = "task.world.user_prompt") -> UserPack:
    """The user prompt pack at ``path``; a missing file or a malformed one is a BadInput naming it."""
    if not path.is_file():
        raise BadInput(field, f"{path}: no such user prompt pack (a YAML file)")
    spec: _UserPackSpec = parse_yaml_model(path, _UserPackSpec)
    try:
        _compiled(spec.system)
    except TemplateError as exc:
        raise BadInput(f"{path}: field system", f"not a valid Jinja template ({exc})") from exc
    decoding = {k: v for k, v in spec.decoding.model_dump().items() if v is not None and k in USER_DECODING}
    return UserPack(path, file_sha256(path), spec.name, spec.version, spec.system, spec.greeting, spec.end, decoding)
