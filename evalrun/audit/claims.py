"""Checks of what a run claims beyond its chains: the seal, every score value, the manifest's
sampling settings and seeds against what the chains and rows recorded, the claims the manifest records twice,
and a re-baseline record (docs/design.md "Audit")."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import pyarrow.compute as pc

from evalrun.audit.rescore import recorded_context, recorded_scorer
from evalrun.episodes import kind_of_manifest
from evalrun.episodes.recorded import as_dict, manifest_failure, section, without
from evalrun.errors import BadInput, CheckFailed
from evalrun.pipeline.manifest import DIGEST_PARTS
from evalrun.records.canonical import combine, differences
from evalrun.records.formats import Record, seal_of
from evalrun.records.outputs import with_error_column
from evalrun.records.seeds import derive_seed
from evalrun.rundir import layout
from evalrun.rundir.reader import read_outputs, read_rebaseline, read_scores
from evalrun.scoring import score_columns, score_outputs, scorer_version

SAMPLING_SETTINGS = ("temperature", "top_p", "top_k", "max_tokens", "stop", "logprobs")


def _fail(where: str, message: str) -> CheckFailed:
    return CheckFailed(f"{where}: {message}")


def check_seal(record: Record, expect_seal: str | None) -> str:
    """The run's seal recomputed from record.json's claims (whose file hashes are checked by then)."""
    seal = seal_of(record)
    if record.seal is not None and record.seal != seal:
        raise _fail(layout.RECORD, f"seal {record.seal} is not the seal of the record's claims ({seal})")
    if expect_seal is not None and seal != expect_seal.lower():
        raise _fail("--expect-seal", f"the run's seal is {seal}, not {expect_seal}: something the run claims (its "
                                     "manifest, a part, the scores, the summary, a count or the root) differs "
                                     "from the sealed run")  # fmt: skip
    return seal


# a manifest field written only by runs made since 2026-12-07, every one sealed under evalrun.seal/2 (since 12-03)
SEALED_SINCE = "config"


def check_seal_format(record: Record, manifest: Mapping[str, Any]) -> None:
    """A record read as the older seal (no ``seal_format``: the provenance outside the seal) must be one made before
    evalrun.seal/2: a manifest that records where its config came from was written since, so a record of it
    without ``seal_format`` had the field removed (its provenance then unsealed and free to rewrite)."""
    if record.seal_format is None and manifest.get(SEALED_SINCE) is not None:
        raise _fail(layout.RECORD, f"seal_format is missing, but {layout.MANIFEST} has {SEALED_SINCE}, which only "
                                   "runs sealed under evalrun.seal/2 record: the record claims an older seal than "
                                   "the run was made with")  # fmt: skip


def check_sampling(manifest: dict[str, Any], samplings: Iterable[str], user_samplings: Iterable[str] = ()) -> None:
    """Every policy generation's sampling settings, as the chains recorded them, are the manifest's; a model-played
    simulated user's are the user decoding its world records (``task.world.user.decoding``)."""
    decoding = manifest.get("decoding")
    if not isinstance(decoding, dict):
        raise _fail(layout.MANIFEST, "decoding: expected the run's decoding settings")
    _check_samplings(decoding, samplings, "decoding", "the chains' requests")
    users = sorted(user_samplings)
    if users:
        task = manifest.get("task") if isinstance(manifest.get("task"), dict) else {}
        user = (task.get("world") or {}).get("user") if isinstance(task.get("world"), dict) else None
        if not isinstance(user, dict) or not isinstance(user.get("decoding"), dict):
            raise _fail(layout.MANIFEST, "task.world.user: the chains hold a simulated user's model calls, the "
                                         "manifest records no user played by a model")  # fmt: skip
        _check_samplings(user["decoding"], users, "task.world.user.decoding", "the simulated user's requests")


def _check_samplings(decoding: dict[str, Any], samplings: Iterable[str], name: str, what: str) -> None:
    for text in sorted(samplings):
        recorded = json.loads(text)
        for key in SAMPLING_SETTINGS:
            claimed = list(decoding.get(key)) if key == "stop" else decoding.get(key)
            if recorded.get(key) != claimed:
                raise _fail(layout.MANIFEST, f"{name}.{key} is {claimed!r}, {what} were sampled with "
                                             f"{recorded.get(key)!r}")  # fmt: skip


