"""Re-baselines for the gate (issue 14, item 6): ``evalrun rebaseline OLD NEW --reason`` writes
NEW/rebaseline.json, ``verify`` checks it, ``gate`` cites it and, blocked on differing digests, points
to it. Engine-free on copies of the golden runs (one model, two digests); one e2e test re-baselines a
seed-set change on the real engine."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from evalrun.analysis.gate import gate_paths
from evalrun.audit.rebaseline import rebaseline_runs
from evalrun.audit.verify import verify_run
from evalrun.cli import main
from evalrun.errors import BadInput, CheckFailed
from evalrun.records.canonical import canonical_json, file_sha256
from evalrun.records.formats import REBASELINE_FORMAT, FieldChange, Record, seal_of
from evalrun.rundir import layout, writer
from evalrun.rundir.attest import write_attestation
from evalrun.rundir.reader import load_record, read_rebaseline

GOLDEN = Path(__file__).resolve().parent / "golden"
REASON = "multiple-choice prompts replace free answers"


@pytest.fixture
def runs(tmp_path: Path) -> tuple[Path, Path]:
    """Copies of the golden runs: ``old`` (addition) and ``new`` (addition_mc), same model, other digest."""
    return (Path(shutil.copytree(GOLDEN / "addition-v1", tmp_path / "old")),
            Path(shutil.copytree(GOLDEN / "mc-v1", tmp_path / "new")))  # fmt: skip


def manifest_of(run: Path) -> dict[str, Any]:
    return json.loads((run / layout.MANIFEST).read_text(encoding="utf-8"))


def edit_manifest_and_rehash(run: Path, change: Callable[[dict[str, Any]], None]) -> None:
    """A consistent rewrite (every file hash, the seal, the attestation): the run still verifies."""
    manifest = manifest_of(run)
    change(manifest)
    writer.write_json(run / layout.MANIFEST, manifest)
    rundir = layout.RunDir(run)
    record = load_record(rundir)
    files = {rel: file_sha256(run / rel) for rel in record.files}
    forged = Record.model_validate({**record.as_record(), "files": files, "manifest_sha256": files[layout.MANIFEST]})
    forged = forged.model_copy(update={"seal": seal_of(forged)})
    writer.write_json(rundir.record, forged)
    write_attestation(rundir, forged, None)


# --- evalrun rebaseline -----------------------------------------------------------------------------


def test_rebaseline_records_both_runs_the_reason_and_what_changed(
    runs: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    old, new = runs
    files_before = sorted(p.relative_to(old) for p in old.rglob("*"))
    assert main(["rebaseline", str(old), str(new), "--reason", REASON]) == 0
    out = capsys.readouterr().out
    assert f"ok: wrote {new / layout.REBASELINE}" in out and REASON in out
    record = read_rebaseline(layout.RunDir(new))
    assert record is not None and record.format == REBASELINE_FORMAT and record.reason == REASON
    text = (new / layout.REBASELINE).read_text()
    assert text == canonical_json(record.as_record()) + "\n"
    for side, run in ((record.old, old), (record.new, new)):
        report = verify_run(run, jobs=1)
        assert side.run == run.name and side.digest.as_record() == manifest_of(run)["digest"]
        assert (side.merkle_root, side.seal) == (report.merkle_root, report.seal)
    assert record.changed_parts == ["prompt_pack", "scoring"]  # the seed set is the same
    changes = {c.field: c for c in record.changes}
    assert changes["task.scorer.name"] == FieldChange(field="task.scorer.name", old="exact_match", new="choice")
    assert changes["decoding.max_tokens"].old == 16 and changes["decoding.max_tokens"].new == 4
    assert changes["task.prompt_pack.name"].old is None  # absent in the old manifest
    assert not [f for f in changes if f.endswith(".path") or f.startswith(("started_at", "workers", "identity"))]
    assert datetime.fromisoformat(record.created_at).tzinfo is not None
    assert sorted(p.relative_to(old) for p in old.rglob("*")) == files_before  # OLD is not touched
    assert layout.REBASELINE not in load_record(layout.RunDir(new)).files  # written after the seal


def test_verify_accepts_and_checks_a_rebaseline_record(runs: tuple[Path, Path]) -> None:
    old, new = runs
    assert verify_run(new, jobs=1).rebaseline == "absent"
    rebaseline_runs(old, new, REASON, jobs=1)
    report = verify_run(new, jobs=1)
    old_digest = manifest_of(old)["digest"]["digest"]
    assert report.rebaseline == (f"checked: re-baselined from old (digest {old_digest}; prompt_pack, scoring "
                                 f"changed): {REASON}")  # fmt: skip


def _set(record: dict[str, Any], dotted: str, value: Any) -> None:
    *path, last = dotted.split(".")
    for key in path:
        record = record[key]
    record[last] = value


@pytest.mark.parametrize(
    ("dotted", "value", "message"),
    [
        ("new.seal", "e" * 64, r"rebaseline.json: new.seal e{64} is not this run's seal"),
        ("new.merkle_root", "e" * 64, r"rebaseline.json: new.merkle_root e{64} is not this run's root"),
        ("new.digest.scoring", "e" * 64, r"rebaseline.json: new.digest .* is not this run's digest .*: the record "
                                         r"re-baselines another run"),
        ("old.digest.digest", "e" * 64, r"old.digest.digest is not sha256\(prompt_pack \+ seed_set \+ scoring\)"),
        ("changed_parts", ["scoring"], r"changed_parts is \['scoring'\], the digests differ in \['prompt_pack', "
                                       r"'scoring'\]"),
        ("reason", "", r"rebaseline.json: field 'reason': String should have at least 1 character"),
        ("changed_parts", ["model"], r"rebaseline.json: field 'changed_parts.0'"),
        ("created_at", None, r"rebaseline.json: field 'created_at'"),
    ],
)  # fmt: skip
def test_verify_fails_naming_what_is_wrong_in_a_rebaseline_record(
    runs: tuple[Path, Path], dotted: str, value: Any, message: str
) -> None:
    old, new = runs
    rebaseline_runs(old, new, REASON, jobs=1)
    record = json.loads((new / layout.REBASELINE).read_text())
    _set(record, dotted, value)
    writer.write_json(new / layout.REBASELINE, record)
    with pytest.raises(CheckFailed, match=message):
        verify_run(new, jobs=1)


def test_verify_fails_on_a_rebaseline_record_that_is_not_canonical_or_of_another_format(
    runs: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    old, new = runs
    rebaseline_runs(old, new, REASON, jobs=1)
    path = new / layout.REBASELINE
    record = json.loads(path.read_text())
    path.write_text(json.dumps(record, indent=1) + "\n")
    assert main(["verify", str(new)]) == 1
    assert "rebaseline.json: not a canonical JSON object" in capsys.readouterr().err
    writer.write_json(path, {**record, "format": "evalrun.rebaseline/9"})
    assert main(["verify", str(new)]) == 2
    assert "unknown re-baseline format 'evalrun.rebaseline/9'" in capsys.readouterr().err


def test_a_rebaseline_record_copied_into_the_old_run_fails_its_verify(runs: tuple[Path, Path]) -> None:
    old, new = runs
    rebaseline_runs(old, new, REASON, jobs=1)
    shutil.copy(new / layout.REBASELINE, old / layout.REBASELINE)
    with pytest.raises(CheckFailed, match="re-baselines another run"):
        verify_run(old, jobs=1)


def test_equal_digests_are_nothing_to_rebaseline(runs: tuple[Path, Path], tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    again = Path(shutil.copytree(runs[0], tmp_path / "again"))
    assert main(["rebaseline", str(runs[0]), str(again), "--reason", REASON]) == 2
    assert "error: NEW_BASELINE: " in (err := capsys.readouterr().err) and "nothing to re-baseline" in err
    assert not (again / layout.REBASELINE).exists()


def test_another_model_is_not_a_rebaseline(runs: tuple[Path, Path]) -> None:
    old, new = runs
    edit_manifest_and_rehash(new, lambda m: [model["files"].update({"model.safetensors": "0" * 64})
                                             for model in (m["model"], m["identity"]["model"])])  # fmt: skip
    verify_run(new, jobs=1)  # the rewrite is consistent
    with pytest.raises(BadInput, match=r"model.files: model.safetensors sha256 b4156b9\w+ \(OLD\) vs 0{64} \(NEW\)"):
        rebaseline_runs(old, new, REASON, jobs=1)
    assert not (new / layout.REBASELINE).exists()


def test_a_run_that_fails_verify_is_not_rebaselined(runs: tuple[Path, Path],
                                                    capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    old, new = runs
    summary = old / layout.SUMMARY
    summary.write_text(summary.read_text().replace("1", "2", 1))
    assert main(["rebaseline", str(old), str(new), "--reason", REASON]) == 1
    assert f"{old} fails verify, nothing was re-baselined: summary.json" in capsys.readouterr().err
    assert not (new / layout.REBASELINE).exists()


def test_a_reason_is_required_and_a_record_is_not_overwritten(runs: tuple[Path, Path]) -> None:
    old, new = runs
    with pytest.raises(BadInput, match="--reason: expected why"):
        rebaseline_runs(old, new, "  ", jobs=1)
    rebaseline_runs(old, new, REASON, jobs=1)
    before = (new / layout.REBASELINE).read_bytes()
    with pytest.raises(BadInput, match="exists: the run records a re-baseline already"):
        rebaseline_runs(old, new, "another reason", jobs=1)
    assert (new / layout.REBASELINE).read_bytes() == before


# --- gate ----------------------------------------------------------------------------------------------


def _with_digest(run: Path, digest: dict[str, str]) -> None:
    """Gate reads, it does not verify: a candidate made under ``digest`` is its manifest saying so."""
    manifest = manifest_of(run)
    manifest["digest"] = dict(digest)
    manifest["identity"]["digest"] = dict(digest)
    writer.write_json(run / layout.MANIFEST, manifest)


def test_gate_cites_the_baselines_rebaseline(runs: tuple[Path, Path], tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    old, new = runs
    candidate = Path(shutil.copytree(new, tmp_path / "candidate"))
    rebaseline_runs(old, new, REASON, jobs=1)
    gate_args = ["gate", str(candidate), str(new), "--rule", "paired", "--metric", "choice_letter"]
    assert main([*gate_args, "--json"]) == 1  # same digest; blocked on the margin (the runs are the same)
    decision = json.loads(capsys.readouterr().out)
    assert decision["reason"].startswith("candidate exceeds baseline by +0.0000, not more than the margin")
    cited = decision["rebaseline"]
    assert cited == json.loads((new / layout.REBASELINE).read_text())
    assert cited["old"]["digest"]["digest"] == manifest_of(old)["digest"]["digest"] and cited["reason"] == REASON
    assert main(gate_args) == 1
    out = capsys.readouterr().out
    assert f"re-baseline: the baseline re-ran old under a new digest ({cited['created_at']}): {REASON}" in out
    assert f"digest        {manifest_of(old)['digest']['digest']}   {manifest_of(new)['digest']['digest']}" in out
    assert "changed digest parts: prompt_pack, scoring; " in out and "task.scorer.name" in out


def test_gate_blocks_a_candidate_of_the_replaced_digest_naming_the_rebaseline(
    runs: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    old, new = runs
    candidate = Path(shutil.copytree(new, tmp_path / "candidate"))
    _with_digest(candidate, manifest_of(old)["digest"])
    rebaseline_runs(old, new, REASON, jobs=1)
    decision = gate_paths(candidate, new, rule="paired", metric="choice_letter")
    assert not decision.passed and decision.rebaseline is not None
    assert decision.reason == (f"digests differ (prompt_pack, scoring): the candidate was run under the digest the "
                               f"baseline replaced (the baseline re-baselined old: {REASON}); run the candidate under "
                               "the baseline's prompt pack, seed set and scorer")  # fmt: skip
    assert main(["gate", str(candidate), str(new), "--rule", "paired", "--metric", "choice_letter"]) == 1
    assert (
        "blocked: digests differ (prompt_pack, scoring): the candidate was run under the digest the baseline "
        "replaced" in capsys.readouterr().err
    )


def test_gate_on_differing_digests_points_to_rebaseline(runs: tuple[Path, Path], tmp_path: Path) -> None:
    _old, new = runs
    candidate = Path(shutil.copytree(new, tmp_path / "candidate"))
    _with_digest(candidate, {**manifest_of(new)["digest"], "seed_set": "5" * 64, "digest": "6" * 64})
    decision = gate_paths(candidate, new, rule="paired", metric="choice_letter")
    assert not decision.passed and decision.rebaseline is None
    assert decision.reason.startswith("digests differ (seed_set): the runs are not comparable; if the prompt pack, "
                                      "seed set or scorer changed on purpose, re-run the baseline under the "
                                      "candidate's, record it with `evalrun rebaseline OLD_BASELINE NEW_BASELINE "
                                      "--reason TEXT`")  # fmt: skip


def test_gate_refuses_a_rebaseline_record_of_another_run(runs: tuple[Path, Path], tmp_path: Path) -> None:
    old, new = runs
    rebaseline_runs(old, new, REASON, jobs=1)
    baseline = Path(shutil.copytree(new, tmp_path / "baseline"))
    _with_digest(baseline, {**manifest_of(new)["digest"], "digest": "7" * 64})
    with pytest.raises(CheckFailed, match=r"rebaseline.json: re-baselines to digest \w{64}, the baseline's digest is "
                                          r"7{64}"):  # fmt: skip
        gate_paths(baseline, baseline, rule="paired", metric="choice_letter")


# --- the real engine: a seed-set change ---------------------------------------------------------------


def test_a_seed_set_change_rebaselined_on_real_runs(run_eval, capsys: pytest.CaptureFixture[str]) -> None:
    old = run_eval("limit=2")
    new = run_eval("limit=2", "seeds.master=99")
    candidate = run_eval("limit=2", "seeds.master=99")
    assert main(["rebaseline", str(old), str(new), "--reason", "new master seed for the 2027 suite"]) == 0
    record = read_rebaseline(layout.RunDir(new))
    assert record is not None and record.changed_parts == ["seed_set"]
    changes = {c.field: (c.old, c.new) for c in record.changes}
    assert changes["seeds.master"] == changes["digest_inputs.seed_set.master"] == (1234, 99)
    assert verify_run(new, jobs=1).rebaseline.startswith(f"checked: re-baselined from {old.name}")
    capsys.readouterr()
    assert main(["gate", str(candidate), str(new), "--rule", "paired", "--json"]) == 1  # equal: not above the margin
    decision = json.loads(capsys.readouterr().out)
    assert decision["rebaseline"]["reason"] == "new master seed for the 2027 suite"
    assert not decision["reason"].startswith("digests differ")
    assert main(["gate", str(old), str(new), "--rule", "paired"]) == 1
    assert "the candidate was run under the digest the baseline replaced" in capsys.readouterr().err
    assert main(["gate", str(candidate), str(old), "--rule", "paired"]) == 1
    assert "`evalrun rebaseline OLD_BASELINE NEW_BASELINE --reason TEXT`" in capsys.readouterr().err
