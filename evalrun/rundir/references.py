"""Frozen reference sets on disk: ``references/<name>/<version>/`` (docs/design.md "Frozen references").

A set is one canonical-JSON file per instance, ``<item>.json`` (the world task's item id, e.g.
``cost-1000``; a dataset task's answer set is the one file ``answers.json``, item id -> answer),
and ``index.json``, which lists every file with its sha256. The index's own sha256
names the set in a run's manifest. This module only reads, checks hashes and writes bytes; it never
solves anything (the solver lives in :mod:`evalrun.worlds.solver`, the build and the full check in
:mod:`evalrun.worlds.reference_sets`), so evaluation reads references without ever importing a solver.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from evalrun.config.paths import REFERENCES_DIR
from evalrun.errors import BadInput
from evalrun.records.canonical import canonical_json, sha256_hex

REFERENCES_ROOT = REFERENCES_DIR  # the built-in sets, shipped in the package
INDEX = "index.json"
INDEX_FORMAT = "evalrun-reference-index/1"
REFERENCE_FORMAT = "evalrun-reference/1"


def references_root() -> Path:
    """Where reference sets live: the package's ``references/`` (a test may point it elsewhere)."""
    return REFERENCES_ROOT


def set_directory(name: str, version: str, root: Path | None = None) -> Path:
    return (root or references_root()) / name / version


def encode(record: Any) -> bytes:
    """The bytes of a reference or index file: canonical JSON and a newline (so two builds compare byte for byte)."""
    return (canonical_json(record) + "\n").encode("utf-8")


@dataclass(frozen=True)
class ReferenceIndex:
    """A set's index as read: its sha256, and each item's file sha256."""

    name: str
    version: str
    directory: Path
    sha256: str
    files: Mapping[str, str]  # item id -> sha256 of <item>.json

    def record(self) -> dict[str, str]:
        """What a run's manifest (``task.world.references``) and scoring context record of the set."""
        return {"name": self.name, "version": self.version, "index_sha256": self.sha256}

    def path(self, item: str) -> Path:
        return self.directory / f"{item}.json"


def index_record(name: str, version: str, files: Mapping[str, str]) -> dict[str, Any]:
    entries = [{"item": item, "file": f"{item}.json", "sha256": files[item]} for item in sorted(files)]
    return {"format": INDEX_FORMAT, "world": {"name": name, "version": version}, "files": entries}


def read_json(path: Path, what: str) -> tuple[bytes, Any]:
    """The bytes and parsed JSON of ``path``; BadInput naming it when it is missing or not JSON."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise BadInput(str(path), f"no {what}: build it with `evalrun references build`") from None
    except OSError as exc:
        raise BadInput(str(path), f"unreadable {what} ({exc})") from None
    try:
        return data, json.loads(data)
    except ValueError as exc:
        raise BadInput(str(path), f"{what} is not JSON ({exc})") from None


def load_index(name: str, version: str, root: Path | None = None) -> ReferenceIndex:
    """The index of the set of world ``name`` at ``version``; BadInput when it is missing or malformed."""
    directory = set_directory(name, version, root)
    path = directory / INDEX
    data, record = read_json(path, f"reference index of {name}@{version}")
    try:
        if record["format"] != INDEX_FORMAT:
            raise ValueError(f"format {record['format']!r}, expected {INDEX_FORMAT!r}")
        if record["world"] != {"name": name, "version": version}:
            raise ValueError(f"world {record['world']!r}, expected {name}@{version}")
        files = {str(e["item"]): str(e["sha256"]) for e in record["files"]}
    except (KeyError, TypeError, ValueError) as exc:
        raise BadInput(str(path), f"not a reference index: {exc}") from None
    return ReferenceIndex(name, version, directory, sha256_hex(data), files)


def load_item(index: ReferenceIndex, item: str) -> Any:
    """The frozen file of ``item``, checked against the index; BadInput for a missing or changed one."""
    if item not in index.files:
        raise BadInput(
            str(index.directory / INDEX), f"no reference for {item}: build it with `evalrun references build`"
        )
    path = index.path(item)
    data, record = read_json(path, f"reference of {item}")
    if sha256_hex(data) != index.files[item]:
        raise BadInput(str(path), f"sha256 {sha256_hex(data)} differs from the index's {index.files[item]}")
    return record


def load_reference(index: ReferenceIndex, item: str, instance_sha256: str) -> dict[str, Any]:
    """The frozen reference of ``item``, checked against the index (file hash) and against the
    instance the world generated (``instance_sha256``); BadInput for a missing or mismatched one."""
    record = load_item(index, item)
    path = index.path(item)
    if not isinstance(record, dict) or record.get("instance_sha256") != instance_sha256:
        got = record.get("instance_sha256") if isinstance(record, dict) else None
        raise BadInput(
            f"{path}: instance_sha256",
            f"the reference was made for instance {got}, the world generates {instance_sha256}",
        )
    return record


def write_set(name: str, version: str, records: Mapping[str, Any], root: Path | None = None) -> ReferenceIndex:
    """Write one file per item and the index (entries of items already there and not rebuilt are kept)."""
    directory = set_directory(name, version, root)
    directory.mkdir(parents=True, exist_ok=True)
    files: dict[str, str] = {}
    if (directory / INDEX).exists():
        files.update(load_index(name, version, root).files)
    for item, record in sorted(records.items()):
        data = encode(record)
        (directory / f"{item}.json").write_bytes(data)
        files[item] = sha256_hex(data)
    (directory / INDEX).write_bytes(encode(index_record(name, version, files)))
    return load_index(name, version, root)


# --- a dataset task's answers ------------------------------------------------------------------

ANSWERS = "answers"  # the one item of an answer set: answers.json
ANSWERS_FORMAT = "evalrun-answers/1"


def parse_set_name(text: str, where: str) -> tuple[str, str]:
    """``NAME@VERSION`` (``task.references``) as (name, version); BadInput naming ``where`` otherwise."""
    name, at, version = text.partition("@")
    if not (name and at and version) or "/" in text:
        raise BadInput(where, f"expected NAME@VERSION of a reference set under references/, got {text!r}")
    return name, version


def answers_record(name: str, version: str, answers: Mapping[str, str]) -> dict[str, Any]:
    return {
        "format": ANSWERS_FORMAT,
        "set": {"name": name, "version": version},
        "answers": dict(sorted(answers.items())),
    }


def write_answers(name: str, version: str, answers: Mapping[str, str], root: Path | None = None) -> ReferenceIndex:
    """Freeze a dataset task's answers (item id -> answer) as the set ``name@version``."""
    return write_set(name, version, {ANSWERS: answers_record(name, version, answers)}, root)


def load_answers(name: str, version: str, root: Path | None = None) -> tuple[ReferenceIndex, dict[str, str]]:
    """The frozen answers of the set ``name@version``, hash-checked; BadInput naming the file otherwise."""
    index = load_index(name, version, root)
    record = load_item(index, ANSWERS)
    try:
        if record["format"] != ANSWERS_FORMAT:
            raise ValueError(f"format {record['format']!r}, expected {ANSWERS_FORMAT!r}")
        answers = {str(k): str(v) for k, v in record["answers"].items()}
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise BadInput(str(index.path(ANSWERS)), f"not an answer set: {exc}") from None
    return index, answers
