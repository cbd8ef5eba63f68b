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
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from evalrun.audit.checkpoints import check_anchored_checkpoints
from evalrun.audit.verify import VerifyReport, verify_run
from evalrun.errors import BadInput, CheckFailed
from evalrun.rundir import layout
from evalrun.rundir.ledger import Ledger, LedgerLine, append, parse_ledger, read_ledger, run_name
from evalrun.rundir.reader import load_record

__all__ = ["AnchorResult", "Ledger", "LedgerLine", "anchor_run", "check_anchored", "parse_ledger", "read_ledger",
           "run_name", "verify_anchored"]  # fmt: skip


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
    line, appended, head = append(ledger_path, run_name(run_path), report.seal, report.digest, report.merkle_root)
    return AnchorResult(ledger_path, line, appended=appended, head=head)


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
    run = layout.RunDir(report.run)  # its checkpoints first: a rewritten run is named where it began to differ
    checkpoints = check_anchored_checkpoints(run, ledger, load_record(run)) if run.checkpoints.is_dir() else None
    for field, mine in (("seal", report.seal), ("digest", report.digest), ("merkle_root", report.merkle_root)):
        anchored = getattr(found.entry, field)
        if anchored != mine:
            raise CheckFailed(f"run {name} was anchored at {ledger_path} line {found.number} with {field} "
                              f"{anchored}; the run's {field} is {mine}")  # fmt: skip
    status = f"anchored at {ledger_path} line {found.number} of {len(ledger.lines)}; ledger head {ledger.head}"
    if checkpoints is not None:
        status += f"; {checkpoints}"
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
