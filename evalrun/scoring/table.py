"""scores.parquet: every output row scored by the configured scorer, one row per (episode, metric)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any, TypeVar

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


T = TypeVar("T")

SCORE_CHUNK_ROWS = 16384  # output rows turned into Python values at a time: bounds scoring's memory


def score_outputs(outputs: pa.Table, spec: ScorerConfig, context: ScoringContext | None = None) -> pa.Table:
    """Rows per (episode, metric), sorted by episode id so the table never depends on part order: the
    chunks of :func:`stream_scores` as one (chunked) table."""
    return stream_scores(outputs, spec, context, _one_table)


def _one_table(schema: pa.Schema, chunks: Iterable[pa.Table]) -> pa.Table:
    tables = list(chunks)
    return pa.concat_tables(tables) if tables else schema.empty_table()


class _ErrorColumnNeeded(Exception):
    """A row scored 0 with an error after chunks were handed over without the ``error`` column."""


def stream_scores(outputs: pa.Table, spec: ScorerConfig, context: ScoringContext | None,
                  into: Callable[[pa.Schema, Iterator[pa.Table]], T]) -> T:  # fmt: skip
    """``into(schema, chunks)`` with the scores of ``outputs`` as they are computed, ``SCORE_CHUNK_ROWS``
    episodes at a time in episode-id order (so a run never holds its whole scores table; docs/design.md
    "Scores"), and its result.

    An episode that failed, or whose row the scorer raised on, scores 0 on every metric with the
    reason in ``error`` (docs/design.md "Failed episodes"): one bad row never costs the others.
    Its metrics are those the scorer gives the first episode scored (the scorer's name when none was).
    The ``error`` column is left out when no row has one, so runs without errors keep their bytes: when
    a scorer raises after chunks went to ``into`` without it, ``into`` is called again from the start
    with it (the iterator it had raises, and what it made of it is to be discarded).
    """
    entry = SCORERS.get(spec.name)
    score_row = make_scorer(spec, context)
    # finish_reason tells failed episodes apart; a table without it (made by hand) has none
    marked = "finish_reason" in outputs.column_names
    selected = outputs.select(sorted({*entry.columns, "finish_reason"} if marked else set(entry.columns)))
    order = pc.sort_indices(selected, sort_keys=[("episode_id", "ascending")])  # stable, as sorted() was

    def rows(chunk: pa.Table) -> Iterator[tuple[bool, dict[str, Any]]]:
        columns = [chunk.column(name).to_pylist() for name in entry.reads]  # only what the scorer reads
        failed = [r == FAILED_FINISH_REASON for r in chunk.column("finish_reason").to_pylist()] if marked else None
        for i, values in enumerate(zip(*columns, strict=True)):
            yield failed is not None and failed[i], dict(zip(entry.reads, values, strict=True))

    def chunks(size: int) -> Iterator[pa.Table]:
        for start in range(0, len(order), size):
            yield selected.take(order[start : start + size])

    metrics = _first_metrics(chunks(64), rows, score_row)  # the first rows almost always give them
    metrics = [spec.name] if metrics is None else metrics

    def scored(with_error: bool) -> Iterator[pa.Table]:
        schema = SCORES_SCHEMA if with_error else _WITHOUT_ERROR
        for chunk in chunks(SCORE_CHUNK_ROWS):
            table: dict[str, list[Any]] = {"metric": [], "value": [], "extracted": []}
            errors: list[str | None] = []
            per_row: list[int] = []  # score rows per output row
            for failed, row in rows(chunk):
                error = EPISODE_FAILED if failed else None
                scores: list[Score] = []
                if error is None:
                    try:
                        scores = score_row(row)
                    except Exception as exc:  # any fault of the scorer on this row is this episode's, its error
                        error = scorer_error(spec.name, exc)
                if error is not None:
                    if not with_error:
                        raise _ErrorColumnNeeded
                    scores = [Score(metric, 0.0, None) for metric in metrics]
                per_row.append(len(scores))
                for score in scores:
                    table["metric"].append(score.metric)
                    table["value"].append(score.value)
                    table["extracted"].append(score.extracted)
                    errors.append(error)
            # each score row's episode columns, taken in Arrow from its output row (no copy when one each)
            identity = chunk.select(list(IDENTITY_COLUMNS))
            if any(count != 1 for count in per_row):
                identity = identity.take(pa.array([i for i, count in enumerate(per_row) for _ in range(count)],
                                                  pa.int64()))  # fmt: skip
            n = len(errors)
            columns = {name: identity.column(name).cast(schema.field(name).type) for name in IDENTITY_COLUMNS}
            common = {**columns, **table, "scorer": [spec.name] * n, "scorer_version": [entry.version] * n}
            yield pa.table({**common, SCORE_ERROR_COLUMN: errors} if with_error else common, schema=schema)

    any_failed = marked and pc.any(pc.equal(selected.column("finish_reason"), FAILED_FINISH_REASON)).as_py()
    if not any_failed:
        try:
            return into(_WITHOUT_ERROR, scored(with_error=False))
        except _ErrorColumnNeeded:
            pass
    return into(SCORES_SCHEMA, scored(with_error=True))


_WITHOUT_ERROR = SCORES_SCHEMA.remove(SCORES_SCHEMA.get_field_index(SCORE_ERROR_COLUMN))


def _first_metrics(
    chunks: Iterator[pa.Table], rows: Callable[[pa.Table], Iterator[tuple[bool, dict[str, Any]]]], score_row: RowScorer
) -> list[str] | None:
    """The metrics of the first episode (in episode-id order) the scorer scores; None when it scores none."""
    for chunk in chunks:
        for failed, row in rows(chunk):
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