def check_seeds(run: layout.RunDir, manifest: dict[str, Any]) -> None:
    """Every episode's seed-set member, repeat and sampling seed follow from the manifest's seeds
    (the rows were checked against the chains by then)."""
    seeds = manifest.get("seeds")
    if not isinstance(seeds, dict) or not {"master", "set", "repeats"} <= seeds.keys():
        raise _fail(layout.MANIFEST, "seeds: expected master, set and repeats")
    rows = read_outputs(run, ["episode_id", "task", "item_id", "seed", "repeat", "seeds"]).to_pydict()
    members, repeats, master = set(seeds["set"]), seeds["repeats"], seeds["master"]
    for eid, task, item, seed, repeat, recorded in zip(*rows.values(), strict=True):
        if seed not in members or not 0 <= repeat < repeats:
            raise _fail(layout.MANIFEST, f"seeds: episode {eid} has seed {seed}, repeat {repeat}, outside the "
                                         f"manifest's set {sorted(members)} x {repeats} repeats")  # fmt: skip
        if recorded["sampling"] != derive_seed(master, "sampling", task, item, seed, repeat):
            raise _fail(layout.MANIFEST, f"seeds.master: episode {eid}'s sampling seed does not derive from "
                                         f"master seed {master}")  # fmt: skip


SCORED_COLUMNS = ("value", "extracted", "error")  # what the scorer computes for each (episode, metric)


def check_score_values(run: layout.RunDir) -> str:
    """Every score recomputed from the stored outputs with the recorded scorer; returns how it went
    ("recomputed", or why not: a scorer this code has at another version, a rubric file gone)."""
    try:
        spec = recorded_scorer(run)
    except BadInput as exc:
        return f"not recomputed: {exc.message}"
    stored = read_scores(run)
    versions = set(pc.unique(stored.column("scorer_version")).to_pylist()) if stored.num_rows else set()
    try:
        current = scorer_version(spec)
    except BadInput as exc:
        return f"not recomputed: {exc.message}"
    if versions - {current}:
        return f"not recomputed: scored by {spec.name} version {sorted(versions)}, this code has version {current}"
    try:
        context, _ = recorded_context(run, None)
    except (BadInput, OSError) as exc:
        return f"not recomputed: {exc}"
    fresh = with_error_column(score_outputs(read_outputs(run, score_columns(spec)), spec, context))
    order = [("episode_id", "ascending"), ("metric", "ascending")]
    stored, fresh = stored.sort_by(order), fresh.sort_by(order)
    same_keys = stored.num_rows == fresh.num_rows and all(
        stored.column(k).equals(fresh.column(k)) for k in ("episode_id", "metric")
    )
    if same_keys and all(stored.column(c).equals(fresh.column(c)) for c in SCORED_COLUMNS):
        return "recomputed"
    _first_difference(stored, fresh)  # names the episode, metric and figure
    raise _fail(layout.SCORES, "differs from the scores the recorded scorer gives")


def _first_difference(stored: Any, fresh: Any) -> None:
    key = ["episode_id", "metric"]
    mine = {tuple(k): row for k, row in _keyed(fresh, key)}
    for (eid, metric), row in _keyed(stored, key):
        again = mine.pop((eid, metric), None)
        if again is None:
            raise _fail(layout.SCORES, f"episode {eid} metric {metric}: the recorded scorer gives no such score")
        for column in SCORED_COLUMNS:
            if row[column] != again[column]:
                raise _fail(layout.SCORES, f"episode {eid} metric {metric}: {column} is {row[column]!r}, the "
                                           f"recorded scorer gives {again[column]!r}")  # fmt: skip
    if mine:
        eid, metric = next(iter(mine))
        raise _fail(layout.SCORES, f"episode {eid} metric {metric}: missing; the recorded scorer gives it")


def _keyed(table: Any, key: list[str]) -> Iterable[tuple[tuple[Any, ...], dict[str, Any]]]:
    for row in table.to_pylist():
        yield tuple(row[k] for k in key), row


