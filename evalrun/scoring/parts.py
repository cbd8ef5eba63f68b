"""Scoring where the rows are made: a worker scores each part it encodes, and the driver takes the scored
rows only when they carry its own scoring hash, so they come from the same scoring code, settings and
context as the driver's (docs/design.md "Scores"); otherwise it scores the part itself."""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa

from evalrun.config import ScorerConfig
from evalrun.scoring.context import ScoringContext
from evalrun.scoring.digest import scoring_hash
from evalrun.scoring.table import SCORED_SCHEMA, RowScoring


@dataclass(frozen=True)
class ScoringSetup:
    """What scores a run's rows: the ``task.scorer`` settings and the scoring context (plain data that
    crosses to a worker)."""

    spec: ScorerConfig
    context: ScoringContext


@dataclass(frozen=True)
class ScoredPart:
    """A part's rows as :class:`~evalrun.scoring.table.RowScoring` scored them (an Arrow IPC stream), and
    the scoring hash of the code, settings and context that scored them."""

    scoring_hash: str
    rows: bytes

    def table(self) -> pa.Table:
        """The scored rows (``Scoring.add_scored`` checks their schema)."""
        return pa.ipc.open_stream(self.rows).read_all()


class PartScorer:
    """Scores parts for one setup; built once per worker and setup (the hash reads this package's sources)."""

    def __init__(self, setup: ScoringSetup) -> None:
        self._score = RowScoring(setup.spec, setup.context)
        self.scoring_hash = scoring_hash(setup.spec, setup.context)

    def __call__(self, outputs: pa.Table) -> ScoredPart:
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, SCORED_SCHEMA) as stream:
            stream.write_table(self._score(outputs))
        return ScoredPart(self.scoring_hash, sink.getvalue().to_pybytes())
