"""Paired statistics on constructed data with known answers."""

from __future__ import annotations

import math
import statistics

import pytest

from evalrun.records.seeds import derive_seed
from evalrun.stats.estimates import (
    Z_95,
    bootstrap_ci,
    estimate,
    item_means,
    mcnemar,
    paired,
    paired_test,
    sign_flip_test,
    trial_means,
)

SEED = derive_seed(1234, "bootstrap", "test")


def test_mcnemar_matches_a_hand_computed_case() -> None:
    # 10 items right only in A, 2 right only in B: n = 12 discordant pairs.
    # exact: 2 * P(X <= 2), X ~ Bin(12, 1/2) = 2 * (1 + 12 + 66) / 4096 = 158 / 4096
    m = mcnemar(10, 2)
    assert m.p_exact == 158 / 4096 == pytest.approx(0.03857421875)
    # asymptotic, continuity-corrected: chi2 = (|10 - 2| - 1)^2 / 12 = 49 / 12, 1 degree of freedom
    assert m.chi2 == pytest.approx(49 / 12)
    assert m.p_asymptotic == pytest.approx(math.erfc(math.sqrt(49 / 24)))
    assert m.p_asymptotic == pytest.approx(0.04331, abs=1e-5)
    assert mcnemar(3, 3).p_exact == 1.0  # symmetric: no evidence, capped at 1
    assert mcnemar(0, 0).p_exact == 1.0 and mcnemar(0, 0).chi2 is None
    assert mcnemar(0, 6).p_exact == pytest.approx(2 / 64)


def test_paired_test_picks_mcnemar_for_0_1_values_and_counts_discordant_pairs() -> None:
    a = [1.0] * 10 + [0.0] * 2 + [1.0] * 30 + [0.0] * 8
    b = [0.0] * 10 + [1.0] * 2 + [1.0] * 30 + [0.0] * 8
    test = paired_test(a, b, SEED)
    assert test.name == "mcnemar"
    assert test.details["a_only"] == 10 and test.details["b_only"] == 2
    assert test.p_value == pytest.approx(158 / 4096)


def test_paired_interval_is_narrower_than_unpaired_when_items_are_correlated() -> None:
    # Item difficulty varies a lot; B is A plus a small, nearly constant improvement.
    difficulty = [i / 40 for i in range(40)]
    a = {f"i{i}": d for i, d in enumerate(difficulty)}
    b = {f"i{i}": d + 0.05 + (0.01 if i % 2 else -0.01) for i, d in enumerate(difficulty)}
    est = paired(a, b, SEED)
    assert est.diff == pytest.approx(0.05)
    assert est.correlation is not None and est.correlation > 0.99
    width_p = est.ci95_paired[1] - est.ci95_paired[0]
    width_u = est.ci95_unpaired[1] - est.ci95_unpaired[0]
    assert width_p < width_u / 10
    assert est.ci95_paired[0] > 0 > est.ci95_unpaired[0]  # pairing detects what the unpaired interval cannot
    diffs = [b[k] - a[k] for k in a]
    assert est.se_paired == pytest.approx(statistics.stdev(diffs) / math.sqrt(40))
    assert est.ci95_paired == pytest.approx((0.05 - Z_95 * est.se_paired, 0.05 + Z_95 * est.se_paired))
    se_a = statistics.stdev(a.values()) / math.sqrt(40)
    se_b = statistics.stdev(b.values()) / math.sqrt(40)
    assert est.se_unpaired == pytest.approx(math.hypot(se_a, se_b))
    assert est.test.name == "permutation" and est.test.p_value < 0.001
    low, high = est.ci95_paired_bootstrap
    assert low <= 0.05 <= high and high - low < width_u / 5


def test_repeats_are_averaged_within_an_item_before_pairing() -> None:
    obs = [("x", 0, 1.0), ("x", 1, 0.0), ("y", 0, 1.0), ("y", 1, 1.0)]
    assert item_means(obs) == {"x": 0.5, "y": 1.0}
    assert trial_means(obs) == {0: 1.0, 1: 0.5}
    est = paired(item_means(obs), {"x": 1.0, "y": 1.0, "z": 0.0}, SEED)
    assert est.n_items == 2 and est.diff == pytest.approx(0.25)  # z is in B only: left out
    assert est.test.name == "permutation"  # 0.5 is not a 0/1 value


def test_sign_flip_test_exact_enumeration_and_seeded_sampling() -> None:
    # 4 positive differences: only the all-plus and all-minus flips are as extreme -> p = 2/16
    assert sign_flip_test([1.0, 1.0, 1.0, 1.0], SEED) == pytest.approx(2 / 16)
    assert sign_flip_test([0.0, 0.0, 0.0], SEED) == 1.0
    diffs = [0.1 * ((i % 7) - 2) for i in range(60)]
    p1, p2 = sign_flip_test(diffs, SEED), sign_flip_test(diffs, SEED)
    assert p1 == p2 and 0 < p1 <= 1  # same seed, same p: no global random state


def test_bootstrap_interval_is_reproducible_and_covers_the_mean() -> None:
    values = [float(i % 2) for i in range(200)]
    ci = bootstrap_ci(values, SEED)
    assert ci == bootstrap_ci(values, SEED)
    assert ci is not None and ci[0] < 0.5 < ci[1]
    se = statistics.stdev(values) / math.sqrt(200)
    assert ci[1] - ci[0] == pytest.approx(2 * Z_95 * se, rel=0.15)  # agrees with the analytic interval
    assert bootstrap_ci([1.0], SEED) is None


def test_estimate_keeps_its_output_keys() -> None:
    est = estimate([("a", 0, 1.0), ("b", 0, 0.0)])
    assert set(est.__dataclass_fields__) == {
        "mean", "se", "ci95", "spread", "n_items", "trials_per_item", "n_observations",
        "interval",  # which interval ci95 is (summary/2 names it; summary/1 leaves it out)
    }  # fmt: skip
