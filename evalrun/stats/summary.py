"""summary.json: per task and overall, every metric's mean with its item-level uncertainty.

Five formats, each with its interval method (:mod:`evalrun.stats.estimates`): new runs write
``evalrun.summary/5`` (``/4``, which is ``/3`` and a perplexity metric's exp(-mean), and a corpus metric's
aggregate: lm-eval's aggregation, e.g. corpus BLEU or F1, over every document's input); ``evalrun verify``
recomputes a stored summary in the format it declares, so a ``/1`` summary is recomputed with the ``/1`` method.
"""

from __future__ import annotations

import itertools
import json
import math
import sys
from collections.abc import Callable, Collection, Iterator, Mapping
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from evalrun.records.formats import SUMMARY_FORMAT, SUMMARY_FORMATS, Summary
from evalrun.stats.estimates import GroupedValues, IntervalMethod, grouped_estimate, grouped_pass_all_trials


@dataclass(frozen=True)
class SummaryFormat:
    interval: IntervalMethod
    method: str  # the summary's ``method`` string: what its numbers are
    names_interval: bool  # each metric's record says which interval it carries
    pass_all_trials: bool = False  # 0/1 metrics with repeats report pass^k
    perplexity: bool = False  # a perplexity metric reports exp(-mean) of its loglikelihoods
    corpus: bool = False  # a corpus metric reports its aggregation over every document's input


# a corpus metric's aggregation: every document's input (what its score row's ``extracted`` holds, as JSON) -> a number
Aggregation = Callable[[list[Any]], Any]

SUMMARY_V1, SUMMARY_V2, SUMMARY_V3, SUMMARY_V4, SUMMARY_V5 = SUMMARY_FORMATS  # V5 is SUMMARY_FORMAT: new runs write it
_V4_METHOD = (
    "perplexity, for a metric named perplexity (or perplexity/FILTER) whose values are loglikelihoods (lm-eval's): "
    "exp(-mean), left out where it overflows or an episode failed"
)
_V2_METHOD = (
    "mean of per-item means; se = clustered SE over items (std of per-item means / sqrt(items)); "
    "95% interval, named by 'interval': 'none' with one item; 'wilson' = Wilson score interval of the "
    "proportion of items passed, n = items, when every value lies in [0, 1] and every per-item mean is "
    "0 or 1; else 'clustered-clipped' = mean +/- 1.96 x se clipped to [0, 1] when every value lies in "
    "[0, 1]; else 'clustered' = mean +/- 1.96 x se; spread = population std of per-trial means"
)
_V3_METHOD = (
    f"{_V2_METHOD}; pass_all_trials (pass^k), for a metric of 0/1 values with the same k > 1 trials "
    "per item: the share of items all k of whose trials passed"
)
METHODS = {
    SUMMARY_V1: SummaryFormat(
        interval="clustered",
        method=(
            "mean of per-item means; 95% interval = mean +/- 1.96 x clustered SE over items; "
            "spread = population std of per-trial means"
        ),
        names_interval=False,
    ),
    SUMMARY_V2: SummaryFormat(interval="bounded", method=_V2_METHOD, names_interval=True),
    SUMMARY_V3: SummaryFormat(interval="bounded", method=_V3_METHOD, names_interval=True, pass_all_trials=True),
    SUMMARY_V4: SummaryFormat(
        interval="bounded",
        method=f"{_V3_METHOD}; {_V4_METHOD}",
        names_interval=True,
        pass_all_trials=True,
        perplexity=True,
    ),
    SUMMARY_V5: SummaryFormat(
        interval="bounded",
        method=(
            f"{_V3_METHOD}; {_V4_METHOD}; aggregate, for a corpus metric (one aggregated over the whole set, e.g. "
            "lm-eval's bleu or f1; its values are its aggregation over each document alone): the aggregation over "
            "every document's input (the scores' extracted, as JSON) in the scores' order, left out where an "
            "episode failed or it is not a finite number"
        ),
        names_interval=True,
        pass_all_trials=True,
        perplexity=True,
        corpus=True,
    ),
}
METHOD = METHODS[SUMMARY_FORMAT].method


def is_perplexity(metric: str) -> bool:
    """A metric whose values are loglikelihoods and whose aggregate is exp(-mean): lm-eval's perplexity, under its
    name, after any filter pipeline's (``perplexity/NAME``)."""
    return metric.split("/", 1)[0] == "perplexity"


