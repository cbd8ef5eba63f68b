"""Anchored roots (issue 14, item 5): ``evalrun anchor`` appends a run's seal, digest and Merkle root to a
ledger that is itself a hash chain; ``evalrun verify --ledger`` catches a run directory a forger rewrote
consistently (it passes plain verify), a ledger whose chain is broken, and a run that was never anchored.

Engine-free on copies of the golden runs; one e2e test forges a copy of the shared ``audit_run``.
"""

from __future__ import annotations

import json
import shutil
import threading
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from evalrun.audit.ledger import anchor_run, check_anchored, parse_ledger, read_ledger, verify_anchored
from evalrun.audit.verify import verify_run
from evalrun.cli import main
from evalrun.errors import BadInput, CheckFailed
from evalrun.records.canonical import canonical_json, file_sha256
from evalrun.records.chain import GENESIS, chain_head, link
from evalrun.records.formats import LEDGER_FORMAT, LedgerEntry, Record, seal_of
from evalrun.records.merkle import merkle_root
from evalrun.rundir import layout, writer
from evalrun.rundir.attest import write_attestation
from evalrun.rundir.reader import load_record, read_outputs

GOLDEN = Path(__file__).resolve().parent / "golden"


@pytest.fixture
def runs(tmp_path: Path) -> tuple[Path, Path]:
    """Copies of the two golden runs (one model, two digests)."""
    return (Path(shutil.copytree(GOLDEN / "addition-v1", tmp_path / "addition")),
            Path(shutil.copytree(GOLDEN / "mc-v1", tmp_path / "mc")))  # fmt: skip


def forge_one_logprob(run: Path) -> tuple[str, float, float]:
    """Rewrite ``run`` as a careful forger would: one token logprob of the first model entry changed in
    its chain line and its output row, the episode's chain re-linked, the row's head, the Merkle root,
    record.json's file hashes and seal, and the attestation recomputed. Returns (episode, old, new)."""
    rundir = layout.RunDir(run)
    record = load_record(rundir)
    log_rel = sorted(rel for rel in record.files if rel.startswith(f"{layout.LOG}/"))[0]
    out_rel = f"{layout.OUTPUTS}/{Path(log_rel).stem}.parquet"
    lines = (run / log_rel).read_text(encoding="utf-8").split("\n")[:-1]
    values = [json.loads(line) for line in lines]
    assert [canonical_json(v) for v in values] == lines  # lines re-encode to their own bytes
    at = next(i for i, v in enumerate(values) if v["kind"] == "model" and v["response"]["logprobs"])
    episode = values[at]["episode"]
    old = values[at]["response"]["logprobs"][0]
    new = values[at]["response"]["logprobs"][0] = old - 0.25
    head = GENESIS
    for i, value in enumerate(values):
        if value["episode"] == episode:
            value["prev"] = head
            lines[i] = canonical_json(value)
            head = link(head, lines[i])
    writer.write_atomic(run / log_rel, "".join(line + "\n" for line in lines).encode("utf-8"))
    table = pq.read_table(run / out_rel)
    rows = table.to_pylist()
    (row,) = [r for r in rows if r["episode_id"] == episode]
    row["token_logprobs"][0], row["head"] = new, head
    writer.write_atomic(run / out_rel, writer.table_bytes(pa.Table.from_pylist(rows, schema=table.schema)))
    heads = read_outputs(rundir, ["episode_id", "head"]).to_pydict()
    files = {rel: file_sha256(run / rel) for rel in record.files}
    root = merkle_root(zip(heads["episode_id"], heads["head"], strict=True))
    forged = Record.model_validate({**record.as_record(), "files": files, "merkle_root": root})
    forged = forged.model_copy(update={"seal": seal_of(forged)})
    writer.write_json(rundir.record, forged)
    write_attestation(rundir, forged, None)
    return episode, old, new


def ledger_lines(ledger: Path) -> list[str]:
    return ledger.read_text(encoding="utf-8").split("\n")[:-1]


