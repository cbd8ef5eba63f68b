"""Anchor ledgers: ``evalrun anchor RUN_DIR LEDGER`` and ``evalrun verify RUN_DIR --ledger LEDGER``.

A ledger is an append-only file of :class:`~evalrun.records.formats.LedgerEntry` lines (canonical
JSON, one per line) that is itself a hash chain, hashed as an episode's chain is
(:mod:`evalrun.records.chain`): ``hash_0 = "0" * 64``, ``hash_i = sha256(hash_{i-1} + line_i)``, each
line's ``prev`` the hash before it and ``seq`` its index. The last hash is the ledger's head: the
value to publish. A run is anchored once, under its directory's name, with its seal, digest and
Merkle root as verify recomputed them; a forger who rewrites the whole run directory consistently
changes its seal, which no longer matches the ledger's (docs/design.md "Ledger").
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from evalrun.audit.verify import VerifyReport, verify_run
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


# --- evalrun anchor -------------------------------------------------------------------------------


@dataclass(frozen=True)
class AnchorResult:
    ledger: Path
    line: LedgerLine
    appended: bool  # False: the run was anchored already, with the same seal
    head: str  # the ledger's head after the command

    def as_record(self) -> dict[str, Any]:
        return {"ledger": str(self.ledger), "line": self.line.number, "appended": self.appended,
                "entry": self.line.entry.as_record(), "head": self.head}  # fmt: skip


def anchor_run(run_path: Path, ledger_path: Path, jobs: int = 0) -> AnchorResult:
    """Verify the run, then append its entry to the ledger (created when absent) under an exclusive lock.

    The same run (name and seal) anchored again is a no-op; its name anchored with another seal is a
    CheckFailed naming the ledger line.
    """
    if ledger_path.is_dir():
        raise BadInput(str(ledger_path), "a directory; expected a ledger file")
    try:
        report = verify_run(run_path, jobs=jobs)
    except CheckFailed as exc:
        raise CheckFailed(f"{run_path} is not anchored: it fails verify: {exc}") from exc
    assert report.seal is not None and report.digest is not None  # verify_run sets both
    name = run_name(run_path)

    def decide(data: bytes) -> tuple[AnchorResult, bytes | None]:
        ledger = parse_ledger(ledger_path, data)
        found = ledger.find(name)
        if found is not None:
            if found.entry.seal != report.seal:
                raise CheckFailed(f"{ledger_path}:{found.number}: run {name} was anchored there with seal "
                                  f"{found.entry.seal}; the run's seal is {report.seal}")  # fmt: skip
            return AnchorResult(ledger_path, found, appended=False, head=ledger.head), None
        entry = LedgerEntry(
            seq=len(ledger.lines), prev=ledger.head, run=name, seal=report.seal, digest=report.digest,
            merkle_root=report.merkle_root, anchored_at=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        )  # fmt: skip
        text = canonical_json(entry.as_record())
        line = LedgerLine(len(ledger.lines) + 1, entry, text, link(ledger.head, text))
        return AnchorResult(ledger_path, line, appended=True, head=line.head), (text + "\n").encode("utf-8")

    return writer.append_locked(ledger_path, decide)


# --- evalrun verify --ledger ----------------------------------------------------------------------


def check_anchored(report: VerifyReport, ledger_path: Path, expect_head: str | None = None) -> str:
    """The ledger's own chain, then the verified run against its entry there (seal, digest, Merkle root);
    with ``expect_head``, a head published after the run was anchored: the ledger's chain must pass
    through it at or after the run's line. Returns what was checked; CheckFailed names the mismatch."""
    ledger = read_ledger(ledger_path)
    name = run_name(report.run)
    found = ledger.find(name)
    if found is None:
        same_seal = next((line for line in ledger.lines if line.entry.seal == report.seal), None)
        hint = (f"; line {same_seal.number} anchors the run's seal under the name {same_seal.entry.run!r}"
                if same_seal else "")  # fmt: skip
        held = f"{len(ledger.lines)} {'entry' if len(ledger.lines) == 1 else 'entries'}"
        raise CheckFailed(f"{ledger_path}: run {name} is not anchored there (the ledger holds {held}){hint}")
    for field, mine in (("seal", report.seal), ("digest", report.digest), ("merkle_root", report.merkle_root)):
        anchored = getattr(found.entry, field)
        if anchored != mine:
            raise CheckFailed(f"run {name} was anchored at {ledger_path} line {found.number} with {field} "
                              f"{anchored}; the run's {field} is {mine}")  # fmt: skip
    status = f"anchored at {ledger_path} line {found.number} of {len(ledger.lines)}; ledger head {ledger.head}"
    if expect_head is None:
        return status
    expect = expect_head.lower()
    at = next((line for line in ledger.lines if line.head == expect), None)
    if at is None:
        raise CheckFailed(f"--ledger-head: the chain of {ledger_path} does not pass through {expect} (its head is "
                          f"{ledger.head}): the ledger was rewritten, or that is not one of its heads")  # fmt: skip
    if at.number < found.number:
        raise CheckFailed(f"--ledger-head: {expect} is the ledger's head after line {at.number}, before run "
                          f"{name} was anchored at line {found.number}: it does not cover the run")  # fmt: skip
    return f"{status}; --ledger-head is its head after line {at.number}"


def verify_anchored(path: Path, ledger: Path, ledger_head: str | None = None, **verify: Any) -> VerifyReport:
    """``verify_run(path, **verify)``, then :func:`check_anchored`: the report says where the run is anchored."""
    report = verify_run(path, **verify)
    return dataclasses.replace(report, ledger=check_anchored(report, ledger, ledger_head))
