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

from evalrun.errors import CheckFailed
from evalrun.pipeline.manifest import DIGEST_PARTS, agent_prompt_record, prompt_pack_record, seed_set_record
from evalrun.records.canonical import canonical_hash, combine
from evalrun.rundir import layout
from evalrun.scoring.context import verifier_identity

FROM_INPUTS = "recomputed from digest_inputs"
FROM_MANIFEST = "recomputed from the manifest"
NOT_RECORDED = "not recomputable: no recorded inputs"

SCORING_FIELDS = frozenset({"scorer", "version", "params", "sources", "python", "context"})
NO_CONTEXT = {"choice_scoring": "", "rubric": None, "judge_model": None}  # ScoringContext() as a record
CONTEXT_SOURCES = {"choice_scoring": "task.choices.scoring", "rubric": "task.rubric", "verifier": "task.world.versions",
                   "references": "task.references",
                   "judge_model": "the judges' model files (judge_model.files, else model.files)"}  # fmt: skip


def _fail(message: str) -> CheckFailed:
    return CheckFailed(f"{layout.MANIFEST}: {message}")


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _section(manifest: dict[str, Any], dotted: str) -> dict[str, Any]:
    """``manifest[a][b]...`` as a dict; CheckFailed naming the field when it is missing or not an object."""
    value: Any = manifest
    for key in dotted.split("."):
        value = value.get(key) if isinstance(value, dict) else None
    if not isinstance(value, dict):
        raise _fail(f"{dotted} is missing or not an object")
    return value


def _without(record: dict[str, Any], key: str) -> dict[str, Any]:
    return {k: v for k, v in record.items() if k != key}


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
    digest = _section(manifest, "digest")
    parts = [digest.get(p) for p in DIGEST_PARTS]
    if not all(isinstance(p, str) for p in parts) or combine(parts) != digest.get("digest"):
        raise _fail("digest is not sha256(prompt_pack + seed_set + scoring)")
    identity = manifest.get("identity")
    if isinstance(identity, dict) and "digest" in identity and identity["digest"] != digest:
        raise _fail("identity.digest differs from digest")
    if "digest_inputs" in manifest:
        return _check_recorded_inputs(manifest, digest, scorer_versions)
    return _check_from_manifest(manifest, digest)


def _check_recorded_inputs(
    manifest: dict[str, Any], digest: dict[str, Any], scorer_versions: Collection[str]
) -> dict[str, str]:
    inputs = manifest["digest_inputs"]
    if not isinstance(inputs, dict) or set(inputs) != set(DIGEST_PARTS):
        raise _fail(f"digest_inputs is not an object of exactly {', '.join(DIGEST_PARTS)}")
    for part in DIGEST_PARTS:
        if not isinstance(inputs[part], dict):
            raise _fail(f"digest_inputs.{part} is not an object")
        if canonical_hash(inputs[part]) != digest[part]:
            raise _fail(f"digest.{part} does not match its recorded inputs (digest_inputs.{part})")
    _check_prompt_pack_inputs(manifest, inputs["prompt_pack"])
    _check_seed_set_inputs(manifest, inputs["seed_set"])
    _check_scoring_inputs(manifest, inputs["scoring"], scorer_versions)
    return dict.fromkeys(DIGEST_PARTS, FROM_INPUTS)


def _pack_of_manifest(manifest: dict[str, Any]) -> dict[str, Any]:
    """The prompt pack record the run hashed, as the manifest's task section gives it."""
    pack = _without(_section(manifest, "task.prompt_pack"), "path")
    choices = _section(manifest, "task.choices")
    if "field" not in choices or (choices["field"] is not None and not set(choices) >= {"cannot_assess", "shuffle"}):
        raise _fail("task.choices lacks field, cannot_assess or shuffle")
    decoding = _without(_section(manifest, "decoding"), "name")
    if pack.get("decoding") != decoding:
        raise _fail("task.prompt_pack.decoding differs from decoding")
    on_overlong = _section(manifest, "task").get("on_overlong")
    return prompt_pack_record(pack, choices, on_overlong if isinstance(on_overlong, str) else None)


def _check_prompt_pack_inputs(manifest: dict[str, Any], recorded: dict[str, Any]) -> None:
    world = _dict(manifest.get("task")).get("world")
    if world is not None:  # an agent task
        decoding = _without(_section(manifest, "decoding"), "name")
        key = _first_difference(recorded, agent_prompt_record(_section(manifest, "task.world"), decoding))
        if key is not None:
            raise _fail(f"digest_inputs.prompt_pack.{key} differs from task.world and decoding")
        return
    key = _first_difference(recorded, _pack_of_manifest(manifest))
    if key is not None:
        source = "task.choices" if key == "choices" else "task.prompt_pack"
        raise _fail(f"digest_inputs.prompt_pack.{key} differs from {source}")


