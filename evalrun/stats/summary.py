"""summary.json: per task and overall, every metric's mean with its item-level uncertainty.

Three formats, each with its interval method (:mod:`evalrun.stats.estimates`): new runs write
``evalrun.summary/3`` (``/2`` and pass^k over repeats); ``evalrun verify`` recomputes a stored
summary in the format it declares, so a ``/1`` summary is recomputed with the ``/1`` method.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection
from dataclasses import asdict, dataclass
from typing import Any

import pyarrow as pa

from evalrun.records.formats import SUMMARY_FORMAT, SUMMARY_FORMATS, Summary
from evalrun.stats.estimates import IntervalMethod, estimate, pass_all_trials


@dataclass(frozen=True)
class SummaryFormat:
    interval: IntervalMethod
    method: str  # the summary's ``method`` string: what its numbers are
    names_interval: bool  # each metric's record says which interval it carries
    pass_all_trials: bool = False  # 0/1 metrics with repeats report pass^k


SUMMARY_V1, SUMMARY_V2, SUMMARY_V3 = SUMMARY_FORMATS  # SUMMARY_V3 is SUMMARY_FORMAT, what new runs write
_V2_METHOD = (
    "mean of per-item means; se = clustered SE over items (std of per-item means / sqrt(items)); "
    "95% interval, named by 'interval': 'none' with one item; 'wilson' = Wilson score interval of the "
    "proportion of items passed, n = items, when every value lies in [0, 1] and every per-item mean is "
    "0 or 1; else 'clustered-clipped' = mean +/- 1.96 x se clipped to [0, 1] when every value lies in "
    "[0, 1]; else 'clustered' = mean +/- 1.96 x se; spread = population std of per-trial means"
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
    SUMMARY_V3: SummaryFormat(
        interval="bounded",
        method=(
            f"{_V2_METHOD}; pass_all_trials (pass^k), for a metric of 0/1 values with the same k > 1 trials "
            "per item: the share of items all k of whose trials passed"
        ),
        names_interval=True,
        pass_all_trials=True,
    ),
}
METHOD = METHODS[SUMMARY_FORMAT].method


def _as_record(values: list[tuple[Any, Any, float]], fmt: SummaryFormat, errors: int) -> dict[str, Any]:
    record = asdict(estimate(values, fmt.interval))
    record["ci95"] = list(record["ci95"]) if record["ci95"] is not None else None
    if not fmt.names_interval:
        del record["interval"]
    if errors:  # left out when none failed, so summaries of runs without failures are as before
        record["errors"] = errors
    if fmt.pass_all_trials and (all_passed := pass_all_trials(values)) is not None:
        record["pass_all_trials"] = all_passed  # pass^k: repeats of a 0/1 metric
    return record


def summarize(scores: pa.Table, summary_format: str = SUMMARY_FORMAT, failed: Collection[str] = ()) -> dict[str, Any]:
    """The summary of a scores table in ``summary_format`` (ValueError for a format this code does not know).

    ``failed``: episodes that failed (scored 0); each metric counts their observations as ``errors``,
    as it counts every row whose ``error`` column says why it scores 0 (a scorer that raised).
    """
    if summary_format not in METHODS:
        raise ValueError(f"unknown summary format {summary_format!r}; expected one of {sorted(METHODS)}")
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
        tasks.setdefault(task, {})[metric] = _as_record(values, fmt, errors[(task, metric)])
    summary = {
        "format": summary_format,
        "method": fmt.method,
        "tasks": tasks,
        "overall": {
            metric: _as_record(values, fmt, overall_errors[metric]) for metric, values in sorted(overall.items())
        },
    }
    return Summary.model_validate(summary).as_record()


def resummarize(scores: pa.Table, stored: Any, failed: Collection[str] = ()) -> dict[str, Any]:
    """``scores`` summarised in the format ``stored`` (a summary.json as read) declares, for a
    byte-for-byte comparison; ValueError when it declares none this code knows."""
    declared = stored.get("format") if isinstance(stored, dict) else None
    return summarize(scores, declared if isinstance(declared, str) else "", failed)
