"""Statistics with items as the unit: repeats are averaged within an item first.

Repeats reduce noise within an item; only more items reduce the uncertainty about which items were
chosen, so intervals are computed over per-item means (a clustered standard error).

Two interval methods (summary.json names its method; docs/design.md "Summary"):

- ``clustered`` (evalrun.summary/1): mean +/- 1.96 x clustered SE. For a 0/1 metric it can leave
  [0, 1], and it is [1, 1] when every item is right, claiming a certainty a handful of items cannot give.
- ``bounded`` (evalrun.summary/2): when every value lies in [0, 1] and every per-item mean is 0 or
  1 (a pass/fail per item; with repeats, every repeat of an item agrees), the Wilson score interval
  of the proportion of items passed, n = number of items. Otherwise the clustered interval, clipped
  to [0, 1] when every value lies in [0, 1] (per-item means are then fractions, and a binomial
  interval over items would not fit them). Values outside [0, 1] keep the clustered interval as is.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Hashable, Iterable
from dataclasses import dataclass
from typing import Literal

import numpy as np

Z_95 = 1.959963984540054

IntervalMethod = Literal["clustered", "bounded"]
# Which interval an Estimate carries: the normal one, Wilson's, the normal one clipped to [0, 1], or none
IntervalKind = Literal["clustered", "wilson", "clustered-clipped", "none"]


@dataclass(frozen=True)
class Estimate:
    mean: float
    se: float | None
    ci95: tuple[float, float] | None
    spread: float  # population std of per-trial means (0 with one trial)
    n_items: int
    trials_per_item: float
    n_observations: int
    interval: IntervalKind  # how ci95 was computed ("none": one item, no interval)


_FSUM_ZERO = math.fsum([-0.0])  # the zero fsum gives for a sum of negative zeros (+0.0 here, where IEEE has -0.0)


@dataclass(frozen=True)
class GroupedValues:
    """Values in groups (one per item, or one per trial), as an Arrow list array holds them: group ``g``
    is ``values[offsets[g]:offsets[g + 1]]``. Eight bytes a value and no Python object per value, so a
    scores table of millions of rows is summarised in NumPy arrays (evalrun.stats.summary)."""

    values: np.ndarray  # float64
    offsets: np.ndarray  # int64, ascending from 0 to len(values); no group is empty

    @classmethod
    def by_key(cls, values: np.ndarray, keys: np.ndarray) -> GroupedValues:
        """``values`` grouped by ``keys`` (integers, one per value), groups in ascending key order."""
        order = np.argsort(keys, kind="stable")
        sorted_keys = keys[order]
        starts = np.flatnonzero(sorted_keys[1:] != sorted_keys[:-1]) + 1
        offsets = np.concatenate(([0], starts, [len(keys)])) if len(keys) else np.zeros(1, dtype=np.int64)
        return cls(np.asarray(values, dtype=np.float64)[order], offsets)

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def sizes(self) -> np.ndarray:
        return np.diff(self.offsets)

    def sums(self) -> np.ndarray:
        """Each group's sum as ``math.fsum`` gives it: exactly rounded, so no order of the values changes it.

        NumPy adds where that is exact: integers whose partial sums stay below 2**53, and groups of one
        or two values (a single IEEE addition is correctly rounded); ``math.fsum`` adds the rest, and
        any sum that is not finite, so an overflow raises as fsum raises."""
        if not len(self):
            return np.zeros(0)
        values, offsets = self.values, self.offsets
        with np.errstate(over="ignore", invalid="ignore"):  # a sum that is not finite goes to fsum below
            sums = np.add.reduceat(values, offsets[:-1]) + _FSUM_ZERO  # -0.0 + _FSUM_ZERO: the zero fsum gives
        if _small_integers(values):
            return sums
        for group in np.flatnonzero((self.sizes() > 2) | ~np.isfinite(sums)).tolist():
            sums[group] = math.fsum(values[offsets[group] : offsets[group + 1]])
        return sums

    def means(self) -> list[float]:
        """Each group's ``fsum(values) / len(values)``."""
        return (self.sums() / self.sizes()).tolist()


def _small_integers(values: np.ndarray) -> bool:
    """Every value is an integer and any sum of them stays below 2**53, so floats add them exactly."""
    return bool(
        np.all(np.isfinite(values))
        and np.all(np.trunc(values) == values)
        and float(np.max(np.abs(values))) * len(values) < 2.0**53
    )


