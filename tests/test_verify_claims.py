"""Verify cross-checks every claim a manifest records twice (``identity`` and the section that says the same): a
forger who edits one side and re-seals the run, so that every hash holds, fails plain verify naming both fields.
Engine-free: the forgeries are made on copies of the golden runs (a dataset run and an agent run)."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from helpers.forgery import reseal
from helpers.forgery import set_field as _set

from evalrun.audit.verify import verify_run
from evalrun.errors import CheckFailed
from evalrun.rundir import layout

GOLDEN = Path(__file__).resolve().parent / "golden"
OTHER = "0" * 64

Forgery = Callable[[dict[str, Any]], None]


# (golden run, the forgery, the two fields verify must name: identity's, then the section's)
FORGERIES = [
    ("addition-v1", _set("model.files.config\x00json", OTHER), "model.files.config.json", "model.files.config.json"),
    ("addition-v1", _set("identity.model.files.config\x00json", OTHER), "model.files.config.json",
     "model.files.config.json"),
    ("addition-v1", _set("model.id", "someone/else"), "model.id", "model.id"),
    ("addition-v1", _set("identity.decoding.max_tokens", 17), "decoding.max_tokens", "decoding.max_tokens"),
    ("addition-v1", _set("identity.seeds.master", 99), "seeds.master", "seeds.master"),
    ("addition-v1", _set("limit", 5), "limit", "limit"),
    ("addition-v1", _set("generator.git_commit", "f" * 40), "generator.git_commit", "generator.git_commit"),
    ("addition-v1", _set("task.dataset.sha256", OTHER), "task.dataset_sha256", "task.dataset_sha256"),
    ("addition-v1", _set("task.scorer.normalize", []), "task.scorer.normalize", "task.scorer.normalize"),
    ("invoice-desk-model-v1", _set("identity.task.world.seeds", [1, 2, 3]), "task.world.seeds", "task.world.seeds"),
    ("invoice-desk-model-v1", _set("judge_model", {"id": "x", "revision": None, "files": {}, "pinned": True}),
     "judge_model", "judge_model"),
]  # fmt: skip


def _forged(tmp_path: Path, golden: str, forge: Forgery) -> Path:
    run = Path(shutil.copytree(GOLDEN / golden, tmp_path / golden))
    manifest = json.loads((run / layout.MANIFEST).read_text())
    forge(_with_dotted_keys(manifest))
    (run / layout.MANIFEST).write_text(json.dumps(_restore_dots(manifest)))
    reseal(run)
    return run


def _with_dotted_keys(manifest: dict[str, Any]) -> dict[str, Any]:
    """File names with a dot (config.json) are written config\\x00json in the forgeries' paths."""
    for model in (manifest.get("model"), manifest.get("identity", {}).get("model")):
        if isinstance(model, dict) and isinstance(model.get("files"), dict):
            model["files"] = {k.replace(".", "\x00"): v for k, v in model["files"].items()}
    return manifest


def _restore_dots(value: Any) -> Any:
    if isinstance(value, dict):
        return {k.replace("\x00", "."): _restore_dots(v) for k, v in value.items()}
    return value


@pytest.mark.parametrize(("golden", "forge", "recorded", "implied"), FORGERIES)
def test_a_claim_edited_on_one_side_and_resealed_fails_verify_naming_both_fields(
    golden: str, forge: Forgery, recorded: str, implied: str, tmp_path: Path
) -> None:
    verify_run(GOLDEN / golden)  # as recorded, it verifies
    run = _forged(tmp_path, golden, forge)
    with pytest.raises(CheckFailed) as failed:
        verify_run(run)
    assert str(failed.value) == f"{layout.MANIFEST}: identity.{recorded} differs from {implied}"


def test_both_sides_edited_alike_still_verify_as_far_as_this_check_goes(tmp_path: Path) -> None:
    """The check compares the two records; a claim changed on both sides is left to the checks that recompute it
    (here the prompt pack's digest part, which hashes the decoding settings)."""
    run = _forged(tmp_path, "addition-v1", lambda m: (_set("decoding.max_tokens", 17)(m),
                                                     _set("identity.decoding.max_tokens", 17)(m)))  # fmt: skip
    with pytest.raises(CheckFailed, match=r"task\.prompt_pack\.decoding differs from decoding"):
        verify_run(run)


def test_an_identity_without_a_claim_every_run_records_is_refused(tmp_path: Path) -> None:
    run = _forged(tmp_path, "addition-v1", lambda m: m["identity"].pop("model"))
    with pytest.raises(CheckFailed, match=r"manifest\.json: identity\.model is missing"):
        verify_run(run)


def test_a_record_claiming_the_older_seal_for_a_run_made_since_fails_naming_both(tmp_path: Path) -> None:
    """A run sealed under evalrun.seal/2 (its provenance under the seal) whose record.json had ``seal_format``
    removed and was re-sealed as the older format (its provenance outside the seal, free to rewrite): its manifest
    records where its config came from, which only runs made since record, so plain verify refuses it."""
    run = _forged(tmp_path, "addition-v1", _set("config", {"files": {}, "search_path": ["pkg://evalrun.conf"]}))
    record = json.loads((run / layout.RECORD).read_text())
    assert "seal_format" not in record
    with pytest.raises(CheckFailed) as failed:
        verify_run(run)
    assert str(failed.value).startswith(f"{layout.RECORD}: seal_format is missing, but {layout.MANIFEST} has config")
