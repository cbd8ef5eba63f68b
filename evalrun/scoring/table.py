"""scores.parquet: every output row scored by the configured scorer, one row per (episode, metric)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

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


SCORE_CHUNK_ROWS = 16384  # output rows turned into Python values at a time: bounds scoring's memory


def score_outputs(outputs: pa.Table, spec: ScorerConfig, context: ScoringContext | None = None) -> pa.Table:
    """Rows per (episode, metric), sorted by episode id so the table never depends on part order.

    An episode that failed, or whose row the scorer raised on, scores 0 on every metric with the
    reason in ``error`` (docs/design.md "Failed episodes"): one bad row never costs the others.
    Its metrics are those the scorer gives the first episode scored (the scorer's name when none was).
    Rows are scored in episode-id order, ``SCORE_CHUNK_ROWS`` at a time, so that only the tables
    (Arrow) hold every row (docs/design.md "Scores").
    """
    entry = SCORERS.get(spec.name)
    score_row = make_scorer(spec, context)
    # finish_reason tells failed episodes apart; a table without it (made by hand) has none
    marked = "finish_reason" in outputs.column_names
    selected = outputs.select(sorted({*entry.columns, "finish_reason"} if marked else set(entry.columns)))
    order = pc.sort_indices(selected, sort_keys=[("episode_id", "ascending")])  # stable, as sorted() was

    def rows(chunk: pa.Table) -> Iterator[tuple[bool, dict[str, Any], dict[str, list[Any]]]]:
        columns = chunk.to_pydict()
        failed = [r == FAILED_FINISH_REASON for r in columns["finish_reason"]] if marked else [False] * chunk.num_rows
        for i, values in enumerate(zip(*(columns[name] for name in entry.reads), strict=True)):
            yield failed[i], dict(zip(entry.reads, values, strict=True)), columns

    def chunks() -> Iterator[pa.Table]:
        for start in range(0, len(order), SCORE_CHUNK_ROWS):
            yield selected.take(order[start : start + SCORE_CHUNK_ROWS])

    metrics = _first_metrics(chunks(), rows, score_row)
    metrics = [spec.name] if metrics is None else metrics
    tables: list[pa.Table] = []
    any_error = False
    for chunk in chunks():
        table: dict[str, list[Any]] = {name: [] for name in (*IDENTITY_COLUMNS, "metric", "value", "extracted")}
        errors: list[str | None] = []
        for i, (failed, row, columns) in enumerate(rows(chunk)):
            error = EPISODE_FAILED if failed else None
            scores: list[Score] = []
            if error is None:
                try:
                    scores = score_row(row)
                except Exception as exc:  # any fault of the scorer on this row is this episode's, recorded as its error
                    error = scorer_error(spec.name, exc)
            if error is not None:
                scores = [Score(metric, 0.0, None) for metric in metrics]
                any_error = True
            for score in scores:
                for name in IDENTITY_COLUMNS:
                    table[name].append(columns[name][i])
                table["metric"].append(score.metric)
                table["value"].append(score.value)
                table["extracted"].append(score.extracted)
                errors.append(error)
        n = len(errors)
        tables.append(pa.table({**table, "scorer": [spec.name] * n, "scorer_version": [entry.version] * n,
                                SCORE_ERROR_COLUMN: errors}, schema=SCORES_SCHEMA))  # fmt: skip
    # chunked: a copy into one chunk would double the peak, and Parquet writes the same bytes either way
    scores = pa.concat_tables(tables) if tables else SCORES_SCHEMA.empty_table()
    if not any_error:  # left out when no episode has one, so runs without errors keep their bytes
        return scores.drop_columns([SCORE_ERROR_COLUMN])
    return scores


def _first_metrics(
    chunks: Iterator[pa.Table],
    rows: Callable[[pa.Table], Iterator[tuple[bool, dict[str, Any], dict[str, list[Any]]]]],
    score_row: RowScorer,
) -> list[str] | None:
    """The metrics of the first episode (in episode-id order) the scorer scores; None when it scores none."""
    for chunk in chunks:
        for failed, row, _ in rows(chunk):
            if failed:
                continue
            try:
                return [score.metric for score in score_row(row)]
            except Exception:  # this row scores 0 with its error; the next one may give the metrics
                continue
    return None


EPISODE_FAILED = "episode failed: its chain's end entry gives the reason"


def scorer_error(name: str, exc: Exception) -> str:
    """The recorded reason a scorer gave no score: the exception's type and message (one line)."""
    message = " ".join(str(exc).split())
    return f"scorer {name} raised {type(exc).__name__}" + (f": {message}" if message else "")
