"""The calibration's statistics on small cases with hand-computed answers (analysis.calibrate.stats)."""

from __future__ import annotations

import numpy as np
import pytest

from analysis.calibrate import stats


def test_mape_median_ape_and_bias() -> None:
    real, pred = np.array([100.0, 200.0, 400.0]), np.array([110.0, 180.0, 400.0])
    # |+10/100|, |-20/200|, 0 → mean 1/15, median 0.1; signed: +0.1 - 0.1 + 0 = 0
    assert stats.mape(real, pred) == pytest.approx(100 / 15)
    assert stats.median_ape(real, pred) == pytest.approx(10.0)
    assert stats.signed_bias(real, pred) == pytest.approx(0.0)
    assert stats.signed_bias(real, real * 1.1) == pytest.approx(10.0)
    assert stats.signed_bias(real, real * 0.8) == pytest.approx(-20.0)


def test_bias_direction_bands() -> None:
    assert stats.bias_direction(10.0) == "over-predict"
    assert stats.bias_direction(-1.5) == "under-predict"
    assert stats.bias_direction(0.9) == stats.bias_direction(-1.0) == "neutral"


def test_relative_errors_refuse_bad_input() -> None:
    with pytest.raises(ValueError, match="paired"):
        stats.mape(np.array([1.0, 2.0]), np.array([1.0]))
    with pytest.raises(ValueError, match="≤ 0"):
        stats.mape(np.array([0.0, 2.0]), np.array([1.0, 2.0]))


def test_pearson_r() -> None:
    # x and y deviations (-1.5, -0.5, 0.5, 1.5) and (-1.5, 0.5, -0.5, 1.5): Σxy = 4, Σx² = Σy² = 5
    assert stats.pearson_r(np.array([1, 2, 3, 4.0]), np.array([1, 3, 2, 4.0])) == pytest.approx(0.8)
    assert stats.pearson_r(np.array([1, 2, 3.0]), np.array([2, 4, 6.0])) == pytest.approx(1.0)
    assert stats.pearson_r(np.array([1, 2, 3.0]), np.array([3, 2, 1.0])) == pytest.approx(-1.0)
    assert stats.pearson_r(np.array([1, 2, 3.0]), np.array([5, 5, 5.0])) is None  # a constant side
    assert stats.pearson_r(np.array([1.0]), np.array([2.0])) is None


def test_percentile_errors() -> None:
    real, pred = np.array([10, 20, 30, 40, 50.0]), np.array([15, 25, 35, 45, 55.0])
    (q50, r50, p50, e50), (q90, r90, p90, e90), _ = stats.percentile_errors(real, pred)
    assert (q50, r50, p50) == (50.0, 30.0, 35.0) and e50 == pytest.approx(100 * 5 / 30)
    # p90: position 0.9 × 4 = 3.6 → 40 + 0.6 × 10 = 46 and 51
    assert (q90, r90, p90) == (90.0, pytest.approx(46.0), pytest.approx(51.0))
    assert e90 == pytest.approx(100 * 5 / 46)


def test_ks_two_sample() -> None:
    d, p = stats.ks_two_sample(np.array([1, 2, 3.0]), np.array([4, 5, 6.0]))
    assert d == 1.0 and p == pytest.approx(0.1)  # exact: 2 of the C(6, 3) = 20 orderings are as extreme
    d, p = stats.ks_two_sample(np.array([1, 2, 3.0]), np.array([1, 2, 3.0]))
    assert d == 0.0 and p == pytest.approx(1.0)


def test_qq_pairs_at_100_levels() -> None:
    real = np.arange(101.0)  # quantile q of 0..100 (linear interpolation) is exactly 100 q
    pairs = stats.qq_pairs(real, 2 * real)
    assert len(pairs) == 100
    assert pairs[0] == pytest.approx((0.005, 0.5, 1.0)) and pairs[-1] == pytest.approx((0.995, 99.5, 199.0))
    assert all(p == pytest.approx(2 * r) for _, r, p in pairs)


def test_bootstrap_ci() -> None:
    real = np.array([100.0, 200.0, 300.0])
    assert stats.bootstrap_ci(real, real * 1.1, stats.mape) == pytest.approx((10.0, 10.0))
    # two pairs with errors 10% and 0%: a resample's MAPE is 0, 5 or 10 (¼, ½, ¼) → CI [0, 10]
    ci = stats.bootstrap_ci(np.array([100.0, 100.0]), np.array([110.0, 100.0]), stats.mape, 1000, seed=1)
    assert ci == (0.0, 10.0)
    a = stats.bootstrap_ci(real, np.array([90.0, 230.0, 310.0]), stats.mape, 500, seed=7)
    assert a == stats.bootstrap_ci(real, np.array([90.0, 230.0, 310.0]), stats.mape, 500, seed=7)  # seeded
    assert stats.bootstrap_ci(np.array([1.0]), np.array([2.0]), stats.mape) is None
    # collinear pairs: every resample with two distinct pairs has r = 1 (a resample of one pair repeated
    # has none and is left out)
    assert stats.bootstrap_ci(real, 2 * real, stats.pearson_r) == pytest.approx((1.0, 1.0))


@pytest.mark.parametrize(
    ("mape", "r", "rating"),
    [
        (5.0, 0.99, "Excellent"),
        (10.0, 0.99, "Good"),  # MAPE < 10 is Excellent, 10 is not
        (5.0, 0.95, "Good"),  # r > 0.95 is Excellent, 0.95 is not
        (20.0, 0.85, "Good"),
        (20.1, 0.99, "Fair"),
        (5.0, 0.84, "Fair"),
        (35.0, 0.70, "Fair"),
        (35.1, 0.99, "Poor"),
        (5.0, 0.69, "Poor"),
        (5.0, None, "Excellent"),  # r undefined: the MAPE's band alone
    ],
)
def test_quality_rating_is_the_worse_band(mape: float, r: float | None, rating: str) -> None:
    assert stats.quality_rating(mape, r) == rating


def test_banded_bias_splits_by_the_key_into_equal_counts() -> None:
    key = np.array([900, 100, 500, 300, 700, 200, 800, 400, 600])  # prompt lengths, unsorted
    real = np.full(9, 10.0)
    pred = 10.0 * (1 + key / 1000)  # +10% at 100 tokens … +90% at 900: the error grows with the key
    bands = stats.banded_bias(key, real, pred, bands=4)
    # sorted 100…900 in groups of 3, 2, 2, 2: (100, 200, 300), (400, 500), (600, 700), (800, 900)
    assert [(lo, hi, n) for lo, hi, n, _ in bands] == [
        (100, 300, 3), (400, 500, 2), (600, 700, 2), (800, 900, 2),
    ]  # fmt: skip
    assert [e for *_, e in bands] == pytest.approx([20.0, 45.0, 65.0, 85.0])
    assert len(stats.banded_bias(key[:2], real[:2], pred[:2])) == 2  # no empty band
    with pytest.raises(ValueError, match="one key per pair"):
        stats.banded_bias(key[:3], real, pred)
