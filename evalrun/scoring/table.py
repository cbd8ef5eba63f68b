"""scores.parquet: every output row scored by the configured scorer, one row per (episode, metric)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, TypeVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from evalrun.config import ScorerConfig
from evalrun.errors import BadInput
from evalrun.records.heads import DIGEST_BYTES, digest_bytes, digest_hex, digest_order
from evalrun.records.outputs import FAILED_FINISH_REASON, SCORE_ERROR_COLUMN, SCORES_SCHEMA
from evalrun.scoring.context import ScoringContext
from evalrun.scoring.registry import IDENTITY_COLUMNS, NORMALIZERS, SCORERS, RowScorer
from evalrun.stats.summary import Aggregation


def scorer_version(spec: ScorerConfig) -> str:
    return SCORERS.get(spec.name).version


def score_columns(spec: ScorerConfig) -> list[str]:
    """The output columns a scorer reads (and ``finish_reason``, which tells failed episodes apart)."""
    columns = list(SCORERS.get(spec.name).columns)
    return columns if "finish_reason" in columns else [*columns, "finish_reason"]


def corpus_aggregations(spec: ScorerConfig, context: ScoringContext | None = None) -> Mapping[str, Aggregation]:
    """The scorer's corpus metrics under ``spec`` and ``context`` and their aggregations, for the summary."""
    return SCORERS.get(spec.name).corpus(spec, context or ScoringContext())


def make_scorer(spec: ScorerConfig, context: ScoringContext | None = None) -> RowScorer:
    """The scorer of ``spec``: output row -> scores. A BadInput names the setting it cannot use
    (an unknown scorer or normaliser, a regex that does not compile)."""
    for name in spec.normalize:
        NORMALIZERS.check(name)
    return SCORERS.get(spec.name).build(spec, context or ScoringContext())


T = TypeVar("T")

SCORE_CHUNK_ROWS = 16384  # episodes per row group of scores.parquet, and per step of scoring a table
COMBINE_ROWS = 16384  # scored episodes gathered into one Arrow chunk (a chunk per small part wastes memory)

# A scored episode (RowScoring): its identity, its scores as lists, and its error (None when scored). The
# episode id is held as its 32 bytes (bytes order is hex order), not its 64-character string: a run keeps
# every scored episode until the end, and 36 bytes an episode took the driver's peak RSS at 1M episodes from
# 1.50x to 1.43x of its peak at 100k (scripts/bench_dispatch.py --scale).
_METRICS, _VALUES, _EXTRACTED = "metric", "value", "extracted"
_EPISODE_ID = "episode_id"
SCORED_SCHEMA = pa.schema([
    SCORES_SCHEMA.field(_EPISODE_ID).with_type(pa.binary(DIGEST_BYTES)),
    *(SCORES_SCHEMA.field(name) for name in IDENTITY_COLUMNS if name != _EPISODE_ID),
    pa.field(_METRICS, pa.list_(SCORES_SCHEMA.field(_METRICS).type)),
    pa.field(_VALUES, pa.list_(SCORES_SCHEMA.field(_VALUES).type)),
    pa.field(_EXTRACTED, pa.list_(SCORES_SCHEMA.field(_EXTRACTED).type)),
    SCORES_SCHEMA.field(SCORE_ERROR_COLUMN),
])  # fmt: skip
_WITHOUT_ERROR = SCORES_SCHEMA.remove(SCORES_SCHEMA.get_field_index(SCORE_ERROR_COLUMN))


class RowScoring:
    """Output rows -> scored rows, one per episode: its identity, its metrics, values and extracted answers
    as lists, and its error (None when scored); what :class:`Scoring` gathers. A pure function of the rows,
    so it runs wherever the rows are (a worker scores the parts it makes; docs/design.md "Scores")."""

    def __init__(self, spec: ScorerConfig, context: ScoringContext | None = None) -> None:
        self._spec = spec
        self._reads = SCORERS.get(spec.name).reads
        self._score_row = make_scorer(spec, context)

    def __call__(self, outputs: pa.Table) -> pa.Table:
        """Scored rows of output rows (the columns of :func:`score_columns`; ``finish_reason`` may be left out)."""
        reads = self._reads
        columns = [outputs.column(name).to_pylist() for name in reads]  # only what the scorer reads
        failed = (pc.equal(outputs.column("finish_reason"), FAILED_FINISH_REASON).to_pylist()
                  if "finish_reason" in outputs.column_names else [False] * outputs.num_rows)  # fmt: skip
        offsets, metrics, values, extracted = [0], [], [], []  # the episodes' scores, flat, as list arrays are
        errors: list[str | None] = []
        for cells, episode_failed in zip(zip(*columns, strict=True), failed, strict=True):
            scores, error = [], EPISODE_FAILED if episode_failed else None
            if error is None:
                try:
                    scores = self._score_row(dict(zip(reads, cells, strict=True)))
                except Exception as exc:  # any fault of the scorer on this row is this episode's, its error
                    error = scorer_error(self._spec.name, exc)
            for score in scores:
                metrics.append(score.metric)
                values.append(score.value)
                extracted.append(score.extracted)
            offsets.append(len(metrics))
            errors.append(error)
        starts = pa.array(offsets, pa.int32())
        try:
            ids = [digest_bytes(episode, "episode id") for episode in outputs.column(_EPISODE_ID).to_pylist()]
        except ValueError as exc:  # rows no run wrote: every episode id is a sha256 hex digest
            raise BadInput(_EPISODE_ID, str(exc)) from None
        return pa.Table.from_arrays([
            pa.array(ids, SCORED_SCHEMA.field(_EPISODE_ID).type),
            *(_typed(outputs.column(name), SCORED_SCHEMA.field(name).type)
              for name in IDENTITY_COLUMNS if name != _EPISODE_ID),
            *(pa.ListArray.from_arrays(starts, pa.array(flat, SCORES_SCHEMA.field(name).type))
              for name, flat in ((_METRICS, metrics), (_VALUES, values), (_EXTRACTED, extracted))),
            pa.array(errors, pa.string()),
        ], schema=SCORED_SCHEMA)  # fmt: skip


