"""Anchor ledgers, the store: an append-only file of :class:`~evalrun.records.formats.LedgerEntry` lines
(canonical JSON, one per line) that is itself a hash chain, hashed as an episode's chain is
(:mod:`evalrun.records.chain`): ``hash_0 = "0" * 64``, ``hash_i = sha256(hash_{i-1} + line_i)``, each line's
``prev`` the hash before it and ``seq`` its index. The last hash is the ledger's head: the value to publish. A
name is anchored once (a run under its directory's name by ``evalrun anchor``; a run's checkpoints as
``RUN/checkpoint-SEQ`` by the driver); :func:`append` is the one writer (docs/design.md "Ledger").
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from pydantic import ValidationError

from evalrun.errors import BadInput, CheckFailed
from evalrun.records.canonical import canonical_json
from evalrun.records.chain import GENESIS, link
from evalrun.records.formats import LEDGER_FORMAT, LedgerEntry, first_error
from evalrun.rundir import writer


@dataclass(frozen=True)
class LedgerLine:
    number: int  # 1-based line number in the file
    entry: LedgerEntry
    text: str  # the line as written (canonical JSON, no newline)
    head: str  # the ledger's hash after this line


@dataclass(frozen=True)
class Ledger:
    path: Path
    lines: tuple[LedgerLine, ...]

    @property
    def head(self) -> str:
        return self.lines[-1].head if self.lines else GENESIS

    def find(self, run: str) -> LedgerLine | None:
        return next((line for line in self.lines if line.entry.run == run), None)


def run_name(path: Path) -> str:
    """The name a run is anchored under: its directory's name."""
    return path.resolve().name


def parse_ledger(path: Path, data: bytes) -> Ledger:
    """Check a ledger's own chain line by line; CheckFailed naming the first broken line."""
    if data and not data.endswith(b"\n"):
        raise _broken(path, data.count(b"\n") + 1, "truncated: the last line has no newline")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise _broken(path, data[: exc.start].count(b"\n") + 1, "not valid UTF-8") from None
    lines: list[LedgerLine] = []
    seen: dict[str, int] = {}
    head = GENESIS
    for number, line in enumerate(text.split("\n")[:-1], start=1):
        try:
            value = json.loads(line)
        except json.JSONDecodeError as exc:
            raise _broken(path, number, f"not JSON ({exc.msg})") from None
        if not isinstance(value, dict) or value.get("format") != LEDGER_FORMAT:
            found = value.get("format") if isinstance(value, dict) else None
            raise _broken(path, number, f"format {found!r}, expected {LEDGER_FORMAT!r}")
        if canonical_json(value) != line:
            raise _broken(path, number, "not canonical JSON (RFC 8785)")
        try:
            entry = LedgerEntry.model_validate(value)
        except ValidationError as exc:
            field, message = first_error(exc)
            raise _broken(path, number, f"field {field!r}: {message}") from None
        if entry.seq != len(lines):
            raise _broken(path, number, f"seq {entry.seq}, expected {len(lines)}")
        if entry.prev != head:
            raise _broken(path, number, "prev does not match the hash of the ledger before this line")
        if entry.run in seen:
            raise _broken(path, number, f"run {entry.run} anchored again (first at line {seen[entry.run]})")
        seen[entry.run] = number
        head = link(head, line)
        lines.append(LedgerLine(number, entry, line, head))
    return Ledger(path, tuple(lines))


def _broken(path: Path, number: int, message: str) -> CheckFailed:
    return CheckFailed(f"{path}:{number}: {message}")


def read_ledger(path: Path) -> Ledger:
    if not path.is_file():
        raise BadInput(str(path), "no such ledger (`evalrun anchor RUN_DIR LEDGER` creates one)")
    return parse_ledger(path, path.read_bytes())


def append(ledger_path: Path, name: str, seal: str, digest: str, merkle_root: str,
           what: str = "run") -> tuple[LedgerLine, bool, str]:  # fmt: skip
    """Append ``name``'s entry to the ledger (created when absent) under an exclusive lock: (its line, whether it
    was appended, the ledger's head after). The same name anchored again with the same seal is a no-op; with
    another seal a CheckFailed naming the ledger line (and ``what`` it anchors: a run, a checkpoint)."""
    if ledger_path.is_dir():
        raise BadInput(str(ledger_path), "a directory; expected a ledger file")

    def decide(data: bytes) -> tuple[tuple[LedgerLine, bool, str], bytes | None]:
        ledger = parse_ledger(ledger_path, data)
        found = ledger.find(name)
        if found is not None:
            if found.entry.seal != seal:
                raise CheckFailed(f"{ledger_path}:{found.number}: {what} {name} was anchored there with seal "
                                  f"{found.entry.seal}; the {what}'s seal is {seal}")  # fmt: skip
            return (found, False, ledger.head), None
        entry = LedgerEntry(
            seq=len(ledger.lines), prev=ledger.head, run=name, seal=seal, digest=digest, merkle_root=merkle_root,
            anchored_at=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        )  # fmt: skip
        text = canonical_json(entry.as_record())
        line = LedgerLine(len(ledger.lines) + 1, entry, text, link(ledger.head, text))
        return (line, True, line.head), (text + "\n").encode("utf-8")

    return writer.append_locked(ledger_path, decide)
