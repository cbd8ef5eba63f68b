"""A group's metric over its tasks, with lm-eval 0.4.13's definitions (``lm_eval/api/metrics.py``): the mean of
the tasks' values weighted by their sizes (or not), and the standard error that goes with it, pooled from the
tasks' standard errors. The sums run in the tasks' order, as lm-eval's do, so the figures agree to the bit."""

from __future__ import annotations

import math
from collections.abc import Sequence


def group_mean(values: Sequence[float], sizes: Sequence[int], weight_by_size: bool = True) -> float:
    """lm-eval's ``aggregate_subtask_metrics``: sum(value x size) / sum(size), every size 1 unless weighted."""
    weights = list(sizes) if weight_by_size else [1] * len(values)
    if len(weights) != len(values) or not values:
        raise ValueError(f"{len(values)} values and {len(weights)} sizes: expected as many, at least one")
    return sum([value * size for value, size in zip(values, weights, strict=True)]) / sum(weights)


def group_stderr(stderrs: Sequence[float], sizes: Sequence[int], weight_by_size: bool = True) -> float | None:
    """The standard error of :func:`group_mean`: lm-eval's ``pooled_sample_stderr`` for a weighted mean (the
    pooled variance, sum((n - 1) x se^2 x n) / (sum(n) - k), over sum(n)), ``unweighted_mean_stderr`` otherwise
    (sqrt(sum(se^2)) / k). None where the pooled variance has no degrees of freedom (every task of one item)."""
    if len(stderrs) != len(sizes) or not stderrs:
        raise ValueError(f"{len(stderrs)} stderrs and {len(sizes)} sizes: expected as many, at least one")
    if not weight_by_size:
        return math.sqrt(sum(se**2 for se in stderrs)) / len(stderrs)
    freedom = sum(sizes) - len(sizes)
    if freedom <= 0:
        return None
    pooled = sum([(n - 1) * se**2 * n for n, se in zip(sizes, stderrs, strict=True)]) / freedom
    return math.sqrt(pooled / sum(sizes))
