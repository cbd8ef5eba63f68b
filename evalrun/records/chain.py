"""Per-episode hash chains (docs/design.md "Chain entries").

Each entry is one canonical JSON line (:mod:`evalrun.records.entries`); ``hash_0 = "0" * 64`` and
``hash_i = sha256(hash_{i-1} + line_i)``. The last hash is the episode head.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from evalrun.records.canonical import sha256_hex
from evalrun.records.entries import Entry, entry_line, request_text

GENESIS = "0" * 64


def link(prev: str, line: str) -> str:
    return hashlib.sha256((prev + line).encode("utf-8")).hexdigest()


@dataclass
class ChainBuilder:
    """Builds one episode's chain from typed entries: the generic encoder (:func:`entry_line`)."""

    episode: str
    lines: list[str] = field(default_factory=list)
    head: str = GENESIS

    def append(self, entry_type: type[Entry], /, **fields: Any) -> str:
        """Add an entry of ``entry_type`` with ``fields``; ``episode``, ``seq`` and ``prev`` are filled
        in, and ``request_hash`` too when the entry has a request and none is given.

        Raises ``ValueError`` (a pydantic ValidationError) for fields the entry type does not have
        or values of the wrong type.
        """
        request_json = None
        if "request" in fields and "request_hash" not in fields and "request_hash" in entry_type.model_fields:
            request_json = request_text(fields["request"])  # made once: hashed, and embedded in the line
            fields["request_hash"] = sha256_hex(request_json)
        entry = entry_type(**fields, episode=self.episode, seq=len(self.lines), prev=self.head)
        line = entry_line(entry, request_json)
        self.lines.append(line)
        self.head = link(self.head, line)
        return line


def chain_head(lines: Iterable[str]) -> str:
    head = GENESIS
    for line in lines:
        head = link(head, line)
    return head
