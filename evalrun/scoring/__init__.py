"""Versioned scorers: pure functions of a stored output and its target.

A scorer's version changes whenever what it computes changes; the scoring hash in the manifest
covers scorer name, version and parameters, the source of this package, and the Python version
(``re`` and ``unicodedata`` are part of what a scorer computes).
"""

from __future__ import annotations

import re
import string
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa

from evalrun.digest import canonical_hash, file_sha256

SCORER_VERSIONS = {"exact_match": "1", "regex": "1", "number": "1"}

_PUNCTUATION = str.maketrans("", "", string.punctuation)
_NUMBER = re.compile(r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?")

NORMALIZERS: dict[str, Callable[[str], str]] = {
    "strip": str.strip,
    "lower": str.lower,
    "collapse_whitespace": lambda s: " ".join(s.split()),
    "strip_punctuation": lambda s: s.translate(_PUNCTUATION),
}

SCORES_SCHEMA = pa.schema(
    [
        ("episode_id", pa.string()),
        ("task", pa.string()),
        ("item_id", pa.string()),
        ("seed", pa.int64()),
        ("repeat", pa.int32()),
        ("metric", pa.string()),
        ("value", pa.float64()),
        ("extracted", pa.string()),
        ("scorer", pa.string()),
        ("scorer_version", pa.string()),
    ]
)


@dataclass(frozen=True)
class Score:
    metric: str
    value: float
    extracted: str | None


def _normalizer(names: list[str]) -> Callable[[str], str]:
    steps = [NORMALIZERS[n] for n in names]

    def apply(text: str) -> str:
        for step in steps:
            text = step(text)
        return text

    return apply


def make_scorer(spec: dict[str, Any]) -> Callable[[str, str], Score]:
    """A scorer ``(output, target) -> Score`` from a ``task.scorer`` config section."""
    name = spec["name"]
    norm = _normalizer(spec["normalize"])
    if name == "exact_match":

        def exact_match(output: str, target: str) -> Score:
            got = norm(output)
            return Score("exact_match", float(got == norm(target)), got)

        return exact_match
    if name == "regex":
        pattern, group = re.compile(spec["pattern"]), spec["group"]

        def regex(output: str, target: str) -> Score:
            match = pattern.search(output)
            if match is None:
                return Score("regex_match", 0.0, None)
            got = norm(match.group(group))
            return Score("regex_match", float(got == norm(target)), got)

        return regex
    if name == "number":
        pick, tolerance = spec["extract"], spec["tolerance"]

        def number(output: str, target: str) -> Score:
            found = _NUMBER.findall(output)
            if not found:
                return Score("number_match", 0.0, None)
            got = found[0] if pick == "first" else found[-1]
            try:
                ok = abs(float(got) - float(target)) <= tolerance
            except ValueError:
                ok = False
            return Score("number_match", float(ok), got)

        return number
    raise ValueError(f"unknown scorer {name!r}")


def scoring_hash(spec: dict[str, Any]) -> str:
    """Hash of the scoring code: scorer, version, parameters, this package's source, Python version."""
    package = Path(__file__).resolve().parent
    sources = {p.name: file_sha256(p) for p in sorted(package.glob("*.py"))}
    return canonical_hash(
        {
            "scorer": spec["name"],
            "version": SCORER_VERSIONS[spec["name"]],
            "params": spec,
            "sources": sources,
            "python": f"{sys.version_info.major}.{sys.version_info.minor}",
        }
    )


def score_outputs(outputs: pa.Table, spec: dict[str, Any]) -> pa.Table:
    """One row per (episode, metric), sorted by episode id so the table never depends on part order."""
    scorer = make_scorer(spec)
    version = SCORER_VERSIONS[spec["name"]]
    cols = outputs.select(["episode_id", "task", "item_id", "seed", "repeat", "output", "target"]).to_pydict()
    order = sorted(range(len(cols["episode_id"])), key=cols["episode_id"].__getitem__)
    rows: dict[str, list[Any]] = {name: [] for name in SCORES_SCHEMA.names}
    for i in order:
        score = scorer(cols["output"][i], cols["target"][i])
        for key in ("episode_id", "task", "item_id", "seed", "repeat"):
            rows[key].append(cols[key][i])
        rows["metric"].append(score.metric)
        rows["value"].append(score.value)
        rows["extracted"].append(score.extracted)
        rows["scorer"].append(spec["name"])
        rows["scorer_version"].append(version)
    return pa.table(rows, schema=SCORES_SCHEMA)
