"""A local Hugging Face hub cache holding datasets as huggingface_hub lays them out (``datasets--OWNER--NAME/
snapshots/COMMIT/...`` with ``refs/main``), written from rows in each dataset's real schema: what evalrun reads
lm-eval's shipped task YAMLs' data from, offline, at a pinned commit."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from evalrun.records.canonical import sha256_hex


def commit_of(repo: str) -> str:
    """A made-up commit for a test's dataset (40 hex digits, fixed by the name)."""
    return sha256_hex(repo)[:40]


def write_hub_dataset(cache: Path, repo: str, config: str | None,
                      splits: Mapping[str, Sequence[Mapping[str, Any]]]) -> str:  # fmt: skip
    """``splits`` of ``repo`` (config ``config``: its directory; None: the repository's top) at its commit, each
    split one Parquet file named as the hub names them (``SPLIT-00000-of-00001.parquet``); returns the commit."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    commit = commit_of(repo)
    root = cache / f"datasets--{repo.replace('/', '--')}"
    (root / "refs").mkdir(parents=True, exist_ok=True)
    (root / "refs" / "main").write_text(commit)
    for split, rows in splits.items():
        path = split_file(cache, repo, config, split)
        path.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(pa.Table.from_pylist([dict(r) for r in rows]), path)
    return commit


def split_file(cache: Path, repo: str, config: str | None, split: str) -> Path:
    """Where :func:`write_hub_dataset` writes a split's Parquet file."""
    base = cache / f"datasets--{repo.replace('/', '--')}" / "snapshots" / commit_of(repo) / (config or "data")
    return base / f"{split}-00000-of-00001.parquet"
