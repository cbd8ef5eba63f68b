"""``evalrun verify``: recompute everything in a run directory that can be recomputed.

Order of checks (the first failure is reported, naming file, line, episode and seq where known):

1. record.json and the attestation are present (else the run is incomplete: ``evalrun resume``
   completes it); record.json is canonical, of a known format; the parts on disk are the parts it
   lists, and the run directory holds no file that a run does not write.
2. Each log part, with its output part (one process per part, in parallel): every line belongs to
   a chain that starts with a ``evalrun.schedule/1`` header at seq 0, runs seq 0, 1, 2, ... with
   each ``prev`` equal to the hash before it, and ends with an ``end`` entry; chains do not
   interleave. Each model entry's ``request_hash`` and ``prompt_sha256`` are recomputed. Each
   output row's head equals its chain's head and its fields equal what the chain recorded.
3. The sha256 of every file record.json lists (this also catches changes the structure allows,
   such as two whole chains swapped).
4. Counts, the Merkle root (and ``--expect-root``), the manifest digest from its parts and each
   part from what the manifest records (:mod:`evalrun.audit.digest_check`), scores against
   outputs, summary.json from scores.parquet (in the summary format it declares), and
   rebaseline.json when present (:func:`evalrun.audit.claims.check_rebaseline`).
5. attestation.intoto.json if present (and its Ed25519 signature when a public key is given).

``evalrun verify --ledger`` then checks the run against an anchor ledger (:mod:`evalrun.audit.ledger`).
"""

from __future__ import annotations

import fcntl
import gc
import json
import json.scanner
import os
import re
from collections.abc import Mapping
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow.compute as pc

from evalrun.audit.checkpoints import check_checkpoints
from evalrun.audit.claims import (
    check_duplicated_claims,
    check_rebaseline,
    check_sampling,
    check_score_values,
    check_seal,
    check_seal_format,
    check_seeds,
)
from evalrun.audit.digest_check import check_digest
from evalrun.audit.rescore import recorded_aggregations
from evalrun.episodes import kind_of_manifest
from evalrun.episodes.checked import PartResult, verify_part
from evalrun.errors import BadInput, CheckFailed
from evalrun.records.canonical import canonical_json, file_sha256
from evalrun.records.formats import Record
from evalrun.records.heads import digest_bytes
from evalrun.records.merkle import root_of_leaf_hashes
from evalrun.rundir import attest, layout
from evalrun.rundir.reader import (
    load_record,
    open_run,
    part_pairs,
    read_manifest,
    read_scores,
    read_summary,
)
from evalrun.stats.summary import Aggregation, names_aggregations, resummarize


@dataclass(frozen=True)
class VerifyReport:
    run: Path
    episodes: int
    log_entries: int
    parts: int
    merkle_root: str
    attestation: str  # absent | checked | signature checked | signed, signature not checked
    # digest part -> how verify checked it: recomputed from digest_inputs | recomputed from the manifest |
    # not recomputable: no recorded inputs (evalrun.audit.digest_check)
    digest_parts: dict[str, str] = field(default_factory=dict)
    seal: str | None = None  # the run's seal, recomputed (the value to keep elsewhere: --expect-seal)
    digest: str | None = None  # the run's digest, checked against its parts
    scores: str = "not present"  # recomputed | not recomputed: why
    rebaseline: str = "absent"  # rebaseline.json: absent | checked: ... (evalrun.audit.claims.check_rebaseline)
    ledger: str = "not given"  # verify --ledger: where the run is anchored (evalrun.audit.ledger)
    checkpoints: str = "absent"  # the run's checkpoints: absent | N checked (their signatures' status)


def _fail(where: str, message: str) -> CheckFailed:
    return CheckFailed(f"{where}: {message}")


