"""Interference-cost models fitted to a run: seed 002's constant-penalty model and our step-time model.

* **Seed model** (``fit_seed_model``): ``total_interference = num_chunks × D × penalty(D, chunk)`` with
  ``penalty(D, chunk)`` the median measured penalty of a *full-chunk* step (``Derived.tpot_penalty_ms``);
  where no step record exists, least squares through the origin on the measured delay.
* **Step model** (``fit_step_model``): the one step-time model (``engine_harness.step_model``, whose
  design columns the fit uses) fitted to every logged step, ``α + β_d·D + β_c·c +`` an attention term;
  the candidates (``analysis.steps.CANDIDATES``) are compared by leave-one-P-out error on
  the held-out steps and the best is chosen from the data (``selection``). A robust fit on relative
  errors (each row divided by its measured time; statsmodels RLM, Huber's norm, 95% CIs): an earlier
  two-stage fit weighted by first-stage predictions that a negative intercept drove to ~0 on real data,
  so 20 of 98 rows carried all the weight (R² 0.515 where OLS gives 0.989).
  The interference it predicts follows the run's scheduling (``step_model.chunk_schedule``): ``D × Σ``
  over the prefill steps of (mixed step − decode-only step), or of the whole step where the prefill runs
  instead of the decodes (SGLang's default, exclusive).

Both are judged on the same target, the measured ``aggregate_decode_delay_ms`` of every valid record
with D > 0 (``compare_models``), by R² and by leave-one-P-out error: in-sample R² alone is not a model's
quality.
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

from analysis.robust import RobustFit, huber_fit, r_squared
from analysis.steps import CANDIDATES, EAGER, PREFILL, graph_ceiling, offered, steps_frame, windows_frame
from engine_harness import step_model
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
    "step_model_candidates",
]

PARAM_NAMES = list(step_model.StepModel().coefficients())


@dataclass
class StepFit:
    """The fitted step model: its candidate, parameters with 95% CIs, R² and leave-one-P-out error."""

    model: str
    params: dict[str, float]
    ci: dict[str, tuple[float, float]]
    r2: float
    loo_step_mape: float
    n: int
    data: str
    diagnostics: dict[str, float]
    residuals: pd.DataFrame = field(repr=False)
    selection: pd.DataFrame = field(repr=False, default_factory=pd.DataFrame)
    columns: list[str] = field(default_factory=list)  # the design columns fitted (candidate's + κ, eager)
    cuda_graph_max_tokens: int = 0  # the engine's CUDA-graph ceiling: eager_ms applies above it

    def step_ms(self, shape: step_model.StepShape) -> float:
        """The fitted model's duration of one step (the fitted columns only)."""
        row = step_model.design_row(shape, self.cuda_graph_max_tokens)
        cols = self.columns or CANDIDATES[self.model]
        return sum(self.params[step_model.PARAMS[col]] * row[col] for col in cols)

    def prefill_ms(
        self,
        decode_batch: int,
        prefill_tokens: int,
        chunk_size: int,
        scheduling: step_model.Scheduling | None = "mixed",
    ) -> float:
        """Predicted duration of the injection's prefill steps."""
        return sum(
            self.step_ms(s)
            for s in step_model.chunk_schedule(prefill_tokens, chunk_size, decode_batch, scheduling)
        )

    def interference_ms(
        self,
        decode_batch: int,
        prefill_tokens: int,
        chunk_size: int,
        scheduling: step_model.Scheduling | None = "mixed",
    ) -> float:
        """Predicted aggregate decode delay: ``D × Σ`` the extra wait of each prefill step (mixed: the step
        less a decode-only step; exclusive: the whole step)."""
        sched = step_model.chunk_schedule(prefill_tokens, chunk_size, decode_batch, scheduling)
        return step_model.decode_delay_ms(self, sched, decode_batch, scheduling)

    def coefficients(self) -> pd.DataFrame:
        """One row per parameter: estimate and 95% CI."""
        return pd.DataFrame(
            [
                {"parameter": k, "estimate": v, "ci_low": self.ci[k][0], "ci_high": self.ci[k][1]}
                for k, v in self.params.items()
            ]
        )


def _design(records: list[RunRecord]) -> tuple[pd.DataFrame, str]:
    steps = steps_frame(records)
    windows = windows_frame(records, only_without_log=True)
    parts = [f for f in (steps, windows) if not f.empty]
    if not parts:
        raise ValueError("no valid record to fit the step model to (every point invalid, or none)")
    data = "+".join(name for name, f in (("steps", steps), ("windows", windows)) if not f.empty)
    return pd.concat(parts, ignore_index=True), data


def _ols(frame: pd.DataFrame, cols: list[str]) -> RobustFit:
    """A robust fit on relative errors: every row divided by its measured time, so a 2 ms decode step
    counts as much as a 300 ms mixed one (step noise is multiplicative), and Huber's M-estimator
    (statsmodels RLM) so that a step a host stall stretched does not pull the coefficients. The scale
    comes from the measurements, never from a first-stage fit, which a negative intercept can drive to 0."""
    y = np.maximum(np.abs(frame["elapsed_ms"].to_numpy(float)), 1e-3)
    x = frame[cols].to_numpy(float) / y[:, None]
    return huber_fit(np.ones_like(y), x)


