"""TTFT against context length (5.9.4): a power law on log-log axes and a straight line, each with R².

``fit_scaling`` is pure; ``fit_verdict`` says whether the fit can carry a headline exponent (``FIT_RULE``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from pydantic import Field

from benchcore.schema import StrictModel

__all__ = ["FIT_RULE", "ScalingFit", "fit_scaling", "fit_verdict"]

FIT_RULE = "meaningful with ≥ 4 distinct lengths spanning ≥ 16× and power-law R² ≥ 0.9"


class ScalingFit(StrictModel):
    """TTFT ∝ length^k on log-log axes (k with its 95% CI), the linear fit, each with R², and a verdict."""

    exponent: float
    exponent_ci: tuple[float, float] | None = Field(default=None, description="95% CI (OLS, t)")
    coefficient: float = Field(..., description="c in TTFT = c · length^k (seconds)")
    r2_power: float
    intercept_s: float
    slope_s_per_token: float
    r2_linear: float
    best: str
    lengths: int = Field(default=0, description="distinct context lengths fitted")
    span: float = Field(default=0.0, description="longest / shortest length")
    meaningful: bool = False
    verdict: str = ""


def fit_verdict(lengths: int, span: float, r2: float) -> tuple[bool, str]:
    """Whether a scaling fit can support a headline exponent (``FIT_RULE``), and why not when it cannot."""
    reasons = []
    if lengths < 4:
        reasons.append(f"{lengths} distinct lengths (< 4)")
    if span < 16:
        reasons.append(f"lengths span {span:.0f}× (< 16×)")
    if not r2 >= 0.9:  # NaN (the times do not vary) says nothing either
        reasons.append(f"R² {r2:.2f} (< 0.9)")
    if reasons:
        return False, "not meaningful: " + ", ".join(reasons)
    return True, f"meaningful ({FIT_RULE})"


def _slope_ci(x: np.ndarray, y: np.ndarray) -> tuple[float, float] | None:
    if x.size < 3:
        return None
    import statsmodels.api as sm

    fit = sm.OLS(y, sm.add_constant(x)).fit()
    lo, hi = fit.conf_int(0.05)[1]
    return (float(lo), float(hi)) if math.isfinite(lo) and math.isfinite(hi) else None


def fit_scaling(lengths: Sequence[float], ttft_s: Sequence[float]) -> ScalingFit:
    """Least-squares fits of TTFT against context length: a power law (log-log) and a straight line."""
    x, y = np.asarray(lengths, dtype=float), np.asarray(ttft_s, dtype=float)
    keep = np.isfinite(x) & np.isfinite(y) & (x > 0) & (y > 0)
    x, y = x[keep], y[keep]
    if np.unique(x).size < 2:
        raise ValueError("the scaling fit needs at least two distinct context lengths")
    from analysis.robust import r_squared  # statsmodels with it: only when a fit is asked for

    k, log_c = np.polyfit(np.log(x), np.log(y), 1)
    r2_power = r_squared(np.log(y), k * np.log(x) + log_c)
    slope, intercept = np.polyfit(x, y, 1)
    r2_linear = r_squared(y, slope * x + intercept)
    distinct, span = int(np.unique(x).size), float(x.max() / x.min())
    meaningful, verdict = fit_verdict(distinct, span, r2_power)
    return ScalingFit(
        exponent=float(k),
        exponent_ci=_slope_ci(np.log(x), np.log(y)),
        coefficient=float(math.exp(log_c)),
        r2_power=r2_power,
        intercept_s=float(intercept),
        slope_s_per_token=float(slope),
        r2_linear=r2_linear,
        best="linear" if r2_linear >= r2_power else f"power law (k = {k:.2f})",
        lengths=distinct,
        span=span,
        meaningful=meaningful,
        verdict=verdict,
    )
