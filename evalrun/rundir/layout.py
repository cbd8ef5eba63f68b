"""The run directory's names and paths: the contract every writer and reader of a run shares.

See docs/design.md "The run directory".
"""

from __future__ import annotations

import re
from pathlib import Path

from evalrun.errors import BadInput

MANIFEST = "manifest.json"
CONFIG = "config.yaml"
OUTPUTS = "outputs"
LOG = "log"
SCORES = "scores.parquet"
SUMMARY = "summary.json"
RECORD = "record.json"
ATTESTATION = "attestation.intoto.json"
LOCK = ".lock"
PART_PATTERN = re.compile(r"^part-(\d{5})\.(parquet|jsonl)$")


class RunDir:
    """Paths of one run directory."""

    def __init__(self, path: Path) -> None:
        self.path = path

    manifest = property(lambda self: self.path / MANIFEST)
    config = property(lambda self: self.path / CONFIG)
    outputs = property(lambda self: self.path / OUTPUTS)
    log = property(lambda self: self.path / LOG)
    scores = property(lambda self: self.path / SCORES)
    summary = property(lambda self: self.path / SUMMARY)
    record = property(lambda self: self.path / RECORD)

    def output_part(self, index: int) -> Path:
        return self.outputs / f"part-{index:05d}.parquet"

    def log_part(self, index: int) -> Path:
        return self.log / f"part-{index:05d}.jsonl"

    def output_parts(self) -> list[Path]:
        return sorted(p for p in self.outputs.glob("part-*.parquet") if PART_PATTERN.match(p.name))


def create_run_dir(root: Path, name: str, exact: Path | None = None) -> RunDir:
    """A new, empty run directory: ``exact`` if given (it must not hold a run), else ``root/name[-k]``."""
    if exact is not None:
        if exact.exists() and any(exact.iterdir()):
            raise BadInput("run.dir", f"{exact} already exists and is not empty")
        path = exact
    else:
        path = root / name
        k = 1
        while path.exists():
            k += 1
            path = root / f"{name}-{k}"
    path.mkdir(parents=True, exist_ok=True)
    (path / OUTPUTS).mkdir()
    (path / LOG).mkdir()
    return RunDir(path)
