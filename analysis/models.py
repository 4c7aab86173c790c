"""Interference-cost models fitted to a run: seed 002's constant-penalty model and our step-time model.

* **Seed model** (``fit_seed_model``): ``total_interference = num_chunks × D × penalty(D, chunk)``, one
  constant penalty per ``(D, chunk)`` fitted by least squares through the origin.
* **Step model** (``fit_step_model``): a mixed step costs ``α + β_d·D + β_c·c + γ·c·ctx``, a decode step
  ``α + β_d·D``. Fitted with statsmodels on per-step data (``engine_steps_log``), falling back to per-window
  data (``prefill_duration_ms``) for records without a log. Step times scale with their size, so the fit
  is two-stage and weighted (``1 / fitted²``: relative errors count alike), and robust (Huber) by default.
  The interference it predicts is ``D × Σ_chunks (β_c·c + γ·c·ctx)``: what the mixed steps add over
  decode-only steps, paid by each of the D streams.

Both are judged on the same target, the measured ``aggregate_decode_delay_ms`` of every valid record
with D > 0 (``compare_models``), by R² and by leave-one-P-out prediction error.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
import statsmodels.api as sm
from statsmodels.stats.diagnostic import het_breuschpagan
from statsmodels.stats.stattools import durbin_watson, jarque_bera

from analysis.steps import REGRESSORS, schedule_injection, steps_frame, windows_frame
from microbench.results.records import RunRecord

__all__ = [
    "PARAM_NAMES",
    "SeedFit",
    "StepFit",
    "compare_models",
    "fit_seed_model",
    "fit_step_model",
    "interference_frame",
    "leave_one_p_out",
    "r_squared",
]

PARAM_NAMES = ["alpha_ms", "beta_d_ms", "beta_c_ms", "gamma_ns"]


def r_squared(y: np.ndarray, predicted: np.ndarray) -> float:
    """Centred R² = 1 − SS_res / SS_tot of predictions (NaN with fewer than two points or no variance)."""
    y, predicted = np.asarray(y, float), np.asarray(predicted, float)
    if y.size < 2:
        return math.nan
    ss_tot = float(((y - y.mean()) ** 2).sum())
    return 1.0 - float(((y - predicted) ** 2).sum()) / ss_tot if ss_tot > 0 else math.nan


@dataclass
class StepFit:
    """The fitted step model: parameters with 95% CIs, R² on the fitted rows, residual diagnostics."""

    params: dict[str, float]
    ci: dict[str, tuple[float, float]]
    r2: float
    n: int
    data: str
    diagnostics: dict[str, float]
    residuals: pd.DataFrame = field(repr=False)

    def step_ms(self, decode_tokens: float, chunk: float = 0.0, context: float = 0.0) -> float:
        p = self.params
        return (
            p["alpha_ms"]
            + p["beta_d_ms"] * decode_tokens
            + p["beta_c_ms"] * chunk
            + p["gamma_ns"] * 1e-6 * chunk * context
        )

    def prefill_ms(self, decode_batch: int, prefill_tokens: int, chunk_size: int) -> float:
        """Predicted duration of the injection's mixed steps."""
        return sum(
            self.step_ms(d, c, ctx)
            for d, c, ctx in schedule_injection(decode_batch, prefill_tokens, chunk_size)
        )

    def interference_ms(self, decode_batch: int, prefill_tokens: int, chunk_size: int) -> float:
        """Predicted aggregate decode delay: ``D × Σ (mixed − decode-only step)`` over the chunks."""
        extra = sum(
            self.step_ms(d, c, ctx) - self.step_ms(d)
            for d, c, ctx in schedule_injection(decode_batch, prefill_tokens, chunk_size)
        )
        return decode_batch * extra

    def coefficients(self) -> pd.DataFrame:
        """One row per parameter: estimate and 95% CI."""
        return pd.DataFrame(
            [{"parameter": k, "estimate": v, "ci_low": self.ci[k][0], "ci_high": self.ci[k][1]}
             for k, v in self.params.items()]
        )  # fmt: skip


def _design(records: list[RunRecord]) -> tuple[pd.DataFrame, str]:
    steps = steps_frame(records)
    windows = windows_frame(records, only_without_log=True)
    parts = [f for f in (steps, windows) if not f.empty]
    if not parts:
        raise ValueError("no valid record to fit the step model to (every point invalid, or none)")
    data = "+".join(name for name, f in (("steps", steps), ("windows", windows)) if not f.empty)
    return pd.concat(parts, ignore_index=True), data


