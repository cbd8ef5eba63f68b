"""Per-episode hash chains (DESIGN.md "Chained episode log").

Each entry is one canonical JSON line; ``hash_0 = "0" * 64`` and
``hash_i = sha256(hash_{i-1} + line_i)``. The last hash is the episode head.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from evalrun.records.canonical import canonical_json

GENESIS = "0" * 64
SCHEDULE_FORMAT = "evalrun.schedule/1"
ENTRY_KINDS = frozenset({"header", "model", "tool", "clock", "random", "join", "score", "end"})


def link(prev: str, line: str) -> str:
    return hashlib.sha256((prev + line).encode("utf-8")).hexdigest()


@dataclass
class ChainBuilder:
    """Builds one episode's chain; ``append`` fills in ``episode``, ``seq`` and ``prev``."""

    episode: str
    lines: list[str] = field(default_factory=list)
    head: str = GENESIS

    def append(self, kind: str, **fields: Any) -> str:
        if kind not in ENTRY_KINDS:
            raise ValueError(f"unknown chain entry kind {kind!r}")
        entry = {**fields, "episode": self.episode, "seq": len(self.lines), "kind": kind, "prev": self.head}
        line = canonical_json(entry)
        self.lines.append(line)
        self.head = link(self.head, line)
        return line


def chain_head(lines: Iterable[str]) -> str:
    head = GENESIS
    for line in lines:
        head = link(head, line)
    return head
