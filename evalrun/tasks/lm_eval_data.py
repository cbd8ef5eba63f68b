"""An lm-eval task's documents as evalrun reads them, in place of lm-eval's own ``datasets.load_dataset`` (which,
offline, reads whatever its cache last saw and ignores a revision): local json/csv/parquet files beside the task
YAML, or a Hugging Face hub dataset read from the local hub cache at the commit that pins it, each split hashed in
canonical form. What a task's YAML says of its data (``dataset_path``, ``dataset_name``, ``dataset_kwargs``, the
splits) is read here; the documents are then handed to lm-eval's task as its dataset.

A dataset defined by a loading script is read from the hub's Parquet conversion (``refs/convert/parquet``, its
``CONFIG/SPLIT/*.parquet`` files) at the commit that pins it: evalrun runs no dataset code.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

import yaml

from evalrun.config.settings import COMMIT
from evalrun.errors import BadInput
from evalrun.records.canonical import canonical_hash, file_sha256

FORMATS = ("json", "csv", "parquet")
# dataset_kwargs evalrun reads; trust_remote_code is accepted and means nothing (no dataset code runs; datasets 4
# and lm-eval drop it too)
LOCAL_KWARGS = ("data_files", "trust_remote_code")
HUB_KWARGS = ("revision", "trust_remote_code")


@dataclass(frozen=True)
class DataSplit:
    """One split of the task's dataset: its files (each with its sha256) and its documents as read, in file order
    (lm-eval's ``process_docs`` makes its own documents of them; their hash is recorded apart)."""

    name: str
    files: tuple[tuple[Path, str], ...]
    docs: tuple[Mapping[str, Any], ...]
    # a hub dataset's: its id, config, the commit read (from the local cache) and whether the YAML pinned it
    source: Mapping[str, Any] | None = None
    rows_sha256: str = ""  # the canonical hash of the rows as read; computed from ``docs`` when not given

    def __post_init__(self) -> None:
        if not self.rows_sha256:
            object.__setattr__(self, "rows_sha256", canonical_hash([dict(d) for d in self.docs]))

    @cached_property
    def columns(self) -> tuple[str, ...]:
        """The split's column names (lm-eval's ``features``), in first-seen order."""
        seen: dict[str, None] = {}
        for doc in self.docs:
            seen.update(dict.fromkeys(doc))
        return tuple(seen)

    def as_record(self) -> dict[str, Any]:
        record: dict[str, Any] = {"name": self.name, "files": [{"file": p.name, "sha256": s} for p, s in self.files],
                                  "docs": len(self.docs), "rows_sha256": self.rows_sha256}  # fmt: skip
        return record if self.source is None else {**record, "hub": dict(self.source)}


def local_splits(settings: Mapping[str, Any], origins: Mapping[str, Path]) -> dict[str, DataSplit]:
    """The dataset's splits from local files (``dataset_path: json|csv|parquet``, ``dataset_kwargs.data_files``),
    each file's path relative to the YAML that names it, else to the working directory (where lm-eval's
    ``datasets.load_dataset`` reads it from); every split the settings name must be there."""
    kind = settings.get("dataset_path")
    where = origins.get("dataset_path")
    if settings.get("dataset_name") is not None:
        raise BadInput(f"{origins['dataset_name']}: dataset_name", "a local json/csv/parquet dataset has no config "
                                                                   "name: expected null")  # fmt: skip
    kwargs = settings.get("dataset_kwargs") or {}
    kwargs_from = origins.get("dataset_kwargs", where)
    unknown = sorted(set(kwargs) - set(LOCAL_KWARGS))
    if unknown:
        raise BadInput(f"{kwargs_from}: dataset_kwargs.{unknown[0]}", "not implemented by evalrun (it reads "
                                                                      "data_files)")  # fmt: skip
    files = kwargs.get("data_files")
    if isinstance(files, str | list):
        files = {"train": files}  # datasets' default split for unnamed files
    if not isinstance(files, dict) or not files:
        raise BadInput(f"{kwargs_from}: dataset_kwargs.data_files", "the split files, {SPLIT: FILE or [FILES]}")
    base = Path(kwargs_from).parent if kwargs_from else Path()
    splits = {}
    for split, names in files.items():
        paths = [_data_file(base, str(n), f"{kwargs_from}: dataset_kwargs.data_files.{split}")
                 for n in ([names] if isinstance(names, str) else names)]  # fmt: skip
        docs = tuple(doc for p in paths for doc in _rows(p, str(kind)))
        splits[str(split)] = DataSplit(str(split), tuple((p, file_sha256(p)) for p in paths), docs)
    return splits


DATA_SUFFIXES = {".parquet": "parquet", ".jsonl": "json", ".json": "json", ".csv": "csv"}


def hub_splits(settings: Mapping[str, Any], origins: Mapping[str, Path], allow_unpinned: bool,
               revision_override: str | None = None) -> dict[str, DataSplit]:  # fmt: skip
    """A Hugging Face hub dataset's splits, read from the local hub cache (``HF_HUB_CACHE``; nothing is downloaded)
    at the commit ``dataset_kwargs.revision`` names: a branch or no revision is refused unless ``allow_unpinned``
    (then the commit the cache holds for it is read, and recorded as unpinned). The files of each split the task
    names are the ones the dataset card's ``configs`` give for ``dataset_name`` (else ``default``), or else
    those named after the split (``test-00000-of-00001.parquet``, ``test/...``) under the config's directory."""
    from huggingface_hub import constants, snapshot_download

    repo = str(settings["dataset_path"])
    where = f"{origins['dataset_path']}: dataset_path"
    kwargs = settings.get("dataset_kwargs") or {}
    kwargs_from = origins.get("dataset_kwargs", origins["dataset_path"])
    unknown = sorted(set(kwargs) - set(HUB_KWARGS))
    if unknown:
        raise BadInput(f"{kwargs_from}: dataset_kwargs.{unknown[0]}", "not implemented by evalrun for a hub dataset "
                                                                      "(it reads revision)")  # fmt: skip
    revision = revision_override if revision_override is not None else kwargs.get("revision")
    pinned = isinstance(revision, str) and COMMIT.fullmatch(revision) is not None
    if not pinned and not allow_unpinned:
        named = "task.dataset_revision" if revision_override is not None else f"{kwargs_from}: dataset_kwargs.revision"
        raise BadInput(named, f"the commit (40 hex digits) of {repo} to read, got {revision!r}: a branch or no "
                              "revision may change under the same name (task.dataset_revision=COMMIT pins it without "
                              "editing the YAML; task.allow_unpinned_dataset=true reads what the cache has, recorded "
                              "as unpinned)")  # fmt: skip
    cache = os.environ.get("HF_HUB_CACHE") or constants.HF_HUB_CACHE
    try:
        snapshot = Path(snapshot_download(repo, repo_type="dataset", revision=revision, local_files_only=True,
                                          cache_dir=cache))  # fmt: skip
    except Exception as exc:  # huggingface_hub's not-in-cache errors, and a repo id it refuses
        raise BadInput(
            where,
            f"{repo}@{revision or 'main'} is not in the local Hugging Face cache ({cache}); "
            "nothing is downloaded at run time: fetch it first (huggingface-cli download "
            f"--repo-type dataset {repo} --revision COMMIT) ({type(exc).__name__})",
        ) from exc
    config = settings.get("dataset_name")
    patterns = _card_configs(snapshot).get(str(config or "default"))
    base = snapshot / str(config) if config and (snapshot / str(config)).is_dir() else snapshot
    script = _script_note(snapshot, repo, cache)
    if config and patterns is None and base == snapshot:
        raise BadInput(
            f"{origins['dataset_name']}: dataset_name",
            f"{repo} has no config {config!r} (its card's configs, or a directory of that name){script}",
        )
    source = {"id": repo, "config": config, "revision": snapshot.name, "pinned": pinned}
    splits = {}
    for key, split in named_splits(settings):
        if str(split) in splits:
            continue
        globs = (patterns or {}).get(str(split))
        found = (sorted({f for g in globs for f in snapshot.glob(g) if f.is_file()}) if globs is not None
                 else _split_files(base, str(split)))  # fmt: skip
        if not found:
            raise BadInput(f"{origins[key]}: {key}",
                           f"{repo}@{snapshot.name} has no files for split {split!r}{script}")  # fmt: skip
        docs = tuple(doc for f in found for doc in _rows(f, _format_of(f, repo)))
        splits[str(split)] = DataSplit(str(split), tuple((f, file_sha256(f)) for f in found), docs, source)
    return splits


def named_splits(settings: Mapping[str, Any]) -> list[tuple[str, str]]:
    """The splits a task reads documents from: each ``*_split`` key's, and ``fewshot_config.split``."""
    named = [(key, settings.get(key)) for key in ("test_split", "validation_split", "training_split", "fewshot_split")]
    fewshot = settings.get("fewshot_config")
    named.append(("fewshot_config", fewshot.get("split") if isinstance(fewshot, Mapping) else None))
    return [(key, str(split)) for key, split in named if split is not None]


def _script_note(snapshot: Path, repo: str, cache: str) -> str:
    """What to say of a dataset defined by a loading script (``NAME.py`` at the top of the repository), whose data
    evalrun does not find as files: it runs no dataset code, and reads the hub's Parquet conversion of it instead,
    pinned by its own commit (the one the cache's ``refs/convert/parquet`` names, when it has one)."""
    scripts = sorted(p.name for p in snapshot.glob("*.py"))
    if not scripts:
        return ""
    ref = Path(cache) / f"datasets--{repo.replace('/', '--')}" / "refs" / "convert" / "parquet"
    conversion = ref.read_text(encoding="utf-8").strip() if ref.is_file() else None
    fetch = "huggingface-cli download --repo-type dataset --revision refs/convert/parquet"
    pin = (f"task.dataset_revision={conversion}, the commit of its Parquet conversion in the cache "
           "(refs/convert/parquet)" if conversion else f"the commit of its Parquet conversion ({fetch})")  # fmt: skip
    return f"; {repo} is defined by a loading script ({', '.join(scripts)}), which evalrun does not run: pin {pin}"


def _card_configs(snapshot: Path) -> dict[str, dict[str, list[str]]]:
    """The dataset card's ``configs``: each config's split file patterns (the YAML front matter of README.md)."""
    card = snapshot / "README.md"
    text = card.read_text(encoding="utf-8") if card.is_file() else ""
    if not text.startswith("---"):
        return {}
    header = yaml.safe_load(text.split("---", 2)[1]) or {}
    configs: dict[str, dict[str, list[str]]] = {}
    for entry in header.get("configs") or []:
        files = entry.get("data_files") or []
        if isinstance(files, str | dict):
            files = [{"split": "train", "path": files}] if isinstance(files, str) else [files]
        configs[str(entry.get("config_name", "default"))] = {
            str(f["split"]): [f["path"]] if isinstance(f["path"], str) else list(f["path"]) for f in files
        }
    return configs


def _split_files(base: Path, split: str) -> list[Path]:
    """The data files named after ``split`` under ``base``: ``SPLIT-*``, ``SPLIT.*``, ``SPLIT_*`` or in ``SPLIT/``."""
    named = re.compile(rf"{re.escape(split)}([-._ 0-9].*)?")
    return sorted(f for f in base.rglob("*") if f.is_file() and f.suffix in DATA_SUFFIXES
                  and (named.fullmatch(f.stem) or named.fullmatch(f.name) or f.parent.name == split))  # fmt: skip


def _format_of(path: Path, repo: str) -> str:
    if path.suffix not in DATA_SUFFIXES:
        raise BadInput(str(path), f"a data file of {repo} evalrun cannot read (parquet, json, jsonl, csv)")
    return DATA_SUFFIXES[path.suffix]


def _data_file(base: Path, name: str, where: str) -> Path:
    path = Path(name)
    for candidate in [path] if path.is_absolute() else [base / path, Path.cwd() / path]:
        if candidate.is_file():
            return candidate.resolve()
    raise BadInput(where, f"{name}: no such file beside the YAML ({base}) or in the working directory")


def _rows(path: Path, kind: str) -> Iterator[dict[str, Any]]:
    """A data file's rows as dictionaries: JSON Lines (or one JSON list), CSV, Parquet."""
    if kind == "json":
        text = path.read_text(encoding="utf-8")
        if text.lstrip().startswith("["):
            yield from json.loads(text)
            return
        for number, line in enumerate(text.splitlines(), 1):
            if line.strip():
                try:
                    yield json.loads(line)
                except json.JSONDecodeError as exc:
                    raise BadInput(f"{path}:{number}", f"not a JSON object ({exc.msg})") from exc
    elif kind == "csv":  # types inferred, as datasets' CSV reader infers them (numbers are numbers)
        import pyarrow.csv as pcsv

        yield from pcsv.read_csv(path).to_pylist()
    else:
        import pyarrow.parquet as pq

        yield from pq.read_table(path).to_pylist()
