"""The scoring part of the run digest: what decides a run's scores, other than its outputs."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from evalrun.config import ScorerConfig
from evalrun.records.canonical import canonical_hash, file_sha256
from evalrun.scoring.context import ScoringContext
from evalrun.scoring.table import scorer_version

PACKAGE = Path(__file__).resolve().parent


def scoring_sources() -> dict[str, str]:
    """sha256 of every source file of this package (all scoring code lives here), by relative path."""
    return {p.relative_to(PACKAGE).as_posix(): file_sha256(p) for p in sorted(PACKAGE.rglob("*.py"))}


def scoring_libraries() -> dict[str, str]:
    """The versions of the libraries scores are computed with beyond Python (numpy: statistics and
    loglikelihood sums; pyarrow: the score tables' compute kernels)."""
    import numpy
    import pyarrow

    return {"numpy": numpy.__version__, "pyarrow": pyarrow.__version__}


def scoring_record(spec: ScorerConfig, context: ScoringContext | None = None) -> dict[str, Any]:
    """What the scoring hash covers: scorer, version, parameters, this package's source, Python version
    (``re`` and ``unicodedata`` are part of what a scorer computes), numpy's and pyarrow's versions, and for
    multiple choice, rubric and agent scorers their context (rubric, judge pack, judge model; the world's
    verifier: its versions and its source's hash)."""
    record: dict[str, Any] = {
        "scorer": spec.name,
        "version": scorer_version(spec),
        "params": spec.as_record(),
        "sources": scoring_sources(),
        "python": f"{sys.version_info.major}.{sys.version_info.minor}",
        "libraries": scoring_libraries(),
    }
    if context is not None and context != ScoringContext():
        record["context"] = context.as_record()
    return record


def scoring_hash(spec: ScorerConfig, context: ScoringContext | None = None) -> str:
    """Hash of :func:`scoring_record`: the manifest's ``digest.scoring``."""
    return canonical_hash(scoring_record(spec, context))