def _verify_parts(
    run: layout.RunDir, pairs: list[tuple[str, str]], jobs: int, summary: bool, kind: str
) -> tuple[list[PartResult], bool | None]:
    """The parts' results in part order, and (with ``summary`` and more than one job) whether
    summary.json matches scores.parquet, recomputed in the pool alongside the parts (None: not
    known; :func:`check_scores` then decides, and names the problem, in its turn)."""
    jobs = jobs or (os.cpu_count() or 1)
    if jobs <= 1 or len(pairs) <= 1:
        return [verify_part(str(run.path), log_rel, out_rel, kind) for log_rel, out_rel in pairs], None
    import multiprocessing

    with ProcessPoolExecutor(min(jobs, len(pairs)), mp_context=multiprocessing.get_context("fork")) as pool:
        summary_ok = pool.submit(_summary_matches, str(run.path)) if summary else None
        futures = [pool.submit(verify_part, str(run.path), log_rel, out_rel, kind) for log_rel, out_rel in pairs]
        results = [f.result() for f in futures]  # in part order: the first broken part is reported
        return results, None if summary_ok is None else summary_ok.result()


def _summary_matches(run_path: str) -> bool | None:
    """True if summary.json is absent or equals the summary recomputed from scores.parquet; None
    on any error (check_scores reports it in its turn)."""
    try:
        run = layout.RunDir(Path(run_path))
        if not run.summary.exists():
            return True
        stored = read_summary(run)
        recomputed = resummarize(read_scores(run), stored, aggregations=_aggregations(run, stored))
        return canonical_json(recomputed) == canonical_json(stored)
    except Exception:
        return None


# --- whole-run checks ------------------------------------------------------------------------

_RESCORE_FOLDER = rf"{layout.RESCORE}/[0-9a-f]{{16}}"
_RESCORED_NAMES = "|".join(map(re.escape, (layout.SCORES, layout.SUMMARY, layout.RESCORER)))
_RESCORED = re.compile(rf"{_RESCORE_FOLDER}/({_RESCORED_NAMES})")
_TOP_LEVEL = {layout.MANIFEST, layout.CONFIG, layout.SCORES, layout.SUMMARY, layout.RECORD, layout.ATTESTATION,
              layout.REBASELINE, layout.REPORT}  # fmt: skip


def check_complete(run: layout.RunDir) -> None:
    """A run ends with record.json, then its attestation: with only the first it is incomplete."""
    if not (run.path / layout.ATTESTATION).is_file():
        raise _fail(layout.ATTESTATION, f"missing: the run is incomplete (it stopped after record.json); "
                                        f"`evalrun resume {run.path}` completes it")  # fmt: skip


def _lock_held(path: Path) -> bool:
    """Whether a driver holds the run's lock file now (a lock file nobody holds was left by a killed driver)."""
    with open(path, "rb") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        fcntl.flock(fh, fcntl.LOCK_UN)
    return False


def check_no_strays(run: layout.RunDir, record: Record) -> None:
    """Every file in the run directory, at any depth, is one a run writes: the layout's names (the
    report.html view among them, which no record lists or hashes), the files record.json lists,
    ``evalrun rescore``'s outputs, the engine's logs (``logs/<name>.log``: provenance, hashed nowhere),
    and the lock while a driver holds it. The ``tokenizer`` folder's files are listed in record.json."""
    expected = _TOP_LEVEL | set(record.files)
    folders = {layout.LOG, layout.OUTPUTS, layout.RESCORE, layout.LOGS, layout.TOKENIZER, layout.CHECKPOINTS}
    for path in sorted(run.path.rglob("*")):
        rel = path.relative_to(run.path).as_posix()
        if path.is_symlink():
            raise _fail(rel, "a symbolic link, not a file of an evalrun run directory")
        if path.is_dir():
            if rel not in folders and not re.fullmatch(_RESCORE_FOLDER, rel):
                raise _fail(rel, "not a folder of an evalrun run directory")
        elif not (rel in expected or _RESCORED.fullmatch(rel) or _is_log_file(rel)
                  or (rel == layout.LOCK and _lock_held(path))):  # fmt: skip
            raise _fail(rel, "not a file of an evalrun run directory")


def _is_log_file(rel: str) -> bool:
    folder, _, name = rel.partition("/")
    return folder == layout.LOGS and layout.LOG_FILE.match(name) is not None


