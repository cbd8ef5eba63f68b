from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from evalrun.config import ScorerConfig
from evalrun.errors import BadInput
from evalrun.records.outputs import SCORE_ERROR_COLUMN, SCORES_SCHEMA
from evalrun.rundir import writer
from evalrun.scoring import Score, make_scorer, score_outputs, stream_scores, table
from evalrun.stats.estimates import Z_95, estimate, pass_all_trials
from evalrun.stats.summary import summarize


def spec(**kw: object) -> ScorerConfig:
    return ScorerConfig.from_record({**ScorerConfig().as_record(), **kw})


def scorer(settings: ScorerConfig) -> Callable[[str, str], Score]:
    """The scorer as a function of one output and its target."""
    score_row = make_scorer(settings)

    def score(output: str, target: str) -> Score:
        (result,) = score_row({"output": output, "target": target})
        return result

    return score


def test_exact_match_with_declared_normalisation() -> None:
    assert scorer(spec())(" 42\n", "42").value == 1.0
    assert scorer(spec())(" 42 ", "43").value == 0.0
    assert scorer(spec())("Paris", "paris").value == 0.0
    assert scorer(spec(normalize=["strip", "lower", "strip_punctuation"]))("Paris.", "paris").value == 1.0


def test_regex_and_number_extraction() -> None:
    regex = scorer(spec(name="regex", pattern=r"answer is (\w+)"))
    assert regex("the answer is B.", "B").value == 1.0
    assert regex("no idea", "B").extracted is None
    number = scorer(spec(name="number", extract="last"))
    assert number("3 apples and 12 pears: 15", "15").value == 1.0
    assert scorer(spec(name="number"))("3 apples, 15", "15").value == 0.0
    assert scorer(spec(name="number", tolerance=0.01))("x=2.004", "2").value == 1.0


def test_scores_do_not_depend_on_row_order() -> None:
    """Sorted by episode id (held as bytes while scoring, written as hex: the same order)."""
    rows = {
        "episode_id": ["c" * 64, "a" * 64, "b" * 64], "task": ["t"] * 3, "item_id": ["3", "1", "2"], "seed": [0] * 3,
        "repeat": [0] * 3, "output": [" 1", " 2", " 3"], "target": ["1", "0", "3"],
    }  # fmt: skip
    table = pa.table(rows)
    reversed_table = table.take([2, 1, 0])
    a, b = score_outputs(table, spec()), score_outputs(reversed_table, spec())
    assert a.equals(b)
    assert a.column("episode_id").to_pylist() == ["a" * 64, "b" * 64, "c" * 64]
    assert a.column("value").to_pylist() == [0.0, 1.0, 1.0]


def test_rows_under_an_episode_id_no_run_writes_are_refused_naming_it() -> None:
    rows = pa.table({"episode_id": ["a" * 64, "e7"], "task": ["t"] * 2, "item_id": ["1", "2"], "seed": [0] * 2,
                     "repeat": [0] * 2, "output": [" 1"] * 2, "target": ["1"] * 2})  # fmt: skip
    with pytest.raises(BadInput, match=r"episode_id: episode id 'e7' is not a sha256 hex digest"):
        score_outputs(rows, spec())