def _check_seed_set_inputs(manifest: dict[str, Any], recorded: dict[str, Any]) -> None:
    seeds = _section(manifest, "seeds")
    if not set(seeds) >= {"master", "set", "repeats"}:
        raise _fail("seeds lacks master, set or repeats")
    key = _first_difference(recorded, seed_set_record(seeds))
    if key is not None:
        raise _fail(f"digest_inputs.seed_set.{key} differs from seeds")


def _check_scoring_inputs(manifest: dict[str, Any], recorded: dict[str, Any], scorer_versions: Collection[str]) -> None:
    unknown = sorted(set(recorded) - SCORING_FIELDS)
    if unknown:
        raise _fail(f"digest_inputs.scoring has an unknown field {unknown[0]!r}")
    scorer = _section(manifest, "task.scorer")
    if recorded.get("params") != scorer:
        raise _fail("digest_inputs.scoring.params differs from task.scorer")
    if recorded.get("scorer") != scorer.get("name"):
        raise _fail("digest_inputs.scoring.scorer differs from task.scorer.name")
    versions = set(scorer_versions)
    if versions and versions != {recorded.get("version")}:
        raise _fail(f"digest_inputs.scoring.version {recorded.get('version')!r} differs from the scorer_version in "
                    f"{layout.SCORES} ({', '.join(sorted(map(str, versions)))})")  # fmt: skip
    python = manifest.get("python")
    if isinstance(python, str) and ".".join(python.split()[-1].split(".")[:2]) != recorded.get("python"):
        raise _fail("digest_inputs.scoring.python differs from python")
    if not isinstance(recorded.get("sources"), dict):
        raise _fail("digest_inputs.scoring.sources is not an object")
    expected = _scoring_context_of_manifest(manifest)
    context = recorded.get("context", NO_CONTEXT)
    if expected == NO_CONTEXT and "context" in recorded:
        raise _fail("digest_inputs.scoring.context is recorded for a scorer that has none")
    key = _first_difference(_dict(context), expected)
    if key is not None:
        source = CONTEXT_SOURCES.get(key, "the manifest")
        raise _fail(f"digest_inputs.scoring.context.{key} differs from {source}")


def _scoring_context_of_manifest(manifest: dict[str, Any]) -> dict[str, Any]:
    """The scoring context record (see evalrun.scoring.ScoringContext) the manifest implies."""
    task = _section(manifest, "task")
    if "world" in task:
        world = _dict(task["world"])
        return {**NO_CONTEXT, "verifier": verifier_identity(_dict(world.get("versions")), world.get("references"))}
    choices = _dict(task.get("choices"))
    rubric = task.get("rubric")
    judges = _dict(manifest.get("judge_model") or manifest.get("model"))
    context = {
        "choice_scoring": choices.get("scoring", "") if choices.get("field") is not None else "",
        "rubric": _without(rubric, "path") if isinstance(rubric, dict) else None,
        "judge_model": canonical_hash(judges.get("files")) if rubric is not None else None,
    }
    if "references" in task:
        context["references"] = task["references"]
    return context


def _check_from_manifest(manifest: dict[str, Any], digest: dict[str, Any]) -> dict[str, str]:
    """An older manifest: recompute what its fields allow."""
    checked = dict.fromkeys(DIGEST_PARTS, NOT_RECORDED)
    task = _dict(manifest.get("task"))
    if "prompt_pack" in task:
        if canonical_hash(_pack_of_manifest(manifest)) != digest["prompt_pack"]:
            raise _fail("digest.prompt_pack does not match task.prompt_pack and task.choices")
        checked["prompt_pack"] = FROM_MANIFEST
    elif "sha256" in _dict(task.get("template")):  # the single-template manifests before prompt packs
        settings = _without(_section(manifest, "decoding"), "name")
        pack = {"templates": {"user": task["template"]["sha256"]}, "fewshot": [], "decoding": settings}
        if canonical_hash(pack) != digest["prompt_pack"]:
            raise _fail("digest.prompt_pack does not match task.template.sha256 and decoding")
        checked["prompt_pack"] = FROM_MANIFEST
    if "seeds" in manifest:
        seeds = _section(manifest, "seeds")
        if not set(seeds) >= {"master", "set", "repeats"}:
            raise _fail("seeds lacks master, set or repeats")
        if canonical_hash(seed_set_record(seeds)) != digest["seed_set"]:
            raise _fail("digest.seed_set does not match seeds")
        checked["seed_set"] = FROM_MANIFEST
    return checked