class Scoring:
    """Scores output rows as they come, in any order and any number at a time (a run scores each part
    as it is committed, or takes the rows its worker scored), and hands them over at the end sorted by
    episode id (docs/design.md "Scores").

    Each episode is kept as one scored row (:class:`RowScoring`). An episode that failed, or whose row the
    scorer raised on, has no scores until the end, then scores 0 on the metrics of the first episode (in
    episode-id order) the scorer scored (the scorer's name when it scored none), with the reason in
    ``error`` (docs/design.md "Failed episodes"): one bad row never costs the others.
    """

    def __init__(self, spec: ScorerConfig, context: ScoringContext | None = None) -> None:
        self._spec = spec
        self._context = context
        self._entry = SCORERS.get(spec.name)
        self._score = RowScoring(spec, context)
        self._tables: list[pa.Table] = []
        self._pending: list[pa.Table] = []
        self._pending_rows = 0

    @property
    def aggregations(self) -> Mapping[str, Aggregation]:
        """The scorer's corpus metrics and their aggregations, for the summary (:func:`corpus_aggregations`)."""
        return corpus_aggregations(self._spec, self._context)

    def add(self, outputs: pa.Table) -> None:
        """Score output rows (the columns of :func:`score_columns`; ``finish_reason`` may be left out)."""
        self.add_scored(self._score(outputs))

    def add_scored(self, scored: pa.Table) -> None:
        """Take rows :class:`RowScoring` scored (with this scorer's settings and context)."""
        if not scored.schema.equals(SCORED_SCHEMA):
            raise ValueError(f"scored rows with columns {scored.schema.names}, expected {SCORED_SCHEMA.names}")
        self._pending.append(scored)
        self._pending_rows += scored.num_rows
        if self._pending_rows >= COMBINE_ROWS:
            self._combine()

    def _combine(self) -> None:
        if self._pending:
            self._tables.append(pa.concat_tables(self._pending).combine_chunks())
        self._pending, self._pending_rows = [], 0

    def into(self, into: Callable[[pa.Schema, Iterator[pa.Table]], T]) -> T:
        """``into(schema, chunks)`` with the scores of every row added, ``SCORE_CHUNK_ROWS`` episodes a
        chunk in episode-id order, and its result. The ``error`` column is left out when no episode has
        an error, so runs without errors keep their bytes. The rows are handed over: what was added is
        released when ``into`` returns (a run's summary follows in the same process)."""
        self._combine()
        tables, self._tables = self._tables or [SCORED_SCHEMA.empty_table()], []
        episodes = pa.concat_tables(tables)
        order = digest_order(_digests(episodes.column(_EPISODE_ID)))
        errors = episodes.column(SCORE_ERROR_COLUMN)
        with_error = errors.null_count < episodes.num_rows
        schema = SCORES_SCHEMA if with_error else _WITHOUT_ERROR
        scored_in_order = pc.is_null(errors).to_numpy(zero_copy_only=False)[order]  # no error: the scorer scored it
        first = int(order[scored_in_order.argmax()]) if scored_in_order.any() else None
        metrics = [self._spec.name] if first is None else episodes.column(_METRICS)[first].as_py()
        starts = np.cumsum([0] + [table.num_rows for table in tables])

        def chunks() -> Iterator[pa.Table]:
            for start in range(0, len(order), SCORE_CHUNK_ROWS):
                rows = _take(tables, starts, order[start : start + SCORE_CHUNK_ROWS])
                yield self._score_rows(rows, metrics, schema)

        return into(schema, chunks())

    def _score_rows(self, episodes: pa.Table, metrics: list[str], schema: pa.Schema) -> pa.Table:
        """The score rows of scored episodes: one per (episode, metric), an episode with an error 0 on ``metrics``."""
        if episodes.column(SCORE_ERROR_COLUMN).null_count < episodes.num_rows:
            episodes = _zero_scores(episodes, metrics)
        lists = episodes.column(_METRICS)
        rows = episodes  # each score row's episode columns: taken only when an episode has other than one score
        if not pc.all(pc.equal(pc.list_value_length(lists), 1)).as_py():
            rows = episodes.take(pc.list_parent_indices(lists))
        n = rows.num_rows
        columns: dict[str, Any] = {name: rows.column(name) for name in IDENTITY_COLUMNS}
        columns[_EPISODE_ID] = digest_hex(_digests(rows.column(_EPISODE_ID))).cast(
            SCORES_SCHEMA.field(_EPISODE_ID).type
        )
        columns.update({name: pc.list_flatten(episodes.column(name)) for name in (_METRICS, _VALUES, _EXTRACTED)})
        columns.update(scorer=[self._spec.name] * n, scorer_version=[self._entry.version] * n)
        if SCORE_ERROR_COLUMN in schema.names:
            columns[SCORE_ERROR_COLUMN] = rows.column(SCORE_ERROR_COLUMN)
        return pa.table(columns, schema=schema).combine_chunks()


