"""Forgeries rewritten consistently (every hash recomputed, record.json and the attestation rewritten):
verify recomputes what it can (score values, the summary, the manifest's sampling settings and seeds
against the chains) and names the file and the figure; what only the manifest says (model files,
hardware) changes the seal, which a user keeps elsewhere. Engine-free, on a run recorded by older code."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from helpers.forgery import reseal as rehash

from evalrun.audit.verify import verify_run
from evalrun.errors import CheckFailed
from evalrun.records.canonical import canonical_json
from evalrun.records.formats import Record, seal_of
from evalrun.rundir import layout, writer
from evalrun.rundir.attest import write_attestation
from evalrun.rundir.reader import load_record, open_run, read_scores
from evalrun.stats.summary import resummarize

GOLDEN = Path(__file__).resolve().parent / "golden" / "addition-v1"


@pytest.fixture
def run(tmp_path: Path) -> Path:
    return Path(shutil.copytree(GOLDEN, tmp_path / "run"))


def edit_manifest(path: Path, change: Callable[[dict], None]) -> None:
    manifest = json.loads((path / layout.MANIFEST).read_text())
    change(manifest)
    (path / layout.MANIFEST).write_text(canonical_json(manifest) + "\n")


def test_an_untouched_run_verifies_against_its_seal(run: Path) -> None:
    seal = verify_run(run).seal
    assert seal is not None
    assert verify_run(run, expect_seal=seal).seal == seal


def test_a_flipped_score_with_a_recomputed_summary_fails_naming_the_score(run: Path) -> None:
    rundir = layout.RunDir(run)
    scores = read_scores(rundir).to_pylist()
    scores[0]["value"] = 1.0 - scores[0]["value"]
    table = pa.Table.from_pylist(scores, schema=read_scores(rundir).schema)
    pq.write_table(table, rundir.scores, compression="zstd")
    stored = json.loads(rundir.summary.read_text())
    writer.write_json(rundir.summary, resummarize(table, stored))
    rehash(run)
    with pytest.raises(CheckFailed, match=rf"scores.parquet: episode {scores[0]['episode_id']} metric exact_match: "
                                          r"value is 0.0, the recorded scorer gives 1.0"):  # fmt: skip
        verify_run(run)


def test_a_forged_temperature_fails_naming_the_setting(run: Path) -> None:
    original = verify_run(run).seal

    def hotter(manifest: dict) -> None:
        manifest["decoding"]["temperature"] = 0.5
        manifest["identity"]["decoding"]["temperature"] = 0.5

    edit_manifest(run, hotter)
    new_seal = rehash(run)
    assert new_seal != original
    with pytest.raises(CheckFailed, match=r"manifest\.json: .*decoding"):  # the pack's settings or the chains'
        verify_run(run)


@pytest.mark.parametrize("field", ["model.files", "model.id", "hardware"])
def test_what_only_the_manifest_says_is_caught_by_the_seal_kept_elsewhere(run: Path, field: str) -> None:
    original = verify_run(run).seal

    def forge(manifest: dict) -> None:  # both records of a claim alike (one alone fails: test_verify_claims.py)
        for model in (manifest["model"], manifest["identity"]["model"]):
            if field == "model.files":
                model["files"]["model.safetensors"] = "0" * 64
            elif field == "model.id":
                model["id"] = "someone/else"
        if field == "hardware":
            manifest["hardware"] = {"gpu": "a better one"}

    edit_manifest(run, forge)
    forged_seal = rehash(run)
    assert forged_seal != original  # a forger who rewrites everything consistently changes the seal
    assert verify_run(run).seal == forged_seal  # plain verify cannot tell: nothing else records these
    with pytest.raises(CheckFailed, match=f"--expect-seal: the run's seal is {forged_seal}, not {original}"):
        verify_run(run, expect_seal=original)


def test_a_record_whose_seal_does_not_match_its_claims_fails(run: Path) -> None:
    rehash(run)
    record = json.loads((run / layout.RECORD).read_text())
    record["seal"] = "f" * 64
    (run / layout.RECORD).write_text(canonical_json(record) + "\n")
    write_attestation(open_run(run), load_record(open_run(run)), None)
    with pytest.raises(CheckFailed, match=r"record.json: seal f{64} is not the seal of the record's claims"):
        verify_run(run)


@pytest.mark.e2e
@pytest.mark.parametrize("change", ["drift erased", "a worker's hardware", "retries"])
def test_rewritten_dispatch_provenance_fails_the_seal_kept_elsewhere(run_eval, change: str) -> None:
    """Everything record.json says is under the seal of a run made now: the workers, their drift and the retries
    too. Rewritten and re-attested, the record fails plain verify; re-sealed as well, it fails --expect-seal (a
    golden run made before keeps its older seal, which left them out: test_logs, test_golden)."""
    run = run_eval("limit=2")
    original = verify_run(run).seal
    record = json.loads((run / layout.RECORD).read_text())
    dispatch = record["dispatch"]
    if change == "drift erased":  # (this run has none: one is written in, as erasing one would be written out)
        dispatch["drift"] = [] if dispatch.get("drift") else [{"worker": "ray-1", "field": "hardware"}]
    elif change == "a worker's hardware":
        dispatch["workers"] = [{**w, "hardware": {"gpu": "a better one"}} for w in dispatch.get("workers") or [{}]]
    else:
        dispatch["retries"] = dispatch.get("retries", 0) + 1
    (run / layout.RECORD).write_text(canonical_json(record) + "\n")
    write_attestation(open_run(run), load_record(open_run(run)), None)
    with pytest.raises(CheckFailed, match=r"record.json: seal .* is not the seal of the record's claims"):
        verify_run(run)
    forged = Record.model_validate({k: v for k, v in record.items() if k != "seal"})
    forged = forged.model_copy(update={"seal": seal_of(forged)})
    writer.write_json(layout.RunDir(run).record, forged)
    write_attestation(open_run(run), forged, None)
    assert verify_run(run).seal == forged.seal != original
    with pytest.raises(CheckFailed, match=f"--expect-seal: the run's seal is {forged.seal}, not {original}"):
        verify_run(run, expect_seal=original)
