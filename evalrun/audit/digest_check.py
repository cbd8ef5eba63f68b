"""The manifest digest, part by part: what ``evalrun verify`` recomputes of it and what it cannot.

``digest = sha256(prompt_pack + seed_set + scoring)`` (docs/design.md "Manifest"). A
run made with ``digest_inputs`` in its manifest has each part's preimage on record: each part is
recomputed from its preimage, and the preimage is checked against the rest of the manifest (the
prompt pack against ``task.prompt_pack``, ``task.choices`` and ``decoding``; the seed set against
``seeds``; the scoring record against ``task.scorer``, ``task.choices.scoring``, ``task.rubric``,
the judges' model files, ``python`` and the scorer version in scores.parquet). The scoring record's
``sources`` (sha256 of the scoring code's files) are hashed as recorded: nothing else in a run
says what the code was.

An older manifest (no ``digest_inputs``) allows less: the prompt pack is rebuilt from
``task.prompt_pack`` and ``task.choices``, the seed set from ``seeds``, and the scoring part is
reported as not recomputable.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from evalrun.episodes import kind_of_manifest
from evalrun.episodes.recorded import as_dict, manifest_failure, section, without
from evalrun.pipeline.manifest import DIGEST_PARTS, seed_set_record
from evalrun.records.canonical import canonical_hash, combine
from evalrun.rundir import layout
from evalrun.scoring import ScoringContext

FROM_INPUTS = "recomputed from digest_inputs"
FROM_MANIFEST = "recomputed from the manifest"
NOT_RECORDED = "not recomputable: no recorded inputs"

SCORING_FIELDS = frozenset({"scorer", "version", "params", "sources", "python", "libraries", "context"})
NO_CONTEXT = ScoringContext().as_record()
CONTEXT_SOURCES = {"choice_scoring": "task.choices.scoring", "rubric": "task.rubric", "verifier": "task.world.versions",
                   "references": "task.references",
                   "judge_model": "the judges' model files (judge_model.files, else model.files)"}  # fmt: skip


def _first_difference(recorded: dict[str, Any], expected: dict[str, Any]) -> str | None:
    """The first key, in name order, whose value differs (or that only one side has)."""
    missing = object()
    keys = sorted(set(recorded) | set(expected))
    return next((k for k in keys if recorded.get(k, missing) != expected.get(k, missing)), None)


def check_digest(manifest: dict[str, Any], scorer_versions: Collection[str] = ()) -> dict[str, str]:
    """Check ``manifest['digest']`` part by part; return part -> how it was checked.

    ``scorer_versions``: the ``scorer_version`` values in scores.parquet (empty: no scores). Raises
    CheckFailed naming the part, or the preimage field that disagrees with the manifest.
    """
    digest = section(manifest, "digest")
    parts = [digest.get(p) for p in DIGEST_PARTS]
    if not all(isinstance(p, str) for p in parts) or combine(parts) != digest.get("digest"):
        raise manifest_failure("digest is not sha256(prompt_pack + seed_set + scoring)")
    identity = manifest.get("identity")
    if isinstance(identity, dict) and "digest" in identity and identity["digest"] != digest:
        raise manifest_failure("identity.digest differs from digest")
    if "digest_inputs" in manifest:
        return _check_recorded_inputs(manifest, digest, scorer_versions)
    return _check_from_manifest(manifest, digest)


def _check_recorded_inputs(
    manifest: dict[str, Any], digest: dict[str, Any], scorer_versions: Collection[str]
) -> dict[str, str]:
    inputs = manifest["digest_inputs"]
    if not isinstance(inputs, dict) or set(inputs) != set(DIGEST_PARTS):
        raise manifest_failure(f"digest_inputs is not an object of exactly {', '.join(DIGEST_PARTS)}")
    for part in DIGEST_PARTS:
        if not isinstance(inputs[part], dict):
            raise manifest_failure(f"digest_inputs.{part} is not an object")
        if canonical_hash(inputs[part]) != digest[part]:
            raise manifest_failure(f"digest.{part} does not match its recorded inputs (digest_inputs.{part})")
    _check_prompt_pack_inputs(manifest, inputs["prompt_pack"])
    _check_seed_set_inputs(manifest, inputs["seed_set"])
    _check_scoring_inputs(manifest, inputs["scoring"], scorer_versions)
    return dict.fromkeys(DIGEST_PARTS, FROM_INPUTS)


def _check_prompt_pack_inputs(manifest: dict[str, Any], recorded: dict[str, Any]) -> None:
    kind = kind_of_manifest(manifest)
    key = _first_difference(recorded, kind.recorded_prompt_record(manifest))
    if key is not None:
        raise manifest_failure(f"digest_inputs.prompt_pack.{key} differs from {kind.prompt_source(key)}")


def _check_seed_set_inputs(manifest: dict[str, Any], recorded: dict[str, Any]) -> None:
    seeds = section(manifest, "seeds")
    if not set(seeds) >= {"master", "set", "repeats"}:
        raise manifest_failure("seeds lacks master, set or repeats")
    key = _first_difference(recorded, seed_set_record(seeds))
    if key is not None:
        raise manifest_failure(f"digest_inputs.seed_set.{key} differs from seeds")


def _check_scoring_inputs(manifest: dict[str, Any], recorded: dict[str, Any], scorer_versions: Collection[str]) -> None:
    unknown = sorted(set(recorded) - SCORING_FIELDS)
    if unknown:
        raise manifest_failure(f"digest_inputs.scoring has an unknown field {unknown[0]!r}")
    scorer = section(manifest, "task.scorer")
    if recorded.get("params") != scorer:
        raise manifest_failure("digest_inputs.scoring.params differs from task.scorer")
    if recorded.get("scorer") != scorer.get("name"):
        raise manifest_failure("digest_inputs.scoring.scorer differs from task.scorer.name")
    versions = set(scorer_versions)
    if versions and versions != {recorded.get("version")}:
        raise manifest_failure(
            f"digest_inputs.scoring.version {recorded.get('version')!r} differs from the "
            f"scorer_version in {layout.SCORES} ({', '.join(sorted(map(str, versions)))})"
        )
    python = manifest.get("python")
    if isinstance(python, str) and ".".join(python.split()[-1].split(".")[:2]) != recorded.get("python"):
        raise manifest_failure("digest_inputs.scoring.python differs from python")
    if not isinstance(recorded.get("sources"), dict):
        raise manifest_failure("digest_inputs.scoring.sources is not an object")
    if "libraries" in recorded and not isinstance(recorded["libraries"], dict):  # runs made before: none recorded
        raise manifest_failure("digest_inputs.scoring.libraries is not an object")
    expected = kind_of_manifest(manifest).recorded_scoring_record(manifest)
    context = recorded.get("context", NO_CONTEXT)
    if expected == NO_CONTEXT and "context" in recorded:
        raise manifest_failure("digest_inputs.scoring.context is recorded for a scorer that has none")
    key = _first_difference(as_dict(context), expected)
    if key is not None:
        source = CONTEXT_SOURCES.get(key, "the manifest")
        raise manifest_failure(f"digest_inputs.scoring.context.{key} differs from {source}")


def _check_from_manifest(manifest: dict[str, Any], digest: dict[str, Any]) -> dict[str, str]:
    """An older manifest: recompute what its fields allow."""
    checked = dict.fromkeys(DIGEST_PARTS, NOT_RECORDED)
    task = as_dict(manifest.get("task"))
    if "prompt_pack" in task:
        if canonical_hash(kind_of_manifest(manifest).recorded_prompt_record(manifest)) != digest["prompt_pack"]:
            raise manifest_failure("digest.prompt_pack does not match task.prompt_pack and task.choices")
        checked["prompt_pack"] = FROM_MANIFEST
    elif "sha256" in as_dict(task.get("template")):  # the single-template manifests before prompt packs
        settings = without(section(manifest, "decoding"), "name")
        pack = {"templates": {"user": task["template"]["sha256"]}, "fewshot": [], "decoding": settings}
        if canonical_hash(pack) != digest["prompt_pack"]:
            raise manifest_failure("digest.prompt_pack does not match task.template.sha256 and decoding")
        checked["prompt_pack"] = FROM_MANIFEST
    if "seeds" in manifest:
        seeds = section(manifest, "seeds")
        if not set(seeds) >= {"master", "set", "repeats"}:
            raise manifest_failure("seeds lacks master, set or repeats")
        if canonical_hash(seed_set_record(seeds)) != digest["seed_set"]:
            raise manifest_failure("digest.seed_set does not match seeds")
        checked["seed_set"] = FROM_MANIFEST
    return checked
