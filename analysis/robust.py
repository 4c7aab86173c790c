"""The one robust linear fit of the suite (Huber's M-estimator, statsmodels RLM) with every degenerate
outcome handled: the link fit (``analysis.transfer.fit``) and the step model (``analysis.models``) call it.

statsmodels' RLM divides by a robust scale (the MAD of the residuals). Data that a line fits exactly (a
connector's byte counter against its own transfer time, a constant series) drive that scale to zero or to
rounding noise, and then RLM returns arbitrary weights (exact points named outliers at weight ≈ 0.499),
``weights=None`` (statsmodels 0.15 on some machines) or raises ``ZeroDivisionError`` (two points). A
singular design is fitted silently with a warning. ``huber_fit`` decides those cases itself:

* too few points for the coefficients, non-finite values or a rank-deficient design → ``CannotFit`` with
  the reason, never a traceback;
* an exact fit (every residual of least squares within rounding of zero) → that fit, unit weights, a zero
  scale and zero-width intervals, said in ``note``;
* no usable robust scale (zero, or none from RLM): more than half of the points exactly on one line that
  determines every coefficient → the median-regression line through them (statsmodels QuantReg), those
  points at weight 1 and the rest at weight 0 (outliers); else least squares over every point (statsmodels
  OLS), all at weight 1, said in ``note`` (the other points are data, not outliers);
* otherwise RLM's own result.

``r_squared`` is the one R² of the suite (the step and seed models, the link fit, the battery's scaling
fits): centred, on the points given, NaN where it says nothing.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass

import numpy as np
import statsmodels.api as sm

__all__ = ["CannotFit", "RobustFit", "huber_fit", "r_squared"]

# A residual within this fraction of the largest |y| is rounding, not misfit (float64 carries ~1e-16).
_EXACT = 1e-9
# Median regression stops within about 1e-6 of the spread of y; points that close are candidates.
_NEAR = 1e-4


class CannotFit(ValueError):
    """The data cannot determine the model; ``str(err)`` is the reason, written for the record."""


@dataclass(frozen=True)
class RobustFit:
    """Coefficients, their 95 % intervals (k × 2), per-point weights (1: kept as is, < 0.5: an outlier),
    the residual scale, and a note when a degenerate case was decided here instead of by RLM."""

    params: np.ndarray
    conf_int: np.ndarray
    weights: np.ndarray
    scale: float
    fitted: np.ndarray
    note: str | None = None


def _exact(y: np.ndarray, x: np.ndarray, params: np.ndarray, note: str, weights: np.ndarray) -> RobustFit:
    return RobustFit(params, np.column_stack([params, params]), weights, 0.0, x @ params, note)


def _check(y: np.ndarray, x: np.ndarray) -> None:
    n, k = x.shape
    if n <= k:
        raise CannotFit(f"{n} points for {k} coefficients: at least {k + 1} are needed")
    if not (np.isfinite(y).all() and np.isfinite(x).all()):
        raise CannotFit("the data hold non-finite values (NaN or infinity)")
    rank = int(np.linalg.matrix_rank(x))
    if rank < k:
        raise CannotFit(
            f"singular design: {k} coefficients but only {rank} independent columns (the data do not vary "
            "along every term, e.g. one prefill length or one batch size only)"
        )


def huber_fit(y: np.ndarray, x: np.ndarray) -> RobustFit:
    """Huber M-estimate of ``y ≈ x @ params`` (``x`` holds every column, intercept included); raises
    ``CannotFit`` when the data cannot determine it."""
    y, x = np.asarray(y, float), np.asarray(x, float)
    if x.ndim == 1:
        x = x[:, None]
    _check(y, x)
    tol = _EXACT * max(float(np.abs(y).max()), 1e-300)
    ols = np.linalg.lstsq(x, y, rcond=None)[0]
    if np.abs(y - x @ ols).max() <= tol:
        return _exact(y, x, ols, "exact fit: every point on the line (zero residual scale)", np.ones_like(y))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # statsmodels' divide-by-zero chatter: the result is judged below
        try:
            res = sm.RLM(y, x, M=sm.robust.norms.HuberT()).fit()
            weights, scale = res.weights, float(res.scale)
        except (ZeroDivisionError, FloatingPointError, np.linalg.LinAlgError):
            weights, scale = None, 0.0
    usable = weights is not None and np.isfinite(weights).all() and np.isfinite(scale) and scale > tol
    if usable:
        params = np.asarray(res.params, float)
        return RobustFit(
            params, np.asarray(res.conf_int(0.05), float), np.asarray(weights, float), scale, x @ params
        )
    # The robust scale collapsed: most points lie exactly on one line. Median regression finds it
    # (to its iteration's precision), least squares through the points it names pins it exactly.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        median_line = np.asarray(sm.QuantReg(y, x).fit(q=0.5).params, float)
    near = np.abs(y - x @ median_line) <= _NEAR * max(float(np.ptp(y)), tol)
    params = np.linalg.lstsq(x[near], y[near], rcond=None)[0] if near.sum() > x.shape[1] else median_line
    on_line = np.abs(y - x @ params) <= tol
    if on_line.sum() * 2 <= y.size or np.linalg.matrix_rank(x[on_line]) < x.shape[1]:
        return _least_squares(y, x, int(on_line.sum()))
    return _exact(
        y,
        x,
        params,
        f"{int(on_line.sum())} of {y.size} points lie exactly on one line (zero robust scale); "
        f"the other {int((~on_line).sum())} are outliers",
        on_line.astype(float),
    )


def _least_squares(y: np.ndarray, x: np.ndarray, exact: int) -> RobustFit:
    """Least squares over every point, where the robust scale collapsed with no exact majority that
    determines every term: the other points are then not outliers but data (a sim's engine-clock steps: its
    prefill steps exactly on a line without a decode term, its decode steps off it by a context cost the
    candidate has not; or exactly half of the points on a line, the rest off it)."""
    res = sm.OLS(y, x).fit()
    params = np.asarray(res.params, float)
    note = (
        f"no robust scale (zero, or none from RLM) and {exact} of {y.size} points exactly on one line, "
        "too few to determine every term: least squares over every point"
    )
    ci = np.asarray(res.conf_int(0.05), float)
    return RobustFit(params, ci, np.ones_like(y), math.sqrt(float(res.scale)), x @ params, note)


def r_squared(y: np.ndarray, predicted: np.ndarray) -> float:
    """Centred R² = 1 − SS_res / SS_tot of predictions; NaN with fewer than two points or when ``y`` does
    not vary (no variance to explain: neither a good nor a bad fit)."""
    y, predicted = np.asarray(y, float), np.asarray(predicted, float)
    if y.size < 2:
        return math.nan
    ss_tot = float(((y - y.mean()) ** 2).sum())
    return 1.0 - float(((y - predicted) ** 2).sum()) / ss_tot if ss_tot > 0 else math.nan