# --- anchor ---------------------------------------------------------------------------------------


def test_anchor_appends_chained_entries_with_the_verified_seal_digest_and_root(
    runs: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    addition, mc = runs
    ledger = tmp_path / "ledger.jsonl"
    assert main(["anchor", str(addition), str(ledger)]) == 0
    out = capsys.readouterr().out
    assert f"ok: anchored run addition at {ledger} line 1" in out
    second = anchor_run(mc, ledger, jobs=1)
    lines = ledger_lines(ledger)
    assert len(lines) == 2 and second.appended and second.line.number == 2
    entries = [LedgerEntry.model_validate_json(line) for line in lines]
    assert [canonical_json(e.as_record()) for e in entries] == lines  # canonical, typed
    assert [e.seq for e in entries] == [0, 1] and [e.run for e in entries] == ["addition", "mc"]
    assert entries[0].prev == GENESIS and entries[1].prev == link(GENESIS, lines[0])
    assert second.head == chain_head(lines) == read_ledger(ledger).head  # the chain hashing of episode chains
    assert f"ledger head: {link(GENESIS, lines[0])}" in out  # the head printed after the first anchor
    for run, entry in zip(runs, entries, strict=True):
        report = verify_run(run, jobs=1)
        record = load_record(layout.RunDir(run))
        assert entry.format == LEDGER_FORMAT
        assert (entry.seal, entry.digest, entry.merkle_root) == (report.seal, record.digest, record.merkle_root)
    status = verify_anchored(addition, ledger, jobs=1).ledger
    assert status == f"anchored at {ledger} line 1 of 2; ledger head {second.head}"


def test_anchoring_the_same_run_again_changes_nothing(
    runs: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ledger = tmp_path / "ledger.jsonl"
    first = anchor_run(runs[0], ledger, jobs=1)
    before = ledger.read_bytes()
    assert main(["anchor", str(runs[0]), str(ledger)]) == 0
    assert "is anchored at" in capsys.readouterr().out and ledger.read_bytes() == before
    again = anchor_run(runs[0], ledger, jobs=1)
    assert not again.appended and again.line == first.line and again.head == first.head


def test_a_run_name_anchored_with_another_seal_is_refused_naming_the_line(
    runs: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ledger = tmp_path / "ledger.jsonl"
    anchor_run(runs[1], ledger, jobs=1)
    original = anchor_run(runs[0], ledger, jobs=1).line.entry.seal
    forge_one_logprob(runs[0])
    before = ledger.read_bytes()
    forged = verify_run(runs[0], jobs=1).seal
    assert main(["anchor", str(runs[0]), str(ledger)]) == 1
    err = capsys.readouterr().err
    assert (f"check failed: {ledger}:2: run addition was anchored there with seal {original}; the run's seal is "
            f"{forged}") in err  # fmt: skip
    assert ledger.read_bytes() == before


def test_a_run_that_fails_verify_is_not_anchored(runs: tuple[Path, Path], tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    ledger = tmp_path / "ledger.jsonl"
    summary = runs[0] / layout.SUMMARY
    summary.write_text(summary.read_text().replace("1", "2", 1))
    assert main(["anchor", str(runs[0]), str(ledger)]) == 1
    err = capsys.readouterr().err
    assert f"check failed: {runs[0]} is not anchored: it fails verify: summary.json" in err
    assert not ledger.exists()


def test_concurrent_appends_are_serialised_by_the_lock(tmp_path: Path) -> None:
    """Each appender reads the ledger and appends the next line under the lock: none is lost or doubled."""
    path = tmp_path / "ledger.jsonl"
    start = threading.Barrier(8)

    def next_line(data: bytes) -> tuple[None, bytes]:
        return None, b"%d\n" % len(data.splitlines())

    def append() -> None:
        start.wait()
        for _ in range(25):
            writer.append_locked(path, next_line)

    threads = [threading.Thread(target=append) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert path.read_text().split("\n")[:-1] == [str(k) for k in range(200)]


# --- verify --ledger -------------------------------------------------------------------------------


def test_a_consistently_forged_run_passes_verify_and_fails_verify_ledger(
    runs: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = runs[0]
    ledger = tmp_path / "ledger.jsonl"
    anchored = anchor_run(run, ledger, jobs=1)
    episode, old, new = forge_one_logprob(run)
    assert old != new
    assert f'"logprobs":[{canonical_json(new)},' in (run / "log" / "part-00000.jsonl").read_text()
    rows = read_outputs(layout.RunDir(run), ["episode_id", "token_logprobs"]).to_pylist()
    assert [r["token_logprobs"][0] for r in rows if r["episode_id"] == episode] == [new]
    forged = verify_run(run, jobs=1)  # plain verify: every hash agrees
    assert forged.seal != anchored.line.entry.seal and forged.merkle_root != anchored.line.entry.merkle_root
    assert main(["verify", str(run)]) == 0
    capsys.readouterr()
    assert main(["verify", str(run), "--ledger", str(ledger)]) == 1
    err = capsys.readouterr().err
    assert (f"check failed: run addition was anchored at {ledger} line 1 with seal {anchored.line.entry.seal}; "
            f"the run's seal is {forged.seal}") in err  # fmt: skip


def test_an_unanchored_run_fails_verify_ledger(runs: tuple[Path, Path], tmp_path: Path) -> None:
    ledger = tmp_path / "ledger.jsonl"
    anchor_run(runs[0], ledger, jobs=1)
    with pytest.raises(CheckFailed, match=rf"{ledger}: run mc is not anchored there \(the ledger holds 1 entry\)$"):
        verify_anchored(runs[1], ledger, jobs=1)
    renamed = runs[0].rename(tmp_path / "renamed")  # the same run under another name: not anchored, but said so
    with pytest.raises(CheckFailed, match=r"run renamed is not anchored .*; line 1 anchors the run's seal under the "
                                          r"name 'addition'"):  # fmt: skip
        verify_anchored(renamed, ledger, jobs=1)


def test_a_missing_ledger_is_bad_input(runs: tuple[Path, Path], tmp_path: Path,
                                       capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    assert main(["verify", str(runs[0]), "--ledger", str(tmp_path / "none.jsonl")]) == 2
    assert "no such ledger" in capsys.readouterr().err
    assert main(["verify", str(runs[0]), "--ledger-head", "a" * 64]) == 2
    assert "--ledger-head: needs --ledger" in capsys.readouterr().err


def _edit(line: str, **changes: object) -> str:
    return canonical_json({**json.loads(line), **changes})


@pytest.mark.parametrize(
    ("tamper", "message"),
    [
        (lambda lines: [_edit(lines[0], seal="f" * 64), lines[1]], r":2: prev does not match the hash of the ledger"),
        (lambda lines: [lines[0], _edit(lines[1], seq=5)], r":2: seq 5, expected 1"),
        (lambda lines: [lines[0], lines[1].replace(",", ", ", 1)], r":2: not canonical JSON"),
        (lambda lines: [lines[0], lines[1][:-1]], r":2: not JSON"),
        (lambda lines: [lines[0], _edit(lines[1], format="evalrun.ledger/0")], r":2: format 'evalrun.ledger/0'"),
        (lambda lines: [lines[0], _edit(lines[1], seal="F" * 64)], r":2: field 'seal': String should match"),
        (lambda lines: [lines[0], _edit(lines[1], extra=1)], r":2: field 'extra': Extra inputs are not permitted"),
        (lambda lines: [lines[0], _edit(lines[1], run="addition")], r":2: run addition anchored again \(first at "
                                                                    r"line 1\)"),
    ],
)  # fmt: skip
def test_a_tampered_ledger_line_is_named(runs: tuple[Path, Path], tmp_path: Path, tamper, message: str) -> None:
    ledger = tmp_path / "ledger.jsonl"
    for run in runs:
        anchor_run(run, ledger, jobs=1)
    ledger.write_text("".join(line + "\n" for line in tamper(ledger_lines(ledger))))
    with pytest.raises(CheckFailed, match=rf"^{ledger}{message}"):
        verify_anchored(runs[0], ledger, jobs=1)
    with pytest.raises(CheckFailed, match=rf"^{ledger}{message}"):  # nor is anything appended to a broken ledger
        anchor_run(runs[0], ledger, jobs=1)


def test_a_truncated_last_line_is_named(tmp_path: Path) -> None:
    with pytest.raises(CheckFailed, match=r"ledger.jsonl:1: truncated"):
        parse_ledger(tmp_path / "ledger.jsonl", b'{"format":')


def test_a_rewritten_ledger_is_caught_by_its_published_head(runs: tuple[Path, Path], tmp_path: Path) -> None:
    """A forger who also rewrites the ledger consistently (the forged seal, every later line re-chained)
    passes ``--ledger`` alone; the head published after the anchor catches it."""
    run, other = runs
    ledger = tmp_path / "ledger.jsonl"
    published = anchor_run(run, ledger, jobs=1).head
    later = anchor_run(other, ledger, jobs=1).head
    assert check_anchored(verify_run(run, jobs=1), ledger, published).endswith("--ledger-head is its head after line 1")
    assert "head after line 2" in check_anchored(verify_run(run, jobs=1), ledger, later)
    with pytest.raises(CheckFailed, match=r"--ledger-head: .* does not pass through 0{64}"):  # not one of its heads
        check_anchored(verify_run(run, jobs=1), ledger, "0" * 64)

    forge_one_logprob(run)
    forged = verify_run(run, jobs=1)
    lines, head = [], GENESIS
    for seq, line in enumerate(ledger_lines(ledger)):
        changes = {"seal": forged.seal, "merkle_root": forged.merkle_root} if seq == 0 else {}
        lines.append(_edit(line, prev=head, **changes))
        head = link(head, lines[-1])
    ledger.write_text("".join(line + "\n" for line in lines))
    assert "line 1 of 2" in check_anchored(forged, ledger)  # the rewritten ledger holds together
    with pytest.raises(CheckFailed, match=rf"--ledger-head: the chain of {ledger} does not pass through {published}"):
        check_anchored(forged, ledger, published)
    assert main(["verify", str(run), "--ledger", str(ledger), "--ledger-head", published]) == 1


def test_a_head_published_before_the_run_was_anchored_does_not_cover_it(runs: tuple[Path, Path],
                                                                        tmp_path: Path) -> None:  # fmt: skip
    ledger = tmp_path / "ledger.jsonl"
    early = anchor_run(runs[1], ledger, jobs=1).head
    anchor_run(runs[0], ledger, jobs=1)
    with pytest.raises(CheckFailed, match=r"head after line 1, before run addition was anchored at line 2"):
        check_anchored(verify_run(runs[0], jobs=1), ledger, early)


def test_a_ledger_that_is_a_directory_is_bad_input(runs: tuple[Path, Path], tmp_path: Path) -> None:
    with pytest.raises(BadInput, match="a directory; expected a ledger file"):
        anchor_run(runs[0], tmp_path, jobs=1)


# --- on a run of today's code (the real engine) ------------------------------------------------------


def test_a_forged_run_of_the_current_code_fails_verify_ledger(audit_run: Path, tmp_path: Path) -> None:
    run = Path(shutil.copytree(audit_run, tmp_path / audit_run.name))
    ledger = tmp_path / "ledger.jsonl"
    anchored = anchor_run(run, ledger, jobs=1).line.entry
    forge_one_logprob(run)
    forged = verify_run(run, jobs=1)
    assert forged.seal != anchored.seal
    with pytest.raises(CheckFailed, match=rf"run {run.name} was anchored at {ledger} line 1 with seal "
                                          rf"{anchored.seal}; the run's seal is {forged.seal}"):  # fmt: skip
        verify_anchored(run, ledger, jobs=1)