def _mape(y: np.ndarray, pred: np.ndarray) -> float:
    ok = y != 0
    return float(np.median(np.abs(pred[ok] - y[ok]) / np.abs(y[ok])) * 100) if ok.any() else math.nan


def _loo_steps(frame: pd.DataFrame, cols: list[str]) -> float:
    """Median absolute % error of held-out rows, each P held out in turn."""
    errors = []
    for p in sorted(frame["new_prefill_tokens"].unique()):
        train, test = frame[frame["new_prefill_tokens"] != p], frame[frame["new_prefill_tokens"] == p]
        if len(train) <= len(cols) or np.linalg.matrix_rank(train[cols].to_numpy(float)) < len(cols):
            continue  # without this P the rest cannot determine every coefficient
        pred = test[cols].to_numpy(float) @ _ols(train, cols).params
        y = test["elapsed_ms"].to_numpy(float)
        errors += list(np.abs(pred - y) / np.where(y == 0, np.nan, np.abs(y)) * 100)
    return float(np.nanmedian(errors)) if errors else math.nan


def _columns(name: str, frame: pd.DataFrame) -> list[str]:
    """A candidate's columns, with the prefill-step term where decode-only rows stand beside prefill
    ones (without both, κ and α are one number) and the eager-step term where the steps lie on both
    sides of a CUDA-graph ceiling (a break in the step cost that CPU data never show)."""
    both_kinds = bool((frame[PREFILL] == 0).any() and (frame[PREFILL] > 0).any())
    return (
        CANDIDATES[name] + ([PREFILL] if both_kinds else []) + ([EAGER] if frame[EAGER].nunique() > 1 else [])
    )


def step_model_candidates(frame: pd.DataFrame, exclusive: bool = False) -> pd.DataFrame:
    """Every candidate's in-sample R² and leave-one-P-out median error on the steps (``exclusive``: the
    run's prefill steps ran instead of the decodes, which ``EXCLUSIVE_ONLY``'s candidates need; else they
    ride in them, which ``MIXED_ONLY``'s need), of those the data can tell apart (``steps.offered``)."""
    rows = []
    for name in offered(frame, exclusive):
        cols = _columns(name, frame)
        if len(frame) <= len(cols) or np.linalg.matrix_rank(frame[cols].to_numpy(float)) < len(cols):
            continue
        predicted = frame[cols].to_numpy(float) @ _ols(frame, cols).params
        r2 = r_squared(frame["elapsed_ms"].to_numpy(float), predicted)
        rows.append((name, len(cols), r2, _loo_steps(frame, cols)))
    return pd.DataFrame(rows, columns=["model", "parameters", "r2", "loo_p_median_ape_pct"])


def _diagnostics(y: np.ndarray, predicted: np.ndarray, resid: np.ndarray) -> dict[str, float]:
    _, jb_p, skew, kurtosis = jarque_bera(resid)
    rel = np.abs((y - predicted) / np.where(y == 0, 1, y))
    out = {
        "jarque_bera_p": float(jb_p),
        "skew": float(skew),
        "kurtosis": float(kurtosis),
        "durbin_watson": float(durbin_watson(resid)),
        "max_abs_rel_residual": float(rel.max()),
        "median_abs_rel_residual": float(np.median(rel)),
    }
    try:
        out["breusch_pagan_p"] = float(het_breuschpagan(resid, sm.add_constant(predicted))[1])
    except (ValueError, np.linalg.LinAlgError):
        out["breusch_pagan_p"] = math.nan
    return out