def fit_step_model(records: list[RunRecord], robust: bool = True) -> StepFit:
    """Fit ``α + β_d·D + β_c·c + γ·c·ctx`` to the valid records' steps (or windows where unlogged).

    Rows are weighted by 1 / (first-stage prediction)², so relative errors count alike; ``robust``
    fits the weighted rows with Huber's M-estimator (statsmodels RLM) instead of least squares."""
    frame, data = _design(records)
    x = frame[REGRESSORS].to_numpy(float)
    y = frame["elapsed_ms"].to_numpy(float)
    if len(frame) < len(REGRESSORS) + 1:
        raise ValueError(f"{len(frame)} rows are too few to fit {len(REGRESSORS)} parameters")
    ols = sm.OLS(y, x, hasconst=False).fit()
    scale = np.clip(ols.fittedvalues, max(1e-6, float(np.median(np.abs(y))) * 1e-3), None)
    # Relative errors: divide each row by its first-stage prediction. Robust (Huber) by default: a step
    # that caught an OS or event-loop stall should not pull the coefficients.
    xs, ys = x / scale[:, None], y / scale
    if robust:
        result = sm.RLM(ys, xs, M=sm.robust.norms.HuberT()).fit()
    else:
        result = sm.OLS(ys, xs, hasconst=False).fit()
    ci = result.conf_int(0.05)
    params = {name: float(v) for name, v in zip(PARAM_NAMES, result.params, strict=True)}
    cis = {name: (float(lo), float(hi)) for name, (lo, hi) in zip(PARAM_NAMES, ci, strict=True)}
    predicted = x @ result.params
    wresid = ys - xs @ result.params
    _, jb_p, skew, kurtosis = jarque_bera(wresid)
    diagnostics = {
        "jarque_bera_p": float(jb_p),
        "skew": float(skew),
        "kurtosis": float(kurtosis),
        "durbin_watson": float(durbin_watson(wresid)),
        "max_abs_rel_residual": float(np.max(np.abs((y - predicted) / np.where(y == 0, 1, y)))),
        "median_abs_rel_residual": float(np.median(np.abs((y - predicted) / np.where(y == 0, 1, y)))),
    }
    try:
        diagnostics["breusch_pagan_p"] = float(het_breuschpagan(wresid, sm.add_constant(predicted))[1])
    except (ValueError, np.linalg.LinAlgError):
        diagnostics["breusch_pagan_p"] = math.nan
    residuals = frame.assign(predicted_ms=predicted, residual_ms=y - predicted)
    return StepFit(params, cis, r_squared(y, predicted), len(frame), data, diagnostics, residuals)


def interference_frame(records: list[RunRecord]) -> pd.DataFrame:
    """The comparison target: one row per valid record with D > 0, ``interference_ms`` = measured
    ``aggregate_decode_delay_ms`` (or ``D × total_interference_ms`` where the former is missing)."""
    rows = []
    for rec in records:
        cfg, der = rec.config, rec.derived
        if not rec.validity.valid or cfg.decode_batch_size == 0:
            continue
        y = der.aggregate_decode_delay_ms
        if y is None and der.total_interference_ms is not None:
            y = cfg.decode_batch_size * der.total_interference_ms
        if y is None:
            continue
        n = rec.interference.num_chunks_actual or rec.interference.num_chunks_expected
        rows.append(
            {
                "chunk_size": cfg.chunk_size,
                "decode_batch_size": cfg.decode_batch_size,
                "new_prefill_tokens": cfg.new_prefill_tokens,
                "repetition": cfg.repetition,
                "num_chunks": n,
                "interference_ms": float(y),
            }
        )
    cols = [
        "chunk_size",
        "decode_batch_size",
        "new_prefill_tokens",
        "repetition",
        "num_chunks",
        "interference_ms",
    ]
    return pd.DataFrame(rows, columns=cols)


@dataclass
class SeedFit:
    """Seed 002's model: ``num_chunks × D × penalty(D, chunk)``, one fitted penalty per (D, chunk)."""

    penalty_ms: dict[tuple[int, int], float]
    r2: float
    n: int

    def interference_ms(self, decode_batch: int, prefill_tokens: int, chunk_size: int) -> float:
        key = (decode_batch, chunk_size)
        if key not in self.penalty_ms:
            raise KeyError(f"no fitted penalty for D={decode_batch}, chunk={chunk_size}")
        n = len(schedule_injection(decode_batch, prefill_tokens, chunk_size))
        return n * decode_batch * self.penalty_ms[key]

    def penalties(self) -> pd.DataFrame:
        return pd.DataFrame(
            [
                {"decode_batch_size": d, "chunk_size": c, "penalty_ms": v}
                for (d, c), v in self.penalty_ms.items()
            ]
        )


