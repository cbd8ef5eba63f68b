"""scores.parquet: every output row scored by the configured scorer, one row per (episode, metric)."""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from evalrun.config import ScorerConfig
from evalrun.records.outputs import SCORES_SCHEMA
from evalrun.scoring.context import ScoringContext
from evalrun.scoring.registry import IDENTITY_COLUMNS, NORMALIZERS, SCORERS, RowScorer, Score


def scorer_version(spec: ScorerConfig) -> str:
    return SCORERS.get(spec.name).version


def score_columns(spec: ScorerConfig) -> list[str]:
    """The output columns a scorer reads."""
    return list(SCORERS.get(spec.name).columns)


def make_scorer(spec: ScorerConfig, context: ScoringContext | None = None) -> RowScorer:
    """The scorer of ``spec``: output row -> scores. A BadInput names the setting it cannot use
    (an unknown scorer or normaliser, a regex that does not compile)."""
    for name in spec.normalize:
        NORMALIZERS.check(name)
    return SCORERS.get(spec.name).build(spec, context or ScoringContext())


def score_outputs(outputs: pa.Table, spec: ScorerConfig, context: ScoringContext | None = None) -> pa.Table:
    """Rows per (episode, metric), sorted by episode id so the table never depends on part order."""
    entry = SCORERS.get(spec.name)
    score_row = make_scorer(spec, context)
    columns = outputs.select(list(entry.columns)).to_pydict()
    read = [columns[name] for name in entry.reads]
    rows = [dict(zip(entry.reads, values, strict=True)) for values in zip(*read, strict=True)]
    source: list[int] = []  # the output row of each score
    scores: list[Score] = []
    for i in sorted(range(len(rows)), key=columns["episode_id"].__getitem__):
        for score in score_row(rows[i]):
            source.append(i)
            scores.append(score)
    table: dict[str, list[Any]] = {name: [columns[name][i] for i in source] for name in IDENTITY_COLUMNS}
    table["metric"] = [score.metric for score in scores]
    table["value"] = [score.value for score in scores]
    table["extracted"] = [score.extracted for score in scores]
    table["scorer"] = [spec.name] * len(scores)
    table["scorer_version"] = [entry.version] * len(scores)
    return pa.table(table, schema=SCORES_SCHEMA)
