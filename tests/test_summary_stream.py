"""summarize() over Arrow/NumPy columns gives the bytes the per-row Python implementation gave.

The oracle below is a private copy of summarize, estimate and pass_all_trials as they were before the
columnar rewrite (commit 1ba569d); every summary.json ever written came from it, and ``evalrun verify``
compares summaries byte for byte, so the two must agree on every table, in every format.
"""

from __future__ import annotations

import json
import math
import statistics
from collections import Counter, defaultdict
from collections.abc import Callable, Collection, Hashable, Iterable
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from evalrun.records.canonical import canonical_json
from evalrun.records.formats import SUMMARY_FORMATS, Summary
from evalrun.records.outputs import SCORES_SCHEMA
from evalrun.stats.estimates import (
    Z_95,
    Estimate,
    GroupedValues,
    IntervalKind,
    IntervalMethod,
    estimate,
    item_means,
    pass_all_trials,
    trial_means,
    wilson_interval,
)
from evalrun.stats.summary import METHODS, SummaryFormat, resummarize, summarize

GOLDEN = Path(__file__).parent / "golden"

# --- the oracle: the per-row implementation as it was ----------------------------------------------


def _old_pass_all_trials(observations: Iterable[tuple[Hashable, Hashable, float]]) -> float | None:
    by_item: dict[Hashable, list[float]] = defaultdict(list)
    for item, _trial, value in observations:
        if value not in (0.0, 1.0):
            return None
        by_item[item].append(value)
    trials = {len(v) for v in by_item.values()}
    if len(trials) != 1 or trials.pop() < 2:
        return None
    return sum(all(v == 1.0 for v in values) for values in by_item.values()) / len(by_item)


def _old_estimate(observations: Iterable[tuple[Hashable, Hashable, float]], method: IntervalMethod) -> Estimate:
    if method not in ("clustered", "bounded"):
        raise ValueError(f"unknown interval method {method!r}")
    by_item: dict[Hashable, list[float]] = defaultdict(list)
    by_trial: dict[Hashable, list[float]] = defaultdict(list)
    n = 0
    unit = True
    for item, trial, value in observations:
        by_item[item].append(value)
        by_trial[trial].append(value)
        unit = unit and 0.0 <= value <= 1.0
        n += 1
    if n == 0:
        raise ValueError("no observations")
    means = [math.fsum(v) / len(v) for v in by_item.values()]
    mean = math.fsum(means) / len(means)
    se = None
    ci = None
    kind: IntervalKind = "none"
    if len(means) > 1:
        se = statistics.stdev(means) / math.sqrt(len(means))
        ci, kind = (mean - Z_95 * se, mean + Z_95 * se), "clustered"
        if method == "bounded" and unit and all(m in (0.0, 1.0) for m in means):
            ci, kind = wilson_interval(mean, len(means)), "wilson"
        elif method == "bounded" and unit:
            ci, kind = (max(0.0, ci[0]), min(1.0, ci[1])), "clustered-clipped"
    per_trial = [math.fsum(v) / len(v) for v in by_trial.values()]
    return Estimate(
        mean=mean,
        se=se,
        ci95=ci,
        spread=statistics.pstdev(per_trial) if len(per_trial) > 1 else 0.0,
        n_items=len(means),
        trials_per_item=n / len(means),
        n_observations=n,
        interval=kind,
    )


def _old_as_record(values: list[tuple[Any, Any, float]], fmt: SummaryFormat, errors: int) -> dict[str, Any]:
    record = asdict(_old_estimate(values, fmt.interval))
    record["ci95"] = list(record["ci95"]) if record["ci95"] is not None else None
    if not fmt.names_interval:
        del record["interval"]
    if errors:
        record["errors"] = errors
    if fmt.pass_all_trials and (all_passed := _old_pass_all_trials(values)) is not None:
        record["pass_all_trials"] = all_passed
    return record


