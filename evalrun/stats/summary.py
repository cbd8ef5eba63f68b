"""summary.json: per task and overall, every metric's mean with its item-level uncertainty."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

import pyarrow as pa

from evalrun.stats.estimates import estimate

SUMMARY_FORMAT = "evalrun.summary/1"
METHOD = (
    "mean of per-item means; 95% interval = mean +/- 1.96 x clustered SE over items; "
    "spread = population std of per-trial means"
)


def _as_record(values: list[tuple[Any, Any, float]]) -> dict[str, Any]:
    record = asdict(estimate(values))
    record["ci95"] = list(record["ci95"]) if record["ci95"] is not None else None
    return record


def summarize(scores: pa.Table) -> dict[str, Any]:
    cols = scores.select(["task", "item_id", "seed", "repeat", "metric", "value"]).to_pydict()
    grouped: dict[tuple[str, str], list[tuple[Any, Any, float]]] = {}
    overall: dict[str, list[tuple[Any, Any, float]]] = {}
    for task, item, seed, repeat, metric, value in zip(
        cols["task"], cols["item_id"], cols["seed"], cols["repeat"], cols["metric"], cols["value"], strict=True
    ):
        grouped.setdefault((task, metric), []).append((item, (seed, repeat), value))
        overall.setdefault(metric, []).append(((task, item), (seed, repeat), value))
    tasks: dict[str, dict[str, Any]] = {}
    for (task, metric), values in sorted(grouped.items()):
        tasks.setdefault(task, {})[metric] = _as_record(values)
    return {
        "format": SUMMARY_FORMAT,
        "method": METHOD,
        "tasks": tasks,
        "overall": {metric: _as_record(values) for metric, values in sorted(overall.items())},
    }