def _seed_penalties(frame: pd.DataFrame) -> dict[tuple[int, int], float]:
    out = {}
    for (d, c), g in frame.groupby(["decode_batch_size", "chunk_size"]):
        x = (g["num_chunks"] * g["decode_batch_size"]).to_numpy(float)
        out[(int(d), int(c))] = float((x * g["interference_ms"]).sum() / (x * x).sum())
    return out


def _seed_predict(frame: pd.DataFrame, penalty: dict[tuple[int, int], float]) -> np.ndarray:
    keys = zip(frame["decode_batch_size"], frame["chunk_size"], strict=True)
    pen = np.array([penalty.get((int(d), int(c)), math.nan) for d, c in keys])
    return (frame["num_chunks"] * frame["decode_batch_size"]).to_numpy(float) * pen


def fit_seed_model(records: list[RunRecord]) -> SeedFit:
    """Least-squares constant penalty per (D, chunk) on the measured total interference."""
    frame = interference_frame(records)
    if frame.empty:
        raise ValueError("no valid record with D > 0 and a measured interference to fit the seed model to")
    penalty = _seed_penalties(frame)
    return SeedFit(penalty, r_squared(frame["interference_ms"], _seed_predict(frame, penalty)), len(frame))


def _step_predict(fit: StepFit, frame: pd.DataFrame) -> np.ndarray:
    cols = ["decode_batch_size", "new_prefill_tokens", "chunk_size"]
    return np.array([fit.interference_ms(int(d), int(p), int(c)) for d, p, c in frame[cols].to_numpy()])


def leave_one_p_out(records: list[RunRecord]) -> pd.DataFrame:
    """For each P: refit both models without it and predict its records' interference.

    Columns: ``new_prefill_tokens``, ``n``, ``seed_mape``, ``step_mape`` (median absolute percentage
    error of the predicted aggregate decode delay) and ``step_step_mape`` (of the held-out step times).
    """
    target = interference_frame(records)
    rows = []
    for p in sorted({r.config.new_prefill_tokens for r in records}):
        train = [r for r in records if r.config.new_prefill_tokens != p]
        test = [r for r in records if r.config.new_prefill_tokens == p]
        held = target[target["new_prefill_tokens"] == p]
        row: dict[str, Any] = {"new_prefill_tokens": p, "n": len(held)}
        try:
            step = fit_step_model(train)
        except ValueError:
            continue
        y = held["interference_ms"].to_numpy(float)
        denom = np.where(y == 0, math.nan, np.abs(y))
        seed_train = target[target["new_prefill_tokens"] != p]
        seed_pred = _seed_predict(held, _seed_penalties(seed_train)) if not seed_train.empty else y * math.nan
        row["seed_mape"] = float(np.nanmedian(np.abs(seed_pred - y) / denom) * 100) if len(y) else math.nan
        row["step_mape"] = (
            float(np.nanmedian(np.abs(_step_predict(step, held) - y) / denom) * 100) if len(y) else math.nan
        )
        steps = steps_frame(test)
        if not steps.empty:
            pred = steps[REGRESSORS].to_numpy(float) @ np.array([step.params[k] for k in PARAM_NAMES])
            row["step_step_mape"] = float(
                np.median(np.abs(pred - steps["elapsed_ms"]) / steps["elapsed_ms"]) * 100
            )
        else:
            row["step_step_mape"] = math.nan
        rows.append(row)
    return pd.DataFrame(rows, columns=["new_prefill_tokens", "n", "seed_mape", "step_mape", "step_step_mape"])


def compare_models(records: list[RunRecord], loo: pd.DataFrame | None = None) -> pd.DataFrame:
    """The two models on the same target (measured aggregate decode delay of every valid record, D > 0):
    parameters, R², leave-one-P-out median error, and whether R² clears seed 002's bar of 0.85."""
    target = interference_frame(records)
    if target.empty:
        raise ValueError("no valid record with D > 0 to compare the models on")
    seed = fit_seed_model(records)
    step = fit_step_model(records)
    loo = leave_one_p_out(records) if loo is None else loo
    y = target["interference_ms"].to_numpy(float)
    rows = [
        {
            "model": "seed: num_chunks × D × penalty(D, chunk)",
            "parameters": len(seed.penalty_ms),
            "r2": seed.r2,
            "loo_p_median_ape_pct": float(loo["seed_mape"].median()) if not loo.empty else math.nan,
        },
        {
            "model": "step: α + β_d·D + β_c·c + γ·c·ctx",
            "parameters": len(PARAM_NAMES),
            "r2": r_squared(y, _step_predict(step, target)),
            "loo_p_median_ape_pct": float(loo["step_mape"].median()) if not loo.empty else math.nan,
        },
    ]
    out = pd.DataFrame(rows)
    out["n"] = len(target)
    out["meets_r2_0_85"] = out["r2"] > 0.85
    return out
