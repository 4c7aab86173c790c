"""The calibration's statistics, each a pure function of paired (real, predicted) values (seed 003 §11).

Errors are relative to the real value and in percent: ``MAPE = mean |p − r| / r``; the signed bias
``mean (p − r) / r`` (positive: the prediction is slower than reality, an over-prediction); the median
absolute percentage error (the figure BLIS's sim-to-real study reports). ``pearson_r`` is scipy's.
Per-percentile error compares the two distributions' percentiles (``(p_q − r_q) / r_q``). The two-sample
Kolmogorov–Smirnov test (scipy) gives D and p; QQ data pairs the distributions' quantiles at 100 evenly
spaced levels (the midpoints 0.5%, 1.5%, …, 99.5%, numpy's linear interpolation). Bootstrap CIs resample
the pairs with replacement (``n_boot`` times, a seeded generator) and take the 2.5th and 97.5th percentiles
of the statistic. The quality rating is seed 003's table: the worse of the MAPE's band and r's band.
``banded_bias`` splits the pairs into bands of equal count by a key (the prompt's length) and gives each
band's median signed error: a miss that moves with the key (a cost per context token the model lacks)
shows as a trend across bands, which one overall figure averages away.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable

import numpy as np
from scipy import stats as sps

__all__ = [
    "BANDS",
    "PERCENTILES",
    "QQ_LEVELS",
    "RATINGS",
    "banded_bias",
    "bias_direction",
    "bootstrap_ci",
    "ks_two_sample",
    "mape",
    "median_ape",
    "pearson_r",
    "percentile_errors",
    "qq_pairs",
    "quality_rating",
    "signed_bias",
]

PERCENTILES = (50.0, 90.0, 99.0)
QQ_LEVELS = (np.arange(100) + 0.5) / 100  # 100 evenly spaced quantile levels (midpoints)
RATINGS = ("Excellent", "Good", "Fair", "Poor")
_MAPE_BANDS = (10.0, 20.0, 35.0)  # below the first: Excellent; up to the second: Good; the third: Fair
_R_BANDS = (0.95, 0.85, 0.70)  # above the first: Excellent; from the second: Good; the third: Fair
NEUTRAL_BIAS_PCT = 1.0  # a mean signed error within ±1% is called neutral
BANDS = 4  # banded_bias: quartiles of the key


def _rel(real: np.ndarray, pred: np.ndarray) -> np.ndarray:
    real, pred = np.asarray(real, float), np.asarray(pred, float)
    if real.shape != pred.shape or real.size == 0:
        raise ValueError(f"need paired, non-empty values (got {real.shape} and {pred.shape})")
    if np.any(real <= 0):
        raise ValueError("a real value ≤ 0 has no relative error")
    return (pred - real) / real


def banded_bias(
    key: np.ndarray, real: np.ndarray, pred: np.ndarray, bands: int = BANDS
) -> list[tuple[float, float, int, float]]:
    """``(key low, key high, n, median signed error %)`` per band: the pairs sorted by ``key`` and cut into
    ``bands`` groups of equal count (the first ones one larger where it does not divide)."""
    key = np.asarray(key, float)
    rel = _rel(real, pred) * 100
    if key.shape != rel.shape:
        raise ValueError(f"need one key per pair (got {key.shape} for {rel.shape})")
    order = np.argsort(key, kind="stable")
    return [
        (float(key[g].min()), float(key[g].max()), int(g.size), float(np.median(rel[g])))
        for g in np.array_split(order, min(bands, key.size))
    ]


def mape(real: np.ndarray, pred: np.ndarray) -> float:
    """Mean absolute percentage error (%)."""
    return float(np.mean(np.abs(_rel(real, pred))) * 100)


def median_ape(real: np.ndarray, pred: np.ndarray) -> float:
    """Median absolute percentage error (%)."""
    return float(np.median(np.abs(_rel(real, pred))) * 100)


def signed_bias(real: np.ndarray, pred: np.ndarray) -> float:
    """Mean signed percentage error (%): positive when the prediction is above reality."""
    return float(np.mean(_rel(real, pred)) * 100)


def bias_direction(bias_pct: float) -> str:
    """Seed 003's bias direction: over-predict, under-predict, or neutral (within ±1%)."""
    if bias_pct > NEUTRAL_BIAS_PCT:
        return "over-predict"
    if bias_pct < -NEUTRAL_BIAS_PCT:
        return "under-predict"
    return "neutral"