def _old_summarize(scores: pa.Table, summary_format: str, failed: Collection[str] = ()) -> dict[str, Any]:
    fmt = METHODS[summary_format]
    failed = frozenset(failed)
    cols = scores.select(["task", "item_id", "seed", "repeat", "metric", "value"]).to_pydict()
    if "error" in scores.column_names:
        failed |= {e for e, err in zip(scores.column("episode_id").to_pylist(), scores.column("error").to_pylist(),
                                       strict=True) if err is not None}  # fmt: skip
    episodes = scores.column("episode_id").to_pylist() if failed else [None] * scores.num_rows
    grouped: dict[tuple[str, str], list[tuple[Any, Any, float]]] = {}
    overall: dict[str, list[tuple[Any, Any, float]]] = {}
    errors: Counter[tuple[str, str]] = Counter()
    overall_errors: Counter[str] = Counter()
    for episode, task, item, seed, repeat, metric, value in zip(
        episodes, cols["task"], cols["item_id"], cols["seed"], cols["repeat"], cols["metric"], cols["value"],
        strict=True,
    ):  # fmt: skip
        grouped.setdefault((task, metric), []).append((item, (seed, repeat), value))
        overall.setdefault(metric, []).append(((task, item), (seed, repeat), value))
        if episode in failed:
            errors[(task, metric)] += 1
            overall_errors[metric] += 1
    tasks: dict[str, dict[str, Any]] = {}
    for (task, metric), values in sorted(grouped.items()):
        tasks.setdefault(task, {})[metric] = _old_as_record(values, fmt, errors[(task, metric)])
    summary = {
        "format": summary_format,
        "method": fmt.method,
        "tasks": tasks,
        "overall": {
            metric: _old_as_record(values, fmt, overall_errors[metric]) for metric, values in sorted(overall.items())
        },
    }
    return Summary.model_validate(summary).as_record()


# --- comparing -------------------------------------------------------------------------------------


def _outcome(summarise: Callable[[], Any]) -> tuple[str, str]:
    """What a call gives, as text: its canonical JSON and its plain JSON (which keeps key order), or
    the type of exception it raised."""
    try:
        result = summarise()
    except Exception as exc:  # the two must fail alike too: ValueError is a one-line `evalrun verify` failure
        return ("raised", type(exc).__name__)
    return canonical_json(result), json.dumps(result)


def assert_same_summary(scores: pa.Table, failed: Collection[str] = ()) -> None:
    """The same summary in every format, or an error where the old code had one. Non-finite values
    always failed (summary.json holds finite numbers only), some with an AttributeError from inside
    ``statistics``; they now fail as the ValueError ``evalrun verify`` reports in one line."""
    for summary_format in SUMMARY_FORMATS:
        old = _outcome(lambda: _old_summarize(scores, summary_format, failed))  # noqa: B023 (called at once)
        new = _outcome(lambda: summarize(scores, summary_format, failed))  # noqa: B023
        if old[0] == "raised" and not _all_finite(scores):
            assert new == ("raised", "ValueError"), summary_format
        else:
            assert new == old, summary_format


def _all_finite(scores: pa.Table) -> bool:
    return all(math.isfinite(v) for v in scores.column("value").to_pylist())