def pass_all_trials(observations: Iterable[tuple[Hashable, Hashable, float]]) -> float | None:
    """pass^k: the share of items whose every one of k trials passed (value 1), with items as the
    unit; None unless every value is 0 or 1 and every item has the same k > 1 trials."""
    return grouped_pass_all_trials(_grouped(observations).by_item)


def grouped_pass_all_trials(by_item: GroupedValues) -> float | None:
    """:func:`pass_all_trials` of values grouped by item."""
    values = by_item.values
    if not np.all((values == 0.0) | (values == 1.0)):
        return None
    sizes = by_item.sizes()
    if not len(sizes) or np.any(sizes != sizes[0]) or sizes[0] < 2:
        return None
    return int(np.count_nonzero(by_item.sums() == sizes)) / len(sizes)


def wilson_interval(proportion: float, n: int) -> tuple[float, float]:
    """95% Wilson score interval of a proportion observed over ``n`` trials.

    It lies within [0, 1] and holds the proportion; the bounds are clamped so rounding keeps both
    true (at a proportion of 0 the lower bound is 0 exactly, not 5.6e-17)."""
    z2 = Z_95 * Z_95
    scale = 1 + z2 / n
    centre = (proportion + z2 / (2 * n)) / scale
    half = Z_95 * math.sqrt(proportion * (1 - proportion) / n + z2 / (4 * n * n)) / scale
    return max(0.0, min(centre - half, proportion)), min(1.0, max(centre + half, proportion))


def estimate(observations: Iterable[tuple[Hashable, Hashable, float]], method: IntervalMethod = "bounded") -> Estimate:
    """``observations``: (item, trial, value). Mean over item means; 95% interval over items by
    ``method`` (see the module docstring); no interval with a single item."""
    _check_method(method)
    grouped = _grouped(observations)
    return grouped_estimate(grouped.by_item, grouped.by_trial, method)


def grouped_estimate(by_item: GroupedValues, by_trial: GroupedValues, method: IntervalMethod = "bounded") -> Estimate:
    """:func:`estimate` of the same values grouped by item and by trial. Every sum is exactly rounded
    and the deviations are exact (``statistics``), so neither the order of the groups nor of the values
    within them changes a bit of the result."""
    _check_method(method)
    n = len(by_item.values)
    if n == 0:
        raise ValueError("no observations")
    values = by_item.values
    unit = bool(np.all((values >= 0.0) & (values <= 1.0)))  # every value lies in [0, 1]
    item_means = by_item.means()
    mean = math.fsum(item_means) / len(item_means)
    se = None
    ci = None
    kind: IntervalKind = "none"
    if len(item_means) > 1:
        se = statistics.stdev(item_means) / math.sqrt(len(item_means))
        ci, kind = (mean - Z_95 * se, mean + Z_95 * se), "clustered"
        if method == "bounded" and unit and all(m in (0.0, 1.0) for m in item_means):
            ci, kind = wilson_interval(mean, len(item_means)), "wilson"
        elif method == "bounded" and unit:
            ci, kind = (max(0.0, ci[0]), min(1.0, ci[1])), "clustered-clipped"
    trial_means = by_trial.means()
    return Estimate(
        mean=mean,
        se=se,
        ci95=ci,
        spread=statistics.pstdev(trial_means) if len(trial_means) > 1 else 0.0,
        n_items=len(item_means),
        trials_per_item=n / len(item_means),
        n_observations=n,
        interval=kind,
    )


def _check_method(method: str) -> None:
    if method not in ("clustered", "bounded"):
        raise ValueError(f"unknown interval method {method!r}")


@dataclass(frozen=True)
class _Observations:
    items: list[Hashable]  # in the order first seen; item ``g`` is group ``g`` of by_item
    trials: list[Hashable]
    by_item: GroupedValues
    by_trial: GroupedValues


