"""The statistics of an A/B comparison of one cell, from raw repetitions (never from medians of medians).

Per cell: the effect as the ratio B/A of the arms' first quartiles (``location``), a seeded
percentile-bootstrap 95% CI of that ratio (A and B resampled independently), a two-sided Mann–Whitney U test
(``scipy.stats.mannwhitneyu``: a rank test, robust to the heavy right tail a loaded host puts on latencies),
and the minimum detectable effect (MDE) at the repetitions measured. Across cells the p-values are corrected
with Benjamini–Hochberg (``statsmodels``' ``fdr_bh``): a grid holds dozens of cells, and it bounds the
expected share of false "different" verdicts among those flagged (the false discovery rate) without
Bonferroni's loss of power over many cells; cells are positively dependent (one machine, one engine), where BH
stays valid.

A cell's verdict (lower is better: every figure compared is a time): **B better** / **B worse** when the
corrected p-value is below ``alpha`` *and* the CI excludes 1; **no detectable difference** when it is not
significant and the CI lies within ±``tolerance`` of 1 (an effect that large is ruled out); else
**undecided** (more rounds would decide it). The MDE is the relative change a test at ``alpha`` detects
with 80% power, from the log-scale spread of both arms (normal approximation, 1.4826·MAD as a robust σ);
infinite when the rank test cannot reach ``alpha`` at all with so few repetitions.

Why the first quartile and not the median: a busy host only ever adds time (a late wake-up, a step
stretched by a neighbour's work), so its noise is one-sided and additive — the reason benchmark tools
compare minima (Chen & Revels, "Robust benchmarking in noisy environments", 2016). The minimum has no
usable bootstrap CI; the first quartile keeps one and stays on clean repetitions until three in four of a
cell's are contaminated, the median only until half are. Measured on two simulated engines whose step
model differs by exactly 1.3× (6 rounds, the 2-core host loaded by three busy processes for the first 60
of 79 s): B/A of medians 1.255–1.360 across 6 cells (up to 4.6% off), of first quartiles 1.301–1.317
(≤ 1.4%); unloaded, both within 0.7%. Where B is A's distribution scaled, every quantile gives the ratio.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Literal, TypeVar

import numpy as np
from pydantic import Field

from benchcore.schema import StrictModel

Samples = Sequence[float] | np.ndarray  # one arm's repetitions, as stored or as an array
Key = TypeVar("Key", bound=tuple[int, ...])  # a cell, or a configuration × load level × figure

__all__ = [
    "CORRECTION",
    "LOCATION",
    "QUANTILE",
    "Effect",
    "Verdict",
    "bootstrap_ratio_ci",
    "compare_samples",
    "correct_pvalues",
    "location",
    "min_detectable_effect",
    "min_rank_pvalue",
    "rank_pvalue",
    "verdict",
]

Verdict = Literal["B better", "B worse", "no detectable difference", "undecided", "only in A", "only in B"]
CORRECTION = "Benjamini–Hochberg (false discovery rate across cells)"
POWER = 0.8
QUANTILE = 0.25  # the location of repetitions of one measurement: the first quartile (module docstring)
LOCATION = "first quartile"


def _finite(values: Samples) -> np.ndarray:
    x = np.asarray(values, dtype=float)
    return x[np.isfinite(x)]


def location(values: Samples, quantile: float = QUANTILE) -> float:
    """The figure an arm is summarised by: by default the first quartile of its finite values (NaN: none).
    Values that differ by nature (requests of a mix) rather than by host noise take the median (0.5)."""
    x = _finite(values)
    return float(np.quantile(x, quantile)) if x.size else math.nan


def bootstrap_ratio_ci(
    a: Samples,
    b: Samples,
    seed: int | Sequence[int] = 0,
    n_boot: int = 4000,
    level: float = 0.95,
    quantile: float = QUANTILE,
) -> tuple[float, float]:
    """Percentile bootstrap CI of location(B)/location(A) (``quantile``: 0.25 the repetitions' first
    quartile, 0.5 medians, 0.99 P99), each arm resampled on its own with a seeded RNG; ``(nan, nan)`` with
    fewer than two values in an arm or a resampled location of A at 0."""
    xa, xb = _finite(a), _finite(b)
    if xa.size < 2 or xb.size < 2:
        return math.nan, math.nan
    rng = np.random.default_rng(seed)
    med_a = np.quantile(xa[rng.integers(0, xa.size, size=(n_boot, xa.size))], quantile, axis=1)
    med_b = np.quantile(xb[rng.integers(0, xb.size, size=(n_boot, xb.size))], quantile, axis=1)
    if np.any(med_a <= 0):
        return math.nan, math.nan
    tail = (1.0 - level) / 2.0
    low, high = np.quantile(med_b / med_a, [tail, 1.0 - tail])
    return float(low), float(high)


def rank_pvalue(a: Samples, b: Samples) -> float:
    """Two-sided Mann–Whitney U p-value (exact for small samples without ties); NaN with an empty arm."""
    # imported here and in the two functions below: scipy.stats and statsmodels take ≈ 1.5 s, which
    # python -m microbench.battery --help (its compare command imports this module) never needs
    from scipy import stats

    xa, xb = _finite(a), _finite(b)
    if xa.size == 0 or xb.size == 0:
        return math.nan
    return float(stats.mannwhitneyu(xb, xa, alternative="two-sided").pvalue)


def min_rank_pvalue(n_a: int, n_b: int) -> float:
    """The smallest two-sided p-value the exact rank test can give with these sample sizes."""
    if n_a == 0 or n_b == 0:
        return 1.0
    return min(1.0, 2.0 / math.comb(n_a + n_b, n_a))


def min_detectable_effect(a: Samples, b: Samples, alpha: float = 0.05) -> float:
    """Relative change (0.1 = 10%) detectable at ``alpha`` with 80% power; ``inf`` when the rank test
    cannot reach ``alpha`` with these repetitions, NaN with fewer than two positive values in an arm."""
    from scipy import stats

    xa, xb = _finite(a), _finite(b)
    xa, xb = xa[xa > 0], xb[xb > 0]
    if xa.size < 2 or xb.size < 2:
        return math.nan
    if min_rank_pvalue(xa.size, xb.size) >= alpha:
        return math.inf
    la, lb = np.log(xa), np.log(xb)
    sigma_a = 1.4826 * stats.median_abs_deviation(la)
    sigma_b = 1.4826 * stats.median_abs_deviation(lb)
    z = stats.norm.ppf(1 - alpha / 2) + stats.norm.ppf(POWER)
    return float(math.expm1(z * math.sqrt(sigma_a**2 / xa.size + sigma_b**2 / xb.size)))


def correct_pvalues(pvalues: Sequence[float], alpha: float = 0.05) -> list[float]:
    """Benjamini–Hochberg adjusted p-values (NaN stays NaN: a cell without a test is not counted)."""
    from statsmodels.stats.multitest import multipletests

    p = np.asarray(pvalues, dtype=float)
    out = np.full(p.shape, math.nan)
    tested = np.isfinite(p)
    if tested.any():
        out[tested] = multipletests(p[tested], alpha=alpha, method="fdr_bh")[1]
    return [float(x) for x in out]


def verdict(
    ratio: float, ci: tuple[float, float], p_adjusted: float, alpha: float = 0.05, tolerance: float = 0.1
) -> Verdict:
    """The cell's verdict (lower is better); see the module docstring."""
    low, high = ci
    if not (math.isfinite(ratio) and math.isfinite(low) and math.isfinite(high)):
        return "undecided"
    if math.isfinite(p_adjusted) and p_adjusted < alpha and (low > 1 or high < 1):
        return "B worse" if ratio > 1 else "B better"
    if 1 - tolerance <= low and high <= 1 + tolerance:
        return "no detectable difference"
    return "undecided"