def _table(rows: list[dict[str, Any]], chunks: int = 1) -> pa.Table:
    table = pa.Table.from_pylist(rows, schema=SCORES_SCHEMA)
    if chunks <= 1 or not rows:
        return table
    size = -(-len(rows) // chunks)
    return pa.Table.from_batches(table.to_batches(max_chunksize=size), schema=table.schema)


def _rows(
    episodes: list[tuple[str, str, int, int]], metrics: list[str], values: list[float], prefix: str = "e"
) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for n, (task, item, seed, repeat) in enumerate(episodes):
        for metric in metrics:
            rows.append({
                "episode_id": f"{prefix}{n}", "task": task, "item_id": item, "seed": seed, "repeat": repeat,
                "metric": metric, "value": values[len(rows) % len(values)], "extracted": None, "scorer": "s",
                "scorer_version": "1", "error": None,
            })  # fmt: skip
    return rows


# --- generated tables ------------------------------------------------------------------------------

unit_values = st.sampled_from([0.0, 1.0, 0.5, 0.25, 1 / 3, 0.1, 0.7])
any_values = st.one_of(
    unit_values,
    st.floats(min_value=-1e6, max_value=1e6, allow_nan=False),
    st.sampled_from([-0.0, -1.0, 2.0, 3.0, 1e300, -1e300, 5e-324, 2.0**53, 0.1 + 0.2]),
)
seeds = st.one_of(st.integers(0, 3), st.sampled_from([2**63 - 1, -(2**63), 12345678901234]))


@st.composite
def score_tables(draw: st.DrawFn, values: st.SearchStrategy[float] = any_values) -> tuple[pa.Table, frozenset[str]]:
    tasks = draw(st.lists(st.sampled_from(["t", "b", "a2", "é", "T"]), min_size=1, max_size=3, unique=True))
    metric_names = draw(st.lists(st.sampled_from(["m", "exact", "Z", "pass"]), min_size=1, max_size=3, unique=True))
    items = [f"i{n}" for n in range(draw(st.integers(1, 6)))]
    trials = draw(st.lists(st.tuples(seeds, st.integers(0, 3)), min_size=1, max_size=4, unique=True))
    # an episode may repeat an (item, trial) of another: such duplicates count as they always did
    episodes = st.tuples(st.sampled_from(tasks), st.sampled_from(items), st.sampled_from(trials))
    rows: list[dict[str, Any]] = []
    for n, (task, item, (seed, repeat)) in enumerate(draw(st.lists(episodes, max_size=40))):
        binary = draw(st.booleans())
        error = draw(st.sampled_from([None, None, None, "scorer raised"]))
        for metric in draw(st.lists(st.sampled_from(metric_names), min_size=1, unique=True)):
            value = draw(st.sampled_from([0.0, 1.0])) if binary else draw(values)
            # an error on the first metric's row only: the whole episode counts as failed, every metric
            rows.append({
                "episode_id": f"e{n}", "task": task, "item_id": item, "seed": seed, "repeat": repeat,
                "metric": metric, "value": value, "extracted": None, "scorer": "s", "scorer_version": "1",
                "error": error if metric == metric_names[0] else None,
            })  # fmt: skip
    rows = draw(st.permutations(rows))
    table = _table(rows, draw(st.integers(1, 3)))
    if draw(st.booleans()):
        table = table.drop_columns(["error"])
    failed = frozenset(draw(st.lists(st.sampled_from([f"e{n}" for n in range(8)] + ["absent"]), max_size=3)))
    return table, failed


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(score_tables())
def test_summary_equals_the_per_row_implementation(case: tuple[pa.Table, frozenset[str]]) -> None:
    table, failed = case
    assert_same_summary(table, failed)
    assert_same_summary(table)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(score_tables(unit_values))
def test_unit_interval_summaries_equal_the_per_row_implementation(case: tuple[pa.Table, frozenset[str]]) -> None:
    """Values in [0, 1]: the Wilson and clipped intervals and pass^k, which other values never reach."""
    table, failed = case
    assert_same_summary(table, failed)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.sampled_from("abcd"), st.sampled_from([0, 1, (0, 1), "x"]), any_values), max_size=30),
       st.sampled_from(["clustered", "bounded"]))  # fmt: skip
def test_observation_front_ends_equal_the_per_row_implementation(
    observations: list[tuple[str, Any, float]], method: IntervalMethod
) -> None:
    assert _outcome(lambda: asdict(estimate(observations, method))) == _outcome(
        lambda: asdict(_old_estimate(observations, method))
    )
    assert pass_all_trials(observations) == _old_pass_all_trials(observations)
    by_item: dict[Hashable, list[float]] = defaultdict(list)
    by_trial: dict[Hashable, list[float]] = defaultdict(list)
    for item, trial, value in observations:
        by_item[item].append(value)
        by_trial[trial].append(value)
    expected_items = {k: math.fsum(v) / len(v) for k, v in by_item.items()}
    expected_trials = {k: math.fsum(v) / len(v) for k, v in by_trial.items()}
    assert list(item_means(observations).items()) == list(expected_items.items())  # first-seen order kept
    assert list(trial_means(observations).items()) == list(expected_trials.items())


@settings(max_examples=300, deadline=None)
@given(st.lists(st.lists(st.one_of(any_values, st.floats()), min_size=1, max_size=5), max_size=6))
def test_group_sums_are_fsum_to_the_bit(groups: list[list[float]]) -> None:
    """NumPy adds only where that is exact; every sum has fsum's bits (its zero, its overflow error)."""
    grouped = GroupedValues.by_key(
        np.array([v for g in groups for v in g], dtype=np.float64),
        np.repeat(np.arange(len(groups)), [len(g) for g in groups]),
    )

    def bits(sums: Callable[[], Any]) -> Any:
        try:
            return [(math.copysign(1.0, s), s) if s == s else "nan" for s in sums()]
        except (ValueError, OverflowError) as exc:
            return type(exc).__name__

    assert bits(lambda: grouped.sums().tolist()) == bits(lambda: [math.fsum(g) for g in groups])