def _as_record(by_item: GroupedValues, by_trial: GroupedValues, fmt: SummaryFormat, errors: int,
               metric: str) -> dict[str, Any]:  # fmt: skip
    record = asdict(grouped_estimate(by_item, by_trial, fmt.interval))
    record["ci95"] = list(record["ci95"]) if record["ci95"] is not None else None
    if not fmt.names_interval:
        del record["interval"]
    if errors:  # left out when none failed, so summaries of runs without failures are as before
        record["errors"] = errors
    if fmt.pass_all_trials and (all_passed := grouped_pass_all_trials(by_item)) is not None:
        record["pass_all_trials"] = all_passed  # pass^k: repeats of a 0/1 metric
    # a failed episode's 0 is no loglikelihood: with one among them the mean is not the documents' loglikelihood
    if fmt.perplexity and is_perplexity(metric) and not errors and -record["mean"] < _EXP_LIMIT:
        record["perplexity"] = math.exp(-record["mean"])
    return record


_EXP_LIMIT = math.log(sys.float_info.max)  # exp of more is not a finite float


def _codes(column: pa.ChunkedArray) -> tuple[np.ndarray, pa.Array]:
    """A column as dense int32 codes (equal values, nulls included, share one) and the value of each code."""
    encoded = pc.dictionary_encode(column, null_encoding="encode").unify_dictionaries()
    if not encoded.num_chunks:
        return np.zeros(0, dtype=np.int32), pa.array([], column.type)
    codes = np.concatenate([chunk.indices.to_numpy(zero_copy_only=False) for chunk in encoded.chunks])
    return codes, encoded.chunk(0).dictionary


def _failed_rows(scores: pa.Table, failed: Collection[str]) -> np.ndarray | None:
    """Which rows belong to a failed episode: one in ``failed`` or one with an ``error`` on any of its
    rows (a scorer that raised); None when none can."""
    episodes = []
    if "error" in scores.column_names:
        episodes.append(pc.filter(scores.column("episode_id"), pc.is_valid(scores.column("error"))).combine_chunks())
    if failed:
        episodes.append(pa.array(list(failed), scores.column("episode_id").type))
    if not sum(len(e) for e in episodes):
        return None
    return pc.is_in(scores.column("episode_id"), value_set=pa.concat_arrays(episodes)).to_numpy(zero_copy_only=False)


Rows = slice | np.ndarray  # every row, or the indices of some


def _groups(*keys: np.ndarray) -> Iterator[tuple[tuple[int, ...], Rows]]:
    """Each distinct combination of ``keys`` (code arrays of one length) and the rows that have it."""
    if not len(keys[0]):
        return
    if all(np.all(key == key[0]) for key in keys):  # one group (one task, one metric): no copy of the columns
        yield tuple(int(key[0]) for key in keys), slice(None)
        return
    order = np.lexsort(keys[::-1])
    change = np.zeros(len(order), dtype=bool)
    change[0] = True
    for key in keys:
        sorted_key = key[order]
        change[1:] |= sorted_key[1:] != sorted_key[:-1]
    del sorted_key
    starts = np.flatnonzero(change).tolist()
    for start, end in itertools.pairwise([*starts, len(order)]):
        rows = order[start:end]
        yield tuple(int(key[rows[0]]) for key in keys), rows


def summary_columns(available: Collection[str], corpus: bool = False) -> list[str]:
    """The columns of a scores table :func:`summarize` reads, of those ``available`` (``corpus``: it aggregates a
    corpus metric, whose inputs are in ``extracted``)."""
    wanted = ["task", "item_id", "seed", "repeat", "metric", "value", *(["extracted"] if corpus else [])]
    return [*wanted, "episode_id", "error"] if "error" in available else wanted


def reported(estimate: Mapping[str, Any], metric: str) -> float | None:
    """The figure lm-eval reports for a metric, of its estimate: a corpus metric's aggregate, a perplexity metric's
    exp(-mean), else the mean (None where the estimate has none of them: an aggregate left out)."""
    if "aggregation" in estimate:
        return estimate.get("aggregate")
    return estimate.get("perplexity" if is_perplexity(metric) else "mean")


def corpus_metric(metric: str, aggregations: Mapping[str, Aggregation]) -> str | None:
    """The corpus metric a score's metric is (``bleu`` of ``bleu/FILTER``, the filter after a slash), or None."""
    base = metric.split("/", 1)[0]
    return base if base in aggregations else None


def aggregation_name(aggregation: Aggregation) -> str:
    """An aggregation as summary.json names it: its function's name (a ``functools.partial``'s function's)."""
    function = getattr(aggregation, "func", aggregation)
    return str(getattr(function, "__name__", type(function).__name__))


def _aggregate(aggregation: Aggregation, inputs: list[str | None]) -> float | None:
    """``aggregation`` over the documents' inputs (JSON texts); None where one is missing, it raises (a task's own
    function) or the result is not a finite number."""
    if any(text is None for text in inputs):
        return None
    try:
        value = aggregation([json.loads(text) for text in inputs if text is not None])
    except Exception:  # the same inputs raise the same wherever the summary is recomputed
        return None
    if hasattr(value, "item"):
        value = value.item()
    if isinstance(value, bool | int | float) and math.isfinite(value):
        return float(value)
    return None