def _digests(column: pa.ChunkedArray) -> np.ndarray:
    """A column of 32-byte episode ids as an n x 32 array of bytes."""
    parts = [np.frombuffer(chunk.buffers()[1], np.uint8, count=(chunk.offset + len(chunk)) * DIGEST_BYTES)
             .reshape(-1, DIGEST_BYTES)[chunk.offset :] for chunk in column.chunks if len(chunk)]  # fmt: skip
    return np.concatenate(parts) if parts else np.empty((0, DIGEST_BYTES), np.uint8)


def _take(tables: list[pa.Table], starts: np.ndarray, indices: np.ndarray) -> pa.Table:
    """Rows ``indices`` (into the tables one after another) in that order, taken from each table on its own:
    Arrow's take over many chunks of strings or lists concatenates them first, a copy of the whole column
    each time."""
    source = np.searchsorted(starts, indices, side="right") - 1
    pieces, positions = [], []
    for table in np.unique(source):
        wanted = np.flatnonzero(source == table)
        pieces.append(tables[table].take(pa.array(indices[wanted] - starts[table])))
        positions.append(wanted)
    placed = np.empty(len(indices), np.int64)
    placed[np.concatenate(positions)] = np.arange(len(indices))
    return pa.concat_tables(pieces).combine_chunks().take(pa.array(placed))


def _typed(column: pa.ChunkedArray, type_: pa.DataType) -> pa.ChunkedArray:
    return column if column.type == type_ else column.cast(type_)


def _zero_scores(episodes: pa.Table, metrics: list[str]) -> pa.Table:
    """Scored episodes with every episode that has an error scored 0 on ``metrics``."""
    lists = {name: episodes.column(name).to_pylist() for name in (_METRICS, _VALUES, _EXTRACTED)}
    for i, error in enumerate(episodes.column(SCORE_ERROR_COLUMN).to_pylist()):
        if error is not None:
            lists[_METRICS][i], lists[_VALUES][i], lists[_EXTRACTED][i] = (
                list(metrics), [0.0] * len(metrics), [None] * len(metrics))  # fmt: skip
    for name, values in lists.items():
        field = SCORED_SCHEMA.field(name)
        episodes = episodes.set_column(episodes.schema.get_field_index(name), field, pa.array(values, field.type))
    return episodes


def stream_scores(outputs: pa.Table, spec: ScorerConfig, context: ScoringContext | None,
                  into: Callable[[pa.Schema, Iterator[pa.Table]], T]) -> T:  # fmt: skip
    """``into(schema, chunks)`` with the scores of ``outputs`` (see :class:`Scoring`), and its result:
    the outputs are scored ``SCORE_CHUNK_ROWS`` rows at a time."""
    scoring = Scoring(spec, context)
    for start in range(0, outputs.num_rows, SCORE_CHUNK_ROWS):
        scoring.add(outputs.slice(start, SCORE_CHUNK_ROWS))
    return scoring.into(into)


def score_outputs(outputs: pa.Table, spec: ScorerConfig, context: ScoringContext | None = None) -> pa.Table:
    """Rows per (episode, metric), sorted by episode id so the table never depends on part order: the
    chunks of :func:`stream_scores` as one (chunked) table."""
    return stream_scores(outputs, spec, context, _one_table)


def _one_table(schema: pa.Schema, chunks: Iterable[pa.Table]) -> pa.Table:
    tables = list(chunks)
    return pa.concat_tables(tables) if tables else schema.empty_table()


EPISODE_FAILED = "episode failed: its chain's end entry gives the reason"


def scorer_error(name: str, exc: Exception) -> str:
    """The recorded reason a scorer gave no score: the exception's type and message (one line)."""
    message = " ".join(str(exc).split())
    return f"scorer {name} raised {type(exc).__name__}" + (f": {message}" if message else "")
