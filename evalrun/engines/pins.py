"""Model pinning: resolve a model directory and check its files against pinned SHA-256 hashes."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import yaml

from evalrun.errors import BadInput
from evalrun.records.canonical import file_sha256

# Files that do not change what the model computes; never pinned, never compared.
_UNPINNED_NAMES = {"README.md", ".gitattributes"}


@dataclass(frozen=True)
class ResolvedModel:
    """A model directory on disk and what the manifest records about it."""

    id: str
    revision: str | None
    path: Path
    files: dict[str, str]  # relative file name -> sha256
    pinned: bool

    def as_record(self) -> dict[str, object]:
        return {
            "id": self.id,
            "revision": self.revision,
            "path": str(self.path),
            "files": dict(sorted(self.files.items())),
            "pinned": self.pinned,
        }


def hash_model_dir(path: Path) -> dict[str, str]:
    """sha256 of every file under ``path`` that the engine may read, by relative name."""
    hashes = {}
    for file in sorted(p for p in path.rglob("*") if p.is_file()):
        rel = file.relative_to(path).as_posix()
        if file.name in _UNPINNED_NAMES or rel.startswith("."):
            continue
        hashes[rel] = file_sha256(file)
    return hashes


def write_pins(config_file: Path, hashes: dict[str, str]) -> None:
    """Rewrite the ``sha256`` mapping of a model config file, keeping its other keys."""
    data = yaml.safe_load(config_file.read_text(encoding="utf-8")) or {}
    data["sha256"] = dict(sorted(hashes.items()))
    config_file.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")


def _hub_cache_dir(model_id: str, revision: str, cache_dir: str | None) -> Path:
    """A hub id + revision resolved from the local Hugging Face cache (nothing is downloaded)."""
    from huggingface_hub import snapshot_download

    try:
        return Path(snapshot_download(model_id, revision=revision, cache_dir=cache_dir, local_files_only=True))
    except Exception as exc:  # huggingface_hub raises several types for "not in cache"
        raise BadInput(
            "model.id", f"{model_id!r} at revision {revision!r} is not in the local hub cache ({exc})"
        ) from exc


def model_directory(*, model_id: str, path: str | None, revision: str | None, cache_dir: str | None,
                    repo_root: Path) -> Path:  # fmt: skip
    """The model's directory, found but not hashed (a BadInput names the field when there is none)."""
    if path:
        directory = Path(path)
        if not directory.is_absolute():
            directory = repo_root / directory
        if not directory.is_dir():
            raise BadInput("model.path", f"{directory} is not a directory")
        return directory
    if not revision:
        raise BadInput("model.revision", "a hub model id needs a revision (commit hash) to be pinned")
    return _hub_cache_dir(model_id, revision, cache_dir)


def resolve_model(
    *,
    model_id: str,
    path: str | None,
    revision: str | None,
    pins: dict[str, str],
    cache_dir: str | None = None,
    pinned: bool,
    repo_root: Path,
) -> ResolvedModel:
    """Find the model's files and check every pinned hash; raise BadInput naming the first mismatch."""
    directory = model_directory(model_id=model_id, path=path, revision=revision, cache_dir=cache_dir,
                                repo_root=repo_root)  # fmt: skip
    actual = hash_model_dir(directory)
    if pinned:
        if not pins:
            raise BadInput("model.sha256", "no pinned hashes; pin every file or set model.pinned=false")
        for name, expected in sorted(pins.items()):
            got = actual.get(name)
            if got is None:
                raise BadInput(f"{directory / name}", f"pinned file is missing (expected sha256 {expected})")
            if got != expected:
                raise BadInput(f"{directory / name}", f"sha256 is {got}, pinned sha256 is {expected}")
        unpinned = sorted(set(actual) - set(pins))
        if unpinned:
            raise BadInput(f"{directory / unpinned[0]}", "file is not pinned in model.sha256")
    return ResolvedModel(id=model_id, revision=revision, path=directory.resolve(), files=actual, pinned=pinned)
