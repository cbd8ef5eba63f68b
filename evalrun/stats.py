"""Statistics with items as the unit: repeats are averaged within an item first.

Repeats reduce noise within an item; only more items reduce the uncertainty about which items were
chosen, so intervals are computed over per-item means (a clustered standard error).
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from collections.abc import Hashable, Iterable
from dataclasses import dataclass

Z_95 = 1.959963984540054


@dataclass(frozen=True)
class Estimate:
    mean: float
    se: float | None
    ci95: tuple[float, float] | None
    spread: float  # population std of per-trial means (0 with one trial)
    n_items: int
    trials_per_item: float
    n_observations: int


def estimate(observations: Iterable[tuple[Hashable, Hashable, float]]) -> Estimate:
    """``observations``: (item, trial, value). Mean over item means, normal 95% interval over items."""
    by_item: dict[Hashable, list[float]] = defaultdict(list)
    by_trial: dict[Hashable, list[float]] = defaultdict(list)
    n = 0
    for item, trial, value in observations:
        by_item[item].append(value)
        by_trial[trial].append(value)
        n += 1
    if n == 0:
        raise ValueError("no observations")
    item_means = [math.fsum(v) / len(v) for v in by_item.values()]
    mean = math.fsum(item_means) / len(item_means)
    se = None
    ci = None
    if len(item_means) > 1:
        se = statistics.stdev(item_means) / math.sqrt(len(item_means))
        ci = (mean - Z_95 * se, mean + Z_95 * se)
    trial_means = [math.fsum(v) / len(v) for v in by_trial.values()]
    return Estimate(
        mean=mean,
        se=se,
        ci95=ci,
        spread=statistics.pstdev(trial_means) if len(trial_means) > 1 else 0.0,
        n_items=len(item_means),
        trials_per_item=n / len(item_means),
        n_observations=n,
    )