def _grouped(observations: Iterable[tuple[Hashable, Hashable, float]]) -> _Observations:
    items: dict[Hashable, int] = {}
    trials: dict[Hashable, int] = {}
    item_codes: list[int] = []
    trial_codes: list[int] = []
    values: list[float] = []
    for item, trial, value in observations:
        item_codes.append(items.setdefault(item, len(items)))
        trial_codes.append(trials.setdefault(trial, len(trials)))
        values.append(float(value))
    array = np.array(values, dtype=np.float64)
    return _Observations(
        items=list(items),
        trials=list(trials),
        by_item=GroupedValues.by_key(array, np.array(item_codes, dtype=np.int64)),
        by_trial=GroupedValues.by_key(array, np.array(trial_codes, dtype=np.int64)),
    )


# --- paired statistics: two runs on the same items ------------------------------------------------

BOOTSTRAP_RESAMPLES = 2000
PERMUTATION_RESAMPLES = 10000


def item_means(observations: Iterable[tuple[Hashable, Hashable, float]]) -> dict[Hashable, float]:
    """``(item, trial, value)`` -> each item's mean over its trials (repeats averaged first)."""
    grouped = _grouped(observations)
    return dict(zip(grouped.items, grouped.by_item.means(), strict=True))


def trial_means(observations: Iterable[tuple[Hashable, Hashable, float]]) -> dict[Hashable, float]:
    """``(item, trial, value)`` -> each trial's (seed, repeat) mean over items."""
    grouped = _grouped(observations)
    return dict(zip(grouped.trials, grouped.by_trial.means(), strict=True))


def _normal_ci(mean: float, se: float | None) -> tuple[float, float] | None:
    return None if se is None else (mean - Z_95 * se, mean + Z_95 * se)


def _se(values: list[float]) -> float | None:
    return statistics.stdev(values) / math.sqrt(len(values)) if len(values) > 1 else None


