"""``evalrun rebaseline OLD_BASELINE NEW_BASELINE --reason TEXT``: record that a baseline was re-run under a new digest.

Both runs must verify, be runs of the same model (equal model file hashes) and have different
digests. NEW_BASELINE/rebaseline.json (:class:`~evalrun.records.formats.Rebaseline`) then records
both runs' digests (and parts), Merkle roots and seals, the reason, the digest parts that changed
and the fields the two manifests record differently; ``gate`` cites it, ``verify`` checks it
(docs/design.md "Re-baseline").
"""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from evalrun.audit.verify import VerifyReport, verify_run
from evalrun.errors import BadInput, CheckFailed
from evalrun.pipeline.manifest import DIGEST_PARTS
from evalrun.records.fields import differing_fields
from evalrun.records.formats import BaselineRun, DigestRecord, FieldChange, Rebaseline
from evalrun.rundir import layout, writer
from evalrun.rundir.reader import open_run, read_manifest

# The manifest sections compared besides digest_inputs: what decides a run's results. Left out:
# identity (a copy), digest (recorded apart), workers, cluster, git, generator and started_at
# (how and when it ran), and every path (where files were, not what they held).
COMPARED = ("task", "decoding", "seeds", "limit", "episodes", "model", "judge_model", "engine", "determinism",
            "python", "libraries", "hardware")  # fmt: skip


def manifest_changes(old: dict[str, Any], new: dict[str, Any]) -> list[FieldChange]:
    """The fields of digest_inputs (when recorded) and of the :data:`COMPARED` sections that differ."""
    changes = []
    for section in ("digest_inputs", *COMPARED):
        for field, a, b in differing_fields({section: old.get(section)}, {section: new.get(section)}):
            if field.rsplit(".", 1)[-1] != "path":
                changes.append(FieldChange(field=field, old=a, new=b))
    return changes


def _baseline(report: VerifyReport, manifest: dict[str, Any]) -> BaselineRun:
    assert report.seal is not None  # verify_run sets it
    return BaselineRun(run=report.run.resolve().name, digest=DigestRecord.model_validate(manifest["digest"]),
                       merkle_root=report.merkle_root, seal=report.seal)  # fmt: skip


def _verified(path: Path, jobs: int) -> VerifyReport:
    try:
        return verify_run(path, jobs=jobs)
    except CheckFailed as exc:
        raise CheckFailed(f"{path} fails verify, nothing was re-baselined: {exc}") from exc


def _model_difference(old: dict[str, Any], new: dict[str, Any]) -> str | None:
    """What differs between two manifests' model file hashes, or None when they are equal."""
    a, b = old["model"].get("files") or {}, new["model"].get("files") or {}
    if a == b:
        return None
    problems = []
    for name in sorted(set(a) | set(b)):
        if name not in a or name not in b:
            problems.append(f"{name} only in {'OLD' if name in a else 'NEW'}")
        elif a[name] != b[name]:
            problems.append(f"{name} sha256 {a[name]} (OLD) vs {b[name]} (NEW)")
    return "; ".join(problems)


def rebaseline_runs(old_path: Path, new_path: Path, reason: str, jobs: int = 0) -> tuple[Rebaseline, Path]:
    """Check both runs and write NEW_BASELINE/rebaseline.json; returns the record and its path."""
    if not reason.strip():
        raise BadInput("--reason", "expected why the baseline was re-run (e.g. 'scorer 1.1 strips whitespace')")
    new_run = open_run(new_path)
    if new_run.rebaseline.exists():
        raise BadInput(str(new_run.rebaseline), "exists: the run records a re-baseline already; remove the file to "
                                                "record another")  # fmt: skip
    old_report, new_report = _verified(old_path, jobs), _verified(new_path, jobs)
    old_manifest, new_manifest = read_manifest(open_run(old_path)), read_manifest(new_run)
    if old_manifest["digest"]["digest"] == new_manifest["digest"]["digest"]:
        raise BadInput("NEW_BASELINE", f"{new_path} has the digest of {old_path} ({new_manifest['digest']['digest']}): "
                                       "nothing to re-baseline; gate compares them as they are")  # fmt: skip
    model = _model_difference(old_manifest, new_manifest)
    if model is not None:
        raise BadInput("NEW_BASELINE", f"{new_path} is not a run of {old_path}'s model (model.files: {model}): "
                                       "a re-baseline re-runs the same model under a new digest")  # fmt: skip
    old, new = _baseline(old_report, old_manifest), _baseline(new_report, new_manifest)
    record = Rebaseline(
        old=old, new=new, reason=reason.strip(),
        changed_parts=[p for p in DIGEST_PARTS if getattr(old.digest, p) != getattr(new.digest, p)],
        changes=manifest_changes(old_manifest, new_manifest),
        created_at=datetime.now(timezone.utc).isoformat(timespec="seconds"),
    )  # fmt: skip
    writer.write_json(new_run.rebaseline, record)
    return record, new_run.path / layout.REBASELINE