def check_file_hashes(run: layout.RunDir, record: Record, known: dict[str, str] | None = None) -> None:
    """Every file record.json lists, in name order; ``known`` holds hashes already taken of the bytes checked."""
    known = known or {}
    for rel, expected in sorted(record.files.items()):
        path = run.path / rel
        if not path.is_file():
            raise _fail(rel, "listed in record.json but missing")
        if (known.get(rel) or file_sha256(path)) != expected:
            raise _fail(rel, "sha256 differs from record.json")


def check_manifest(run: layout.RunDir, record: dict[str, Any]) -> tuple[dict[str, Any], dict[str, str]]:
    """The manifest, and how each digest part was checked (see :mod:`evalrun.audit.digest_check`)."""
    if file_sha256(run.manifest) != record["manifest_sha256"]:
        raise _fail(layout.MANIFEST, "sha256 differs from record.json manifest_sha256")
    manifest = read_manifest(run)
    digest_parts = check_digest(manifest, _scorer_versions(run, record) if "digest_inputs" in manifest else ())
    if manifest["digest"]["digest"] != record["digest"]:
        raise _fail(layout.RECORD, "digest differs from the manifest's")
    return manifest, digest_parts


def _scorer_versions(run: layout.RunDir, record: dict[str, Any]) -> set[str]:
    """The scorer versions scores.parquet holds; empty when there are no scores to read (check_scores
    names an unreadable file in its turn)."""
    if layout.SCORES not in record["files"]:
        return set()
    try:
        column = read_scores(run, ["scorer_version"]).column("scorer_version")
    except (CheckFailed, KeyError):
        return set()
    return {str(v) for v in pc.unique(column).to_pylist() if v is not None}


def _aggregations(run: layout.RunDir, stored: Any) -> Mapping[str, Aggregation]:
    """The corpus metrics' aggregations a stored summary's aggregates are recomputed with (none: it has none, and
    lm-eval is not imported)."""
    if not names_aggregations(stored):
        return {}
    try:
        return recorded_aggregations(run)
    except BadInput as exc:  # the task's YAML or helpers moved or changed since the run
        raise _fail(layout.SUMMARY, f"its corpus metrics' aggregations cannot be read again: {exc}") from exc


def check_scores(
    run: layout.RunDir, heads: dict[str, str], summary_ok: bool | None = None, failed: frozenset[str] = frozenset()
) -> None:
    """Scored episodes against the output rows, then summary.json against scores.parquet (skipped
    when ``summary_ok`` says it was already found equal); ``failed``: the episodes whose chains end
    with status error, which the summary counts as errors."""
    scores = read_scores(run, ["episode_id"] if summary_ok else None)
    scored = set(scores.column("episode_id").to_pylist())
    if scored != heads.keys():
        missing = sorted(set(heads) - scored)[:1] or sorted(scored - set(heads))[:1]
        raise _fail(layout.SCORES, f"episode {missing[0]}: scored episodes differ from the output rows")
    if summary_ok:
        return
    if not run.summary.exists():
        return
    try:
        stored = read_summary(run)
        # in the format (and so with the interval method) it declares
        recomputed = resummarize(scores, stored, failed, _aggregations(run, stored))
    except ValueError as exc:  # not JSON, or a format this code does not know
        raise _fail(layout.SUMMARY, str(exc)) from exc
    if canonical_json(recomputed) != canonical_json(stored):
        raise _fail(layout.SUMMARY, f"does not match the {recomputed['format']} summary recomputed from scores.parquet")


def verify_run(
    path: Path, expect_root: str | None = None, public_key: Path | None = None, jobs: int = 0,
    expect_seal: str | None = None,
) -> VerifyReport:  # fmt: skip
    """Check the run at ``path``; raises CheckFailed naming the first broken thing."""
    # Millions of short-lived rows, tuples and lists, none of them in a cycle: the cyclic collector
    # would only re-scan them (it took two thirds of the summary's recomputation at 10**6 rows).
    enabled = gc.isenabled()
    gc.disable()
    try:
        return _verify_run(path, expect_root, public_key, jobs, expect_seal)
    finally:
        if enabled:
            gc.enable()


