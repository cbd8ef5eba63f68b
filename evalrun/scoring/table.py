"""scores.parquet: every output row scored by the configured scorer, one row per (episode, metric)."""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from evalrun.config import ScorerConfig
from evalrun.records.outputs import FAILED_FINISH_REASON, SCORE_ERROR_COLUMN, SCORES_SCHEMA
from evalrun.scoring.context import ScoringContext
from evalrun.scoring.registry import IDENTITY_COLUMNS, NORMALIZERS, SCORERS, RowScorer, Score


def scorer_version(spec: ScorerConfig) -> str:
    return SCORERS.get(spec.name).version


def score_columns(spec: ScorerConfig) -> list[str]:
    """The output columns a scorer reads (and ``finish_reason``, which tells failed episodes apart)."""
    columns = list(SCORERS.get(spec.name).columns)
    return columns if "finish_reason" in columns else [*columns, "finish_reason"]


def make_scorer(spec: ScorerConfig, context: ScoringContext | None = None) -> RowScorer:
    """The scorer of ``spec``: output row -> scores. A BadInput names the setting it cannot use
    (an unknown scorer or normaliser, a regex that does not compile)."""
    for name in spec.normalize:
        NORMALIZERS.check(name)
    return SCORERS.get(spec.name).build(spec, context or ScoringContext())


def score_outputs(outputs: pa.Table, spec: ScorerConfig, context: ScoringContext | None = None) -> pa.Table:
    """Rows per (episode, metric), sorted by episode id so the table never depends on part order.

    An episode that failed, or whose row the scorer raised on, scores 0 on every metric with the
    reason in ``error`` (docs/design.md "Failed episodes"): one bad row never costs the others.
    Its metrics are those the scorer gives the first episode scored (the scorer's name when none was).
    """
    entry = SCORERS.get(spec.name)
    score_row = make_scorer(spec, context)
    # finish_reason tells failed episodes apart; a table without it (made by hand) has none
    marked = "finish_reason" in outputs.column_names
    columns = outputs.select(sorted({*entry.columns, "finish_reason"} if marked else set(entry.columns))).to_pydict()
    read = [columns[name] for name in entry.reads]
    rows = [dict(zip(entry.reads, values, strict=True)) for values in zip(*read, strict=True)]
    order = sorted(range(len(rows)), key=columns["episode_id"].__getitem__)
    failed = [reason == FAILED_FINISH_REASON for reason in columns["finish_reason"]] if marked else [False] * len(rows)
    scored: dict[int, list[Score]] = {}
    errors: dict[int, str] = {}
    for i in order:
        if failed[i]:
            errors[i] = EPISODE_FAILED
            continue
        try:
            scored[i] = score_row(rows[i])
        except Exception as exc:  # any fault of the scorer on this row is this episode's, recorded as its error
            errors[i] = scorer_error(spec.name, exc)
    metrics = [score.metric for score in next(iter(scored.values()))] if scored else [spec.name]
    source: list[int] = []  # the output row of each score
    scores: list[Score] = []
    for i in order:
        for score in scored[i] if i in scored else [Score(metric, 0.0, None) for metric in metrics]:
            source.append(i)
            scores.append(score)
    table: dict[str, list[Any]] = {name: [columns[name][i] for i in source] for name in IDENTITY_COLUMNS}
    table["metric"] = [score.metric for score in scores]
    table["value"] = [score.value for score in scores]
    table["extracted"] = [score.extracted for score in scores]
    table["scorer"] = [spec.name] * len(scores)
    table["scorer_version"] = [entry.version] * len(scores)
    if not errors:  # left out when no episode has one, so runs without errors keep their bytes
        return pa.table(table, schema=SCORES_SCHEMA.remove(SCORES_SCHEMA.get_field_index(SCORE_ERROR_COLUMN)))
    table[SCORE_ERROR_COLUMN] = [errors.get(i) for i in source]
    return pa.table(table, schema=SCORES_SCHEMA)


EPISODE_FAILED = "episode failed: its chain's end entry gives the reason"


def scorer_error(name: str, exc: Exception) -> str:
    """The recorded reason a scorer gave no score: the exception's type and message (one line)."""
    message = " ".join(str(exc).split())
    return f"scorer {name} raised {type(exc).__name__}" + (f": {message}" if message else "")