def bootstrap_ci(values: list[float], seed: int, resamples: int = BOOTSTRAP_RESAMPLES) -> tuple[float, float] | None:
    """95% percentile interval of the mean, resampling ``values`` (one per item) with replacement.

    ``seed`` comes from :func:`evalrun.records.seeds.derive_seed`; the interval depends on nothing else.
    """
    if len(values) < 2:
        return None
    data = np.asarray(values, dtype=np.float64)
    rng = np.random.default_rng(seed)
    means = np.empty(resamples, dtype=np.float64)
    block = max(1, 2_000_000 // len(data))
    for start in range(0, resamples, block):
        stop = min(resamples, start + block)
        means[start:stop] = data[rng.integers(0, len(data), size=(stop - start, len(data)))].mean(axis=1)
    low, high = np.quantile(means, [0.025, 0.975])
    return float(low), float(high)


@dataclass(frozen=True)
class McNemar:
    """Exact (binomial) and asymptotic (chi-square, continuity-corrected) McNemar test."""

    a_only: int  # items right in A, wrong in B
    b_only: int  # items wrong in A, right in B
    p_exact: float
    chi2: float | None
    p_asymptotic: float | None


def mcnemar(a_only: int, b_only: int) -> McNemar:
    """Two-sided McNemar test on the discordant pairs; concordant pairs carry no information."""
    from fractions import Fraction

    n = a_only + b_only
    if n == 0:
        return McNemar(a_only, b_only, 1.0, None, None)
    tail = sum(math.comb(n, k) for k in range(min(a_only, b_only) + 1))
    p_exact = float(min(Fraction(1), Fraction(2 * tail, 2**n)))
    chi2 = (abs(a_only - b_only) - 1) ** 2 / n if a_only != b_only else 0.0
    return McNemar(a_only, b_only, p_exact, chi2, math.erfc(math.sqrt(chi2 / 2)))


def sign_flip_test(diffs: list[float], seed: int, resamples: int = PERMUTATION_RESAMPLES) -> float:
    """Two-sided paired permutation test: flip the sign of each item's difference at random.

    p = (1 + #{|mean of flipped| >= |observed mean|}) / (1 + resamples); exact enumeration when
    2**n <= resamples.
    """
    n = len(diffs)
    data = np.asarray(diffs, dtype=np.float64)
    observed = abs(float(data.mean())) if n else 0.0
    if n == 0 or not np.any(data):
        return 1.0
    tolerance = 1e-12 * max(1.0, observed)
    if 2**n <= resamples:
        signs = 1 - 2 * ((np.arange(2**n)[:, None] >> np.arange(n)) & 1)
        extreme = np.abs((signs * data).mean(axis=1)) >= observed - tolerance
        return float(extreme.mean())
    rng = np.random.default_rng(seed)
    count = 0
    block = max(1, 2_000_000 // n)
    for start in range(0, resamples, block):
        size = min(resamples, start + block) - start
        signs = rng.integers(0, 2, size=(size, n)) * 2 - 1
        count += int(np.count_nonzero(np.abs((signs * data).mean(axis=1)) >= observed - tolerance))
    return (1 + count) / (1 + resamples)


@dataclass(frozen=True)
class PairedTest:
    name: str  # "mcnemar" (every per-item value is 0 or 1) or "permutation" (sign flip)
    p_value: float
    statistic: float | None  # McNemar chi2, or the paired t statistic
    details: dict[str, float | int | None]


@dataclass(frozen=True)
class PairedEstimate:
    """B - A over the items both runs have, repeats averaged within each item first."""

    n_items: int
    mean_a: float
    mean_b: float
    diff: float
    se_paired: float | None
    ci95_paired: tuple[float, float] | None
    ci95_paired_bootstrap: tuple[float, float] | None
    se_unpaired: float | None
    ci95_unpaired: tuple[float, float] | None
    correlation: float | None  # of the per-item means: pairing helps when it is positive
    test: PairedTest
    bootstrap_seed: str  # the 64-bit derived seed, as a decimal string (JSON numbers stop at 2**53)


def _correlation(a: list[float], b: list[float]) -> float | None:
    if len(a) < 2:
        return None
    sa, sb = statistics.pstdev(a), statistics.pstdev(b)
    if sa == 0 or sb == 0:
        return None
    ma, mb = math.fsum(a) / len(a), math.fsum(b) / len(b)
    return math.fsum((x - ma) * (y - mb) for x, y in zip(a, b, strict=True)) / (len(a) * sa * sb)


def paired_test(a: list[float], b: list[float], seed: int) -> PairedTest:
    """McNemar when every per-item value is 0 or 1, else a sign-flip permutation test on B - A."""
    if all(v in (0.0, 1.0) for v in (*a, *b)):
        m = mcnemar(
            sum(1 for x, y in zip(a, b, strict=True) if x == 1.0 and y == 0.0),
            sum(1 for x, y in zip(a, b, strict=True) if x == 0.0 and y == 1.0),
        )
        details = {"a_only": m.a_only, "b_only": m.b_only, "p_exact": m.p_exact, "p_asymptotic": m.p_asymptotic}
        return PairedTest("mcnemar", m.p_exact, m.chi2, details)
    diffs = [y - x for x, y in zip(a, b, strict=True)]
    se = _se(diffs)
    t = None if not se else (math.fsum(diffs) / len(diffs)) / se
    p = sign_flip_test(diffs, seed)
    return PairedTest("permutation", p, t, {"resamples": PERMUTATION_RESAMPLES, "t": t, "df": len(diffs) - 1})


def paired(a: dict[Hashable, float], b: dict[Hashable, float], seed: int) -> PairedEstimate:
    """Paired difference B - A of per-item means over the items both have.

    Intervals: paired (1.96 x SE of the per-item differences), its item bootstrap (``seed``), and
    the unpaired one (1.96 x sqrt(SE_A^2 + SE_B^2), as if the two runs had used different items).
    """
    common = sorted(set(a) & set(b), key=repr)
    if not common:
        raise ValueError("the two runs have no item in common")
    xa, xb = [a[k] for k in common], [b[k] for k in common]
    diffs = [y - x for x, y in zip(xa, xb, strict=True)]
    mean_a, mean_b = math.fsum(xa) / len(xa), math.fsum(xb) / len(xb)
    diff = math.fsum(diffs) / len(diffs)
    se_p = _se(diffs)
    se_a, se_b = _se(xa), _se(xb)
    se_u = None if se_a is None or se_b is None else math.sqrt(se_a**2 + se_b**2)
    return PairedEstimate(
        n_items=len(common),
        mean_a=mean_a,
        mean_b=mean_b,
        diff=diff,
        se_paired=se_p,
        ci95_paired=_normal_ci(diff, se_p),
        ci95_paired_bootstrap=bootstrap_ci(diffs, seed),
        se_unpaired=se_u,
        ci95_unpaired=_normal_ci(diff, se_u),
        correlation=_correlation(xa, xb),
        test=paired_test(xa, xb, seed),
        bootstrap_seed=str(seed),
    )