# --- named cases -----------------------------------------------------------------------------------


def test_golden_runs_summarise_to_their_stored_bytes() -> None:
    runs = sorted(p for p in GOLDEN.iterdir() if (p / "summary.json").exists())
    assert runs
    for run in runs:
        scores = pq.read_table(run / "scores.parquet")
        stored = json.loads((run / "summary.json").read_text())
        assert canonical_json(resummarize(scores, stored)) == canonical_json(stored), run.name
        assert_same_summary(scores)


def test_pass_all_trials_failed_episodes_and_single_items() -> None:
    episodes = [("t", f"i{i}", seed, repeat) for i in range(5) for seed in (0, 7) for repeat in (0, 1)]
    rows = _rows(episodes, ["pass", "score"], [1.0, 1.0, 0.0, 1.0, 0.5, 1.0, 1.0])
    rows[3]["error"] = "episode failed"
    rows += _rows([("single", "only", 0, 0)], ["pass"], [1.0], prefix="s")  # one item: no interval
    table = _table(rows, chunks=3)
    assert_same_summary(table, {"e0", "e5"})
    summary = summarize(table, failed={"e0", "e5"})
    assert summary["tasks"]["single"]["pass"]["interval"] == "none"
    assert summary["tasks"]["t"]["pass"]["errors"] == 3  # e0, e5 and e1 (its error row is its 'score' row)
    assert summary["overall"]["pass"]["errors"] == 3
    assert "pass_all_trials" not in summary["tasks"]["t"]["score"]  # 0.5 is not pass or fail


def test_pass_hat_k_with_every_item_at_the_same_k() -> None:
    episodes = [("t", f"i{i}", 0, repeat) for i in range(4) for repeat in range(3)]
    table = _table(_rows(episodes, ["pass"], [1.0, 1.0, 1.0, 1.0, 0.0]))
    assert_same_summary(table)
    assert summarize(table)["tasks"]["t"]["pass"]["pass_all_trials"] == 0.5
    mixed = _table(_rows(episodes[:-1], ["pass"], [1.0]))  # the last item has 2 trials, the others 3
    assert_same_summary(mixed)
    assert "pass_all_trials" not in summarize(mixed)["tasks"]["t"]["pass"]


def test_values_outside_the_unit_interval_and_exact_sums() -> None:
    episodes = [("t", f"i{i}", 0, repeat) for i in range(3) for repeat in range(4)]
    for values in ([-2.0, 3.0, 0.5], [0.1, 0.2, 0.3, 1e16, -1e16], [1e308, 1e308, -1e308], [2.0**53, 1.0, 1.0]):
        assert_same_summary(_table(_rows(episodes, ["m"], values)))


def test_empty_and_header_only_tables() -> None:
    assert_same_summary(SCORES_SCHEMA.empty_table())
    bare = pa.table({"task": pa.array([], pa.string()), "item_id": pa.array([], pa.string()),
                     "seed": pa.array([], pa.int64()), "repeat": pa.array([], pa.int32()),
                     "metric": pa.array([], pa.string()), "value": pa.array([], pa.float64())})  # fmt: skip
    assert_same_summary(bare)
    assert summarize(bare)["tasks"] == {} and summarize(bare)["overall"] == {}


def test_tables_without_episode_ids_or_errors() -> None:
    """Callers (and tests) pass the six grouping columns only; episode ids are read only for errors."""
    scores = pa.table({"task": ["t1", "t1", "t2"], "item_id": ["1", "2", "1"], "seed": [0, 0, 0], "repeat": [0, 0, 0],
                       "metric": ["m"] * 3, "value": [1.0, 0.0, 1.0]})  # fmt: skip
    assert_same_summary(scores)


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_non_finite_values_are_refused_as_before(bad: float) -> None:
    episodes = [("t", f"i{i}", 0, 0) for i in range(3)]
    table = _table(_rows(episodes, ["m"], [0.5, bad, 1.0]))
    assert_same_summary(table)
    with pytest.raises(ValueError):  # summary.json holds finite numbers only; verify reports a ValueError in one line
        summarize(table)


def test_inf_and_minus_inf_in_one_item_are_refused_as_before() -> None:
    table = _table(_rows([("t", "i", 0, r) for r in range(2)] + [("t", "j", 0, 0)], ["m"], [math.inf, -math.inf, 0.5]))
    assert_same_summary(table)
