"""Runs the e2e tests make on dispatchers of their own, and what they compare of two runs."""

from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq

from evalrun.pipeline.runner import Prepared, execute, open_for


def run_alone(prepared: Prepared) -> Path:
    """A prepared run on a dispatcher of its own (its own engine, or a client of a server), closed after."""
    dispatcher = open_for(prepared)
    try:
        return execute(prepared, dispatcher)
    finally:
        dispatcher.close()


def output_columns(run: Path) -> list[tuple]:
    """Each output row's episode id, output, token ids and logprobs, sorted: equal for runs that generated alike."""
    rows = pq.read_table(run / "outputs", columns=["episode_id", "output", "token_ids", "token_logprobs"])
    return sorted(tuple(map(str, r.values())) for r in rows.to_pylist())