def test_scores_stream_a_row_group_per_chunk_and_a_late_scorer_error_is_known_before_the_first(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Scores go out a chunk of episodes at a time; a scorer that raises on the 6th of 8 episodes puts the
    error column in the file from its first row group (rows are scored before any goes out); rows added
    in any order and any number at a time give the same bytes."""
    monkeypatch.setattr(table, "SCORE_CHUNK_ROWS", 2)
    rows = {
        "episode_id": [f"{i:064x}" for i in range(8)], "task": ["t"] * 8, "item_id": [str(i) for i in range(8)],
        "seed": [0] * 8, "repeat": [0] * 8, "output": [" 1"] * 5 + [" boom"] + [" 1"] * 2, "target": ["1"] * 8,
    }  # fmt: skip
    settings = spec(name="number")

    real_scorer = table.make_scorer

    def raising_on_boom(*args: Any) -> Callable[[dict[str, Any]], list[Score]]:
        score_row = real_scorer(*args)

        def score(row: dict[str, Any]) -> list[Score]:
            if "boom" in row["output"]:
                raise ValueError("no number")
            return score_row(row)

        return score

    monkeypatch.setattr(table, "make_scorer", raising_on_boom)
    path = tmp_path / "scores.parquet"
    calls: list[pa.Schema] = []

    def write(schema: pa.Schema, chunks: Iterator[pa.Table]) -> None:
        calls.append(schema)
        with path.open("wb") as file:
            writer.write_parquet(file, schema, chunks)

    stream_scores(pa.table(rows), settings, None, write)
    assert [SCORE_ERROR_COLUMN in schema.names for schema in calls] == [True]
    assert pq.read_metadata(path).num_row_groups == 4
    whole = score_outputs(pa.table(rows), settings)
    assert pq.read_table(path).equals(whole) and writer.table_bytes(whole) == path.read_bytes()
    assert whole.column(SCORE_ERROR_COLUMN).to_pylist()[5].startswith("scorer number raised ValueError")
    assert whole.column("value").to_pylist() == [1.0] * 5 + [0.0] + [1.0] * 2
    for combine_rows in (table.COMBINE_ROWS, 2):  # arrivals gathered into one Arrow table, or into several
        monkeypatch.setattr(table, "COMBINE_ROWS", combine_rows)
        scoring = table.Scoring(settings)
        for rows_of_a_part in ([7], [3, 4], [0], [5, 6, 1], [2]):  # parts as they arrive: any order, any size
            scoring.add(pa.table(rows).take(rows_of_a_part))
        assert len(scoring._tables) == (0 if combine_rows > 8 else 2)  # and one pending
        assert scoring.into(_one_file) == path.read_bytes()


def _one_file(schema: pa.Schema, chunks: Iterator[pa.Table]) -> bytes:
    sink = pa.BufferOutputStream()
    writer.write_parquet(sink, schema, chunks)
    return bytes(sink.getvalue().to_pybytes())


def test_estimate_uses_items_as_the_unit() -> None:
    # item A: repeats 1,1 ; item B: 0,1 ; item C: 0,0  -> item means 1, .5, 0
    obs = [("A", 0, 1.0), ("A", 1, 1.0), ("B", 0, 0.0), ("B", 1, 1.0), ("C", 0, 0.0), ("C", 1, 0.0)]
    est = estimate(obs)
    assert est.mean == pytest.approx(0.5)
    se = statistics.stdev([1.0, 0.5, 0.0]) / math.sqrt(3)
    assert est.se == pytest.approx(se)
    # the clustered interval over items (summary/1) leaves [0, 1] here; summary/2 clips it (evalrun.stats.estimates)
    assert estimate(obs, "clustered").ci95 == pytest.approx((0.5 - Z_95 * se, 0.5 + Z_95 * se))
    assert est.ci95 == (0.0, 1.0) and est.interval == "clustered-clipped"
    # trial means: trial 0 -> 1/3, trial 1 -> 2/3; population std = 1/6
    assert est.spread == pytest.approx(1 / 6)
    assert est.n_items == 3 and est.trials_per_item == 2


def test_summary_groups_per_task_and_overall() -> None:
    scores = pa.table({
        "task": ["t1", "t1", "t2"], "item_id": ["1", "2", "1"], "seed": [0, 0, 0], "repeat": [0, 0, 0],
        "metric": ["exact_match"] * 3, "value": [1.0, 0.0, 1.0],
    })  # fmt: skip
    summary = summarize(scores)
    assert summary["tasks"]["t1"]["exact_match"]["mean"] == 0.5
    assert summary["tasks"]["t2"]["exact_match"]["ci95"] is None  # one item: no interval claimed
    assert summary["overall"]["exact_match"]["n_items"] == 3  # t1/1 and t2/1 are different items


def test_pass_all_trials_is_pass_hat_k_over_items() -> None:
    """pass^k: items as the unit, an item counts only when all its k trials pass."""
    values = [("a", 0, 1.0), ("a", 1, 1.0), ("b", 0, 1.0), ("b", 1, 0.0), ("c", 0, 0.0), ("c", 1, 0.0)]
    assert pass_all_trials(values) == 1 / 3
    assert pass_all_trials([("a", 0, 1.0), ("b", 0, 0.0)]) is None  # one trial: pass^1 is the mean
    assert pass_all_trials([("a", 0, 1.0), ("a", 1, 0.5)]) is None  # not a 0/1 metric
    assert pass_all_trials([("a", 0, 1.0), ("a", 1, 1.0), ("b", 0, 1.0)]) is None  # unequal k
    rows = [{"episode_id": f"{i}{t}", "task": "t", "item_id": i, "seed": 0, "repeat": t, "metric": "pass",
             "value": v, "extracted": None, "scorer": "verifier", "scorer_version": "1", "error": None}
            for i, t, v in values]  # fmt: skip
    summary = summarize(pa.Table.from_pylist(rows, schema=SCORES_SCHEMA))
    assert summary["overall"]["pass"]["pass_all_trials"] == 1 / 3 and summary["overall"]["pass"]["mean"] == 0.5
    assert "pass_all_trials" not in summarize(pa.Table.from_pylist(rows, schema=SCORES_SCHEMA), "evalrun.summary/2")[
        "overall"]["pass"]  # fmt: skip