def check_rebaseline(run: layout.RunDir, manifest: dict[str, Any], root: str, seal: str) -> str:
    """rebaseline.json, when present: well-formed, its ``new`` side this run (digest and its parts, Merkle
    root, seal: each verified by then), the old digest from its parts, and ``changed_parts`` the parts
    in which the two digests differ. Returns how it went ("absent", or what it records)."""
    recorded = read_rebaseline(run)
    if recorded is None:
        return "absent"
    old, new = recorded.old, recorded.new
    where = layout.REBASELINE
    if new.digest.as_record() != manifest["digest"]:
        raise _fail(where, f"new.digest {new.digest.digest} (and its parts) is not this run's digest "
                           f"{manifest['digest']['digest']}: the record re-baselines another run")  # fmt: skip
    if new.merkle_root != root:
        raise _fail(where, f"new.merkle_root {new.merkle_root} is not this run's root {root}")
    if new.seal != seal:
        raise _fail(where, f"new.seal {new.seal} is not this run's seal {seal}")
    old_parts = [getattr(old.digest, part) for part in DIGEST_PARTS]
    if combine(old_parts) != old.digest.digest:
        raise _fail(where, "old.digest.digest is not sha256(prompt_pack + seed_set + scoring) of its parts")
    differing = [part for part in DIGEST_PARTS if getattr(old.digest, part) != getattr(new.digest, part)]
    if not differing:
        raise _fail(where, "old and new have the same digest: nothing was re-baselined")
    if recorded.changed_parts != differing:
        raise _fail(where, f"changed_parts is {recorded.changed_parts}, the digests differ in {differing}")
    return (f"checked: re-baselined from {old.run} (digest {old.digest.digest}; {', '.join(differing)} changed): "
            f"{recorded.reason}")  # fmt: skip


# --- claims the manifest records twice ----------------------------------------------------------------
# identity (what decides what the run computes, which resume compares) and the sections that say the same with
# more detail (model with its path and chat template, task with the paths it read, seeds with master_generated):
# a forger who edits one of the two and re-seals the run passes every hash, so verify compares each pair.
# identity.digest against digest is checked with the digest (evalrun.audit.digest_check); identity.engine is the
# engine's config and engine.settings what the worker resolved (a dtype of null is the model's), as
# identity.determinism is the config and determinism.asked what the workers report they were asked: provenance.

MODEL_IDENTITY = ("id", "revision", "files", "pinned")  # what identity.model keeps of the manifest's model
REQUIRED = ("decoding", "seeds", "model", "task", "generator")  # in every identity evalrun ever wrote


def _model(manifest: Mapping[str, Any], key: str) -> dict[str, Any] | None:
    model = manifest.get(key)
    return None if model is None else {k: as_dict(model).get(k) for k in MODEL_IDENTITY}


def _seeds(manifest: Mapping[str, Any]) -> dict[str, Any]:
    return without(section(manifest, "seeds"), "master_generated")


def _task(manifest: Mapping[str, Any]) -> dict[str, Any]:
    return kind_of_manifest(manifest).recorded_task_identity(section(manifest, "task"))


# identity's field -> (the manifest field said to hold the same claim, that claim as identity records it)
DUPLICATED: dict[str, tuple[str, Callable[[Mapping[str, Any]], Any]]] = {
    "decoding": ("decoding", lambda m: m.get("decoding")),
    "seeds": ("seeds", _seeds),
    "limit": ("limit", lambda m: m.get("limit")),
    "episodes": ("episodes", lambda m: m.get("episodes")),
    "generator": ("generator", lambda m: m.get("generator")),
    "model": ("model", lambda m: _model(m, "model")),
    "judge_model": ("judge_model", lambda m: _model(m, "judge_model")),
    "user_model": ("user_model", lambda m: _model(m, "user_model")),
    "task": ("task", _task),
}


def implied_identity(manifest: Mapping[str, Any]) -> dict[str, Any]:
    """The claims of ``identity`` that the manifest's other sections imply (for a manifest made by hand, as the
    synthetic runs of the tests and benchmarks are): a user model only where there is one."""
    implied = {key: claim(manifest) for key, (_field, claim) in DUPLICATED.items()}
    return {k: v for k, v in implied.items() if k != "user_model" or v is not None}


def check_duplicated_claims(manifest: Mapping[str, Any]) -> None:
    """Every claim ``identity`` shares with another section agrees with it; CheckFailed naming both fields of the
    first that does not (``identity.model.files.config.json differs from model.files.config.json``)."""
    identity = section(manifest, "identity")
    for key in REQUIRED:
        if key not in identity:
            raise manifest_failure(f"identity.{key} is missing")
    for key, (field, implied_by) in DUPLICATED.items():
        if key not in identity:
            continue  # written by code older than the field: nothing to compare
        recorded, implied = identity[key], implied_by(manifest)
        if recorded != implied:  # differences() names where (a key set to null in one only, it does not)
            path = next((p for p, _, _ in differences(recorded, implied)), "")
            where = f".{path}" if path else ""
            raise manifest_failure(f"identity.{key}{where} differs from {field}{where}")