def fit_step_model(records: list[RunRecord], model: str | None = None) -> StepFit:
    """Fit the step model (``model``: a name of ``CANDIDATES``; None: the one with the lowest
    leave-one-P-out error; a simpler one wins when within 10% of it) by weighted least squares."""
    frame, data = _design(records)
    exclusive = bool(records) and all(r.config.scheduling == "exclusive" for r in records)
    selection = step_model_candidates(frame, exclusive)
    if selection.empty:
        raise ValueError(f"{len(frame)} rows are too few (or too alike) to fit the step model")
    if model is None:
        best = selection["loo_p_median_ape_pct"].min()
        ok = selection[selection["loo_p_median_ape_pct"] <= best * 1.1] if math.isfinite(best) else selection
        model = str(ok.sort_values(["parameters", "loo_p_median_ape_pct"]).iloc[0]["model"])
    if model not in set(selection["model"]):
        offered = ", ".join(map(repr, selection["model"]))
        raise ValueError(f"step-model candidate {model!r} is not one this run can fit (it can: {offered})")
    cols = _columns(model, frame)
    result = _ols(frame, cols)
    ci = result.conf_int
    params = {step_model.PARAMS[c]: float(v) for c, v in zip(cols, result.params, strict=True)}
    cis = {step_model.PARAMS[c]: (float(lo), float(hi)) for c, (lo, hi) in zip(cols, ci, strict=True)}
    y = frame["elapsed_ms"].to_numpy(float)
    predicted = frame[cols].to_numpy(float) @ result.params
    row = selection[selection["model"] == model].iloc[0]
    residuals = frame.assign(predicted_ms=predicted, residual_ms=y - predicted)
    loo = float(row["loo_p_median_ape_pct"])
    diagnostics = _diagnostics(y, predicted, y - predicted)
    ceiling = max((graph_ceiling(r) for r in records), default=0)
    return StepFit(
        model, params, cis, r_squared(y, predicted), loo, len(frame), data, diagnostics, residuals, selection,
        cols, ceiling,
    )  # fmt: skip


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
        n = der.num_chunks_used or rec.interference.num_chunks_actual or rec.interference.num_chunks_expected
        # a penalty of a full-chunk step (the seed model's penalty(D, chunk)); a prompt shorter than one
        # step's prompt budget has none
        budget = step_model.prefill_budget(cfg.chunk_size, cfg.decode_batch_size, cfg.scheduling)
        full_chunk = der.penalty_source == "engine_steps" and cfg.new_prefill_tokens >= budget
        rows.append(
            {
                "chunk_size": cfg.chunk_size,
                "decode_batch_size": cfg.decode_batch_size,
                "new_prefill_tokens": cfg.new_prefill_tokens,
                "repetition": cfg.repetition,
                "scheduling": cfg.scheduling,
                "num_chunks": n,
                "penalty_ms": der.tpot_penalty_ms if full_chunk else None,
                "interference_ms": float(y),
            }
        )
    cols = [
        "chunk_size",
        "decode_batch_size",
        "new_prefill_tokens",
        "repetition",
        "scheduling",
        "num_chunks",
        "penalty_ms",
        "interference_ms",
    ]
    return pd.DataFrame(rows, columns=cols)


@dataclass
class SeedFit:
    """Seed 002's model: ``num_chunks × D × penalty(D, chunk)``, one fitted penalty per (D, chunk)."""

    penalty_ms: dict[tuple[int, int], float]
    r2: float
    n: int

    def interference_ms(
        self,
        decode_batch: int,
        prefill_tokens: int,
        chunk_size: int,
        scheduling: step_model.Scheduling | None = "mixed",
    ) -> float:
        key = (decode_batch, chunk_size)
        if key not in self.penalty_ms:
            raise KeyError(f"no fitted penalty for D={decode_batch}, chunk={chunk_size}")
        n = step_model.num_prefill_steps(prefill_tokens, chunk_size, decode_batch, scheduling)
        return n * decode_batch * self.penalty_ms[key]


def _seed_penalties(frame: pd.DataFrame) -> dict[tuple[int, int], float]:
    """penalty(D, chunk): the median measured full-chunk penalty; least squares through the origin on
    the measured delay where no record has one (no step record)."""
    out = {}
    for (d, c), g in frame.groupby(["decode_batch_size", "chunk_size"]):
        measured = g["penalty_ms"].dropna()
        if not measured.empty:
            out[(int(d), int(c))] = float(measured.median())
            continue
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
    cols = ["decode_batch_size", "new_prefill_tokens", "chunk_size", "scheduling"]
    return np.array([fit.interference_ms(int(d), int(p), int(c), s) for d, p, c, s in frame[cols].to_numpy()])


def leave_one_p_out(records: list[RunRecord], model: str | None = None) -> pd.DataFrame:
    """For each P: refit both models without it and predict its records' interference.

    Columns: ``new_prefill_tokens``, ``n``, ``seed_mape``, ``step_mape`` (median absolute percentage
    error of the predicted aggregate decode delay) and ``step_step_mape`` (of the held-out step times).
    """
    target = interference_frame(records)
    model = model or fit_step_model(records).model
    rows = []
    for p in sorted({r.config.new_prefill_tokens for r in records}):
        train = [r for r in records if r.config.new_prefill_tokens != p]
        test = [r for r in records if r.config.new_prefill_tokens == p]
        held = target[target["new_prefill_tokens"] == p]
        row: dict[str, Any] = {"new_prefill_tokens": p, "n": len(held)}
        try:
            step = fit_step_model(train, model)
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
            cols = step.columns
            pred = steps[cols].to_numpy(float) @ np.array([step.params[step_model.PARAMS[c]] for c in cols])
            row["step_step_mape"] = _mape(steps["elapsed_ms"].to_numpy(float), pred)
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
            "model": f"step: α + β_d·D + β_c·c + γ·{step.model}",
            "parameters": len(step.params),
            "r2": r_squared(y, _step_predict(step, target)),
            "loo_p_median_ape_pct": float(loo["step_mape"].median()) if not loo.empty else math.nan,
        },
    ]
    out = pd.DataFrame(rows)
    out["n"] = len(target)
    out["meets_r2_0_85"] = out["r2"] > 0.85
    return out