def pearson_r(real: np.ndarray, pred: np.ndarray) -> float | None:
    """Pearson's r (scipy); None where it is undefined (fewer than two pairs, or a constant side)."""
    real, pred = np.asarray(real, float), np.asarray(pred, float)
    if real.size < 2 or np.ptp(real) == 0 or np.ptp(pred) == 0:
        return None
    return float(sps.pearsonr(real, pred).statistic)


def percentile_errors(
    real: np.ndarray, pred: np.ndarray, percentiles: tuple[float, ...] = PERCENTILES
) -> list[tuple[float, float, float, float]]:
    """``(percentile, real, predicted, error %)`` of the two distributions (they need not be paired)."""
    out = []
    for q in percentiles:
        r, p = float(np.percentile(real, q)), float(np.percentile(pred, q))
        out.append((q, r, p, (p - r) / r * 100 if r > 0 else math.nan))
    return out


def ks_two_sample(real: np.ndarray, pred: np.ndarray) -> tuple[float, float]:
    """Two-sample Kolmogorov–Smirnov test (scipy, exact or asymptotic as it chooses): ``(D, p)``. Where the
    exact p-value does not converge (near-identical samples: a prediction that matches), scipy falls back to
    the asymptotic one with a RuntimeWarning; that fallback is the documented choice, not a fault to show."""
    with warnings.catch_warnings():
        warnings.filterwarnings(
            "ignore", message="ks_2samp: Exact calculation unsuccessful", category=RuntimeWarning
        )
        result = sps.ks_2samp(np.asarray(real, float), np.asarray(pred, float))
    return float(result.statistic), float(result.pvalue)


def qq_pairs(real: np.ndarray, pred: np.ndarray) -> list[tuple[float, float, float]]:
    """``(level, real quantile, predicted quantile)`` at the 100 levels of ``QQ_LEVELS``."""
    rq = np.quantile(np.asarray(real, float), QQ_LEVELS)
    pq = np.quantile(np.asarray(pred, float), QQ_LEVELS)
    return [(float(q), float(r), float(p)) for q, r, p in zip(QQ_LEVELS, rq, pq, strict=True)]


def bootstrap_ci(
    real: np.ndarray,
    pred: np.ndarray,
    statistic: Callable[[np.ndarray, np.ndarray], float | None],
    n_boot: int = 1000,
    seed: int = 0,
) -> tuple[float, float] | None:
    """Percentile 95% CI of ``statistic`` over ``n_boot`` resamples of the pairs (seeded); None with
    fewer than two pairs or where the statistic is undefined in most resamples."""
    real, pred = np.asarray(real, float), np.asarray(pred, float)
    if real.size < 2:
        return None
    rng = np.random.default_rng(seed)
    values = []
    for _ in range(n_boot):
        idx = rng.integers(0, real.size, size=real.size)
        v = statistic(real[idx], pred[idx])
        if v is not None and math.isfinite(v):
            values.append(v)
    if len(values) < n_boot / 2:
        return None
    return float(np.percentile(values, 2.5)), float(np.percentile(values, 97.5))


def _mape_band(mape_pct: float) -> int:
    if mape_pct < _MAPE_BANDS[0]:
        return 0
    return next((i for i, edge in enumerate(_MAPE_BANDS) if i and mape_pct <= edge), len(_MAPE_BANDS))


def _r_band(r: float) -> int:
    if r > _R_BANDS[0]:
        return 0
    return next((i for i, edge in enumerate(_R_BANDS) if i and r >= edge), len(_R_BANDS))


def quality_rating(mape_pct: float, r: float | None) -> str:
    """Seed 003's rating: Excellent (MAPE < 10%, r > 0.95), Good (10–20%, 0.85–0.95), Fair (20–35%,
    0.70–0.85), Poor (beyond): the worse of the two bands (r undefined: the MAPE's band alone)."""
    band = _mape_band(mape_pct)
    if r is not None:
        band = max(band, _r_band(r))
    return RATINGS[band]
