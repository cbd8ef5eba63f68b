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

from evalrun.records.canonical import canonical_hash, file_sha256
from evalrun.tasks.rubric import Rubric, aggregate, rubric_score
from evalrun.tasks.selection import parse_letter

SCORER_VERSIONS = {"exact_match": "1", "regex": "1", "number": "1", "choice": "1", "rubric": "1"}
BASE_COLUMNS = ["episode_id", "task", "item_id", "seed", "repeat", "output", "target"]

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
    if name in ("choice", "rubric"):
        raise ValueError(f"the {name} scorer reads whole output rows (score_outputs), not one output")
    raise ValueError(f"unknown scorer {name!r}")


_SCORING_MODULES = [Path(__file__).resolve().parents[1] / "tasks" / name for name in ("rubric.py", "selection.py")]


@dataclass(frozen=True)
class ScoringContext:
    """What a multiple-choice or rubric scorer needs beyond the scorer section.

    ``judge_model`` identifies the judges' model (the sha256 of its pinned files, as a hash): a
    rubric's verdicts are only as good as the model that gave them, so it is part of the scoring hash.
    """

    choice_scoring: str = ""  # letter | loglikelihood | both
    rubric: Rubric | None = None
    judge_model: str | None = None

    @classmethod
    def of(cls, task_section: dict[str, Any], rubric: Rubric | None, model_files: dict[str, str]) -> ScoringContext:
        """The context of a task config section, its loaded rubric and the run's pinned model files."""
        choice = task_section["choices"]["scoring"] if task_section["choices"]["field"] is not None else ""
        return cls(choice, rubric, canonical_hash(model_files) if rubric is not None else None)

    @classmethod
    def recorded(cls, manifest: dict[str, Any], rubric: Rubric | None) -> ScoringContext:
        """The context a finished run was scored with, from its manifest (``rubric`` read again)."""
        task = manifest.get("task", {})
        choices = task.get("choices") or {"field": None, "scoring": ""}
        judges = manifest.get("judge_model") or manifest["model"]  # the run's model when no judge model
        return cls.of({"choices": choices}, rubric, judges["files"])

    def as_record(self) -> dict[str, Any]:
        return {
            "choice_scoring": self.choice_scoring,
            "rubric": self.rubric.as_record() if self.rubric is not None else None,
            "judge_model": self.judge_model,
        }


def scoring_hash(spec: dict[str, Any], context: ScoringContext | None = None) -> str:
    """Hash of the scoring code: scorer, version, parameters, this package's source, Python version,
    and for multiple choice and rubric scorers their context (rubric, judge pack, judge model)."""
    package = Path(__file__).resolve().parent
    sources = {p.name: file_sha256(p) for p in sorted(package.glob("*.py"))}
    for module in _SCORING_MODULES:  # option parsing and rubric aggregation live with the tasks
        sources[f"tasks/{module.name}"] = file_sha256(module)
    record = {
        "scorer": spec["name"],
        "version": SCORER_VERSIONS[spec["name"]],
        "params": spec,
        "sources": sources,
        "python": f"{sys.version_info.major}.{sys.version_info.minor}",
    }
    if context is not None and context != ScoringContext():
        record["context"] = context.as_record()
    return canonical_hash(record)


def score_columns(spec: dict[str, Any]) -> list[str]:
    """The output columns a scorer reads."""
    if spec["name"] == "choice":
        return [*BASE_COLUMNS, "shuffle_order", "option_logprobs"]
    if spec["name"] == "rubric":
        return [*BASE_COLUMNS, "judgements"]
    return BASE_COLUMNS


def _argmax(values: list[float]) -> int:
    """Index of the largest value; ties go to the lowest index."""
    return max(range(len(values)), key=lambda i: (values[i], -i))


def _choice_scores(row: dict[str, Any], context: ScoringContext) -> list[Score]:
    target = int(row["target"])
    scores = []
    if context.choice_scoring in ("letter", "both"):
        picked = parse_letter(row["output"], row["shuffle_order"])
        scores.append(Score("choice_letter", float(picked == target), None if picked is None else str(picked)))
    if context.choice_scoring in ("loglikelihood", "both") and row["option_logprobs"] is not None:
        picked = _argmax(row["option_logprobs"])
        scores.append(Score("choice_loglikelihood", float(picked == target), str(picked)))
    return scores


def verdict(judgement: dict[str, Any], scoring: str) -> int | None:
    """The original option index a judge chose: the letter it wrote, or its likeliest option."""
    if scoring == "letter":
        return parse_letter(judgement["output"] or "", judgement["shuffle_order"])
    logprobs = judgement["option_logprobs"]
    return _argmax(logprobs) if logprobs else None


def _rubric_scores(row: dict[str, Any], context: ScoringContext) -> list[Score]:
    rubric = context.rubric
    assert rubric is not None
    verdicts: dict[str, list[int | None]] = {}
    for judgement in row["judgements"]:
        verdicts.setdefault(judgement["criterion"], []).append(verdict(judgement, rubric.scoring))
    values = {c.id: aggregate(c, verdicts.get(c.id, []), rubric.aggregation) for c in rubric.criteria}
    scores = [
        Score(f"rubric/{c.id}", values[c.id], ",".join("-" if v is None else str(v) for v in verdicts.get(c.id, [])))
        for c in rubric.criteria
        if values[c.id] is not None
    ]
    total = rubric_score(rubric, values)
    if total is not None:
        scores.append(Score("rubric", total, None))
    assessed = sum(v is not None for v in values.values()) / len(values)
    scores.append(Score("rubric_assessed", assessed, None))
    return scores


def score_outputs(outputs: pa.Table, spec: dict[str, Any], context: ScoringContext | None = None) -> pa.Table:
    """Rows per (episode, metric), sorted by episode id so the table never depends on part order."""
    name = spec["name"]
    version = SCORER_VERSIONS[name]
    cols = outputs.select(score_columns(spec)).to_pydict()
    if name == "choice" or name == "rubric":
        ctx = context or ScoringContext()
        if name == "rubric" and ctx.rubric is None:
            raise ValueError("the rubric scorer needs the task's rubric")
        by_row = _choice_scores if name == "choice" else _rubric_scores
        keys = list(cols)

        def score_row(i: int) -> list[Score]:
            return by_row({k: cols[k][i] for k in keys}, ctx)
    else:
        scorer = make_scorer(spec)

        def score_row(i: int) -> list[Score]:
            return [scorer(cols["output"][i], cols["target"][i])]

    order = sorted(range(len(cols["episode_id"])), key=cols["episode_id"].__getitem__)
    rows: dict[str, list[Any]] = {name: [] for name in SCORES_SCHEMA.names}
    for i in order:
        for score in score_row(i):
            for key in ("episode_id", "task", "item_id", "seed", "repeat"):
                rows[key].append(cols[key][i])
            rows["metric"].append(score.metric)
            rows["value"].append(score.value)
            rows["extracted"].append(score.extracted)
            rows["scorer"].append(spec["name"])
            rows["scorer_version"].append(version)
    return pa.table(rows, schema=SCORES_SCHEMA)