def _recorded_kind(run: layout.RunDir) -> str:
    """The name of the kind of episode the run's manifest records (a manifest that cannot be read is checked,
    and named, after the parts: its kind is then taken as dataset's)."""
    try:
        manifest = json.loads(run.manifest.read_bytes())
    except (OSError, ValueError):
        manifest = {}
    return kind_of_manifest(manifest if isinstance(manifest, dict) else {}).name


def _verify_run(
    path: Path, expect_root: str | None, public_key: Path | None, jobs: int, expect_seal: str | None
) -> VerifyReport:
    run = open_run(path)
    record = load_record(run)
    check_complete(run)
    pairs = part_pairs(run, record)
    check_no_strays(run, record)
    kind = _recorded_kind(run)
    results, summary_ok = _verify_parts(run, pairs, jobs, layout.SCORES in record.files, kind)
    heads: dict[str, str] = {}
    for index, ((log_rel, _out_rel), part) in enumerate(zip(pairs, results, strict=True)):
        try:  # an episode id is a sha256 hex digest: no run writes another (records.heads.Heads refuses it)
            for eid in part.heads:
                digest_bytes(eid, "episode id")
        except ValueError as exc:
            raise _fail(log_rel, str(exc)) from None
        size = len(heads)
        heads.update(part.heads)
        if len(heads) != size + len(part.heads):  # the first episode an earlier part also holds
            eid = next(eid for eid in part.heads if any(eid in p.heads for p in results[:index]))
            raise _fail(log_rel, f"episode {eid}: appears in more than one part")
    check_file_hashes(run, record, {rel: h for part in results for rel, h in part.file_hashes.items()})
    written = record.episodes.written
    if written != len(heads):
        raise _fail(layout.RECORD, f"episodes.written is {written}, the parts hold {len(heads)} episodes")
    if record.episodes.planned != written:
        raise _fail(layout.RECORD, f"{record.episodes.planned} episodes planned, {written} written")
    tokens = sum(p.output_tokens for p in results)
    if record.output_tokens is not None and record.output_tokens != tokens:
        raise _fail(layout.RECORD, f"output_tokens is {record.output_tokens}, the rows hold {tokens}")
    # merkle_root(heads.items()), from the leaves hashed with each part (episode ids are unique by now)
    leaves = sorted(pair for part in results for pair in part.leaves)  # merges the parts' sorted runs
    root = root_of_leaf_hashes([h for _eid, h in leaves])
    if root != record.merkle_root:
        raise _fail(layout.RECORD, f"merkle_root {record.merkle_root} differs from the root of the heads {root}")
    if expect_root is not None and root != expect_root.lower():
        raise _fail("--expect-root", f"the run's root is {root}, not {expect_root}")
    seal = check_seal(record, expect_seal)
    leaves_of = {out_rel: part.leaves for (_log_rel, out_rel), part in zip(pairs, results, strict=True)}
    checkpoints = check_checkpoints(run, record, leaves_of, public_key)
    manifest, digest_parts = check_manifest(run, record.as_record())
    check_seal_format(record, manifest)
    check_duplicated_claims(manifest)
    if isinstance(manifest.get("episodes"), int) and manifest["episodes"] != written:
        raise _fail(layout.MANIFEST, f"plans {manifest['episodes']} episodes, the run holds {written}")
    check_sampling(manifest, frozenset().union(*(p.samplings for p in results)),
                   frozenset().union(*(p.user_samplings for p in results)))  # fmt: skip
    check_seeds(run, manifest)
    rebaseline = check_rebaseline(run, manifest, root, seal)
    scores = "not present"
    if layout.SCORES in record.files:
        failed = frozenset().union(*(p.failed for p in results))
        # summary_ok was recomputed with no failed episodes: with some, recompute it with them
        check_scores(run, heads, None if failed else summary_ok, failed)
        scores = check_score_values(run)
    status = attest.check_attestation(run, record, public_key)
    return VerifyReport(
        run=run.path, episodes=len(heads), log_entries=sum(p.entries for p in results), parts=len(pairs),
        merkle_root=root, attestation=status, digest_parts=digest_parts, seal=seal, digest=record.digest, scores=scores,
        rebaseline=rebaseline, checkpoints=checkpoints,
    )  # fmt: skip