def summarize(scores: pa.Table, summary_format: str = SUMMARY_FORMAT, failed: Collection[str] = (),
              aggregations: Mapping[str, Aggregation] | None = None) -> dict[str, Any]:  # fmt: skip
    """The summary of a scores table in ``summary_format`` (ValueError for a format this code does not know).

    ``failed``: episodes that failed (scored 0); each metric counts their observations as ``errors``,
    as it counts every row whose ``error`` column says why it scores 0 (a scorer that raised).
    ``aggregations``: the scorer's corpus metrics (by metric name, without a filter), whose aggregate a
    format that has one (``/5``) gives beside the mean (the ``extracted`` column holds their inputs).
    The columns are read as NumPy arrays of integer codes and values, with no Python object per row
    (docs/design.md "Summary").
    """
    if summary_format not in METHODS:
        raise ValueError(f"unknown summary format {summary_format!r}; expected one of {sorted(METHODS)}")
    fmt = METHODS[summary_format]
    value_column = scores.column("value")
    if value_column.null_count:
        raise ValueError(f"scores: {value_column.null_count} rows have no value")
    values = value_column.to_numpy().astype(np.float64, copy=False)
    if not np.all(np.isfinite(values)):  # summary.json holds finite numbers only
        raise ValueError(f"scores: {int(np.count_nonzero(~np.isfinite(values)))} values are not finite numbers")
    task, task_names = _codes(scores.column("task"))
    metric, metric_names = _codes(scores.column("metric"))
    task_names, metric_names = task_names.to_pylist(), metric_names.to_pylist()
    item = _codes(scores.column("item_id"))[0]
    seed, repeat = _codes(scores.column("seed"))[0], _codes(scores.column("repeat"))[0]
    trial = seed.astype(np.int64) * (int(repeat.max(initial=0)) + 1) + repeat  # (seed, repeat)
    del seed, repeat
    errored = _failed_rows(scores, failed)

    def record(rows: Rows, items: np.ndarray, metric: str) -> dict[str, Any]:
        group_values = values[rows]
        by_item = GroupedValues.by_key(group_values, items[rows])
        by_trial = GroupedValues.by_key(group_values, trial[rows])
        errors = 0 if errored is None else int(np.count_nonzero(errored[rows]))
        estimate = _as_record(by_item, by_trial, fmt, errors, metric)
        corpus = corpus_metric(metric, aggregations or {}) if fmt.corpus else None
        if corpus is not None:
            aggregation = (aggregations or {})[corpus]
            estimate["aggregation"] = aggregation_name(aggregation)
            if not errors:
                inputs = scores.column("extracted").take(pa.array(np.arange(scores.num_rows)[rows])).to_pylist()
                if (aggregate := _aggregate(aggregation, inputs)) is not None:
                    estimate["aggregate"] = aggregate
        return estimate

    per_task = {(task_names[t], metric_names[m]): rows for (t, m), rows in _groups(task, metric)}
    tasks: dict[str, dict[str, Any]] = {}
    for task_name, metric_name in sorted(per_task):
        tasks.setdefault(task_name, {})[metric_name] = record(per_task[task_name, metric_name], item, metric_name)
    del per_task
    per_metric = {metric_names[m]: rows for (m,), rows in _groups(metric)}
    # the overall unit, (task, item): the item's code where there is one task
    task_item = item if len(task_names) <= 1 else task.astype(np.int64) * (int(item.max(initial=0)) + 1) + item
    del task
    overall = {name: record(per_metric[name], task_item, name) for name in sorted(per_metric)}
    summary = {"format": summary_format, "method": fmt.method, "tasks": tasks, "overall": overall}
    return Summary.model_validate(summary).as_record()


def resummarize(scores: pa.Table, stored: Any, failed: Collection[str] = (),
                aggregations: Mapping[str, Aggregation] | None = None) -> dict[str, Any]:  # fmt: skip
    """``scores`` summarised in the format ``stored`` (a summary.json as read) declares, for a
    byte-for-byte comparison; ValueError when it declares none this code knows."""
    declared = stored.get("format") if isinstance(stored, dict) else None
    return summarize(scores, declared if isinstance(declared, str) else "", failed, aggregations)


def names_aggregations(summary: Any) -> bool:
    """Whether a stored summary has a corpus metric (so recomputing it needs its scorer's aggregations)."""
    sections = [summary.get("overall"), *(summary.get("tasks") or {}).values()] if isinstance(summary, dict) else []
    return any(isinstance(e, dict) and "aggregation" in e
               for section in sections if isinstance(section, dict) for e in section.values())  # fmt: skip