def _finite_or_none(x: float) -> float | None:
    return float(x) if x is not None and math.isfinite(x) else None


class Effect(StrictModel):
    """B against A on one figure: B/A of the raw values' first quartiles, and what the statistics say."""

    n_a: int
    n_b: int
    quantile: float = Field(QUANTILE, description="the quantile compared (location): 0.25 first quartile")
    location_a: float | None = Field(description="that quantile of A's values")
    location_b: float | None
    ratio: float | None = Field(description="location_b / location_a; < 1: B is faster")
    ci_low: float | None
    ci_high: float | None
    p_value: float | None = Field(description="two-sided Mann–Whitney U")
    p_adjusted: float | None = Field(description="Benjamini–Hochberg across the figures compared together")
    mde: float | None = Field(description="relative change detectable at alpha, 80% power; None: none is")
    verdict: Verdict

    @property
    def ci_excludes_one(self) -> bool:
        return self.ci_low is not None and self.ci_high is not None and (self.ci_low > 1 or self.ci_high < 1)


def compare_samples(
    a: Mapping[Key, Sequence[float]],
    b: Mapping[Key, Sequence[float]],
    *,
    alpha: float = 0.05,
    tolerance: float = 0.1,
    seed: int = 0,
    quantile: float = QUANTILE,
) -> dict[Key, Effect]:
    """The effect per key (a cell, or a configuration × load level × figure) of either side, sorted; the
    p-values corrected together; each key's bootstrap seeded with ``[seed, *key]``. A key without a finite
    value on one side is "only in" the other."""
    keys = sorted(set(a) | set(b))
    values = {k: (_finite(a.get(k, [])), _finite(b.get(k, []))) for k in keys}
    pvalues = [rank_pvalue(*values[k]) for k in keys]
    out = {}
    for key, p, p_adj in zip(keys, pvalues, correct_pvalues(pvalues, alpha), strict=True):
        xa, xb = values[key]
        loc_a, loc_b = location(xa, quantile), location(xb, quantile)
        ratio = loc_b / loc_a if loc_a > 0 else math.nan
        ci = bootstrap_ratio_ci(xa, xb, seed=[seed, *key], quantile=quantile)
        if not xb.size:
            why: Verdict = "only in A"
        elif not xa.size:
            why = "only in B"
        else:
            why = verdict(ratio, ci, p_adj, alpha, tolerance)
        out[key] = Effect(
            n_a=int(xa.size),
            n_b=int(xb.size),
            quantile=quantile,
            location_a=_finite_or_none(loc_a),
            location_b=_finite_or_none(loc_b),
            ratio=_finite_or_none(ratio),
            ci_low=_finite_or_none(ci[0]),
            ci_high=_finite_or_none(ci[1]),
            p_value=_finite_or_none(p),
            p_adjusted=_finite_or_none(p_adj),
            mde=_finite_or_none(min_detectable_effect(xa, xb, alpha)),
            verdict=why,
        )
    return out
