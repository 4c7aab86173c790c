"""Per configuration of a characterization dataset: the latency–throughput curve, a latency fit monotone
in users, and the SLO capacity (the most users within the SLO), monotone in users as seed 001 requires.

The fit (``monotone_fit``) is ``scipy.optimize.isotonic_regression`` (pool-adjacent-violators), increasing
in users, weighted by each level's measured request count, on one latency column (e.g. ``itl_s_p90``);
between measured levels it is interpolated linearly (still monotone). Seed 001 imposes the same
constraint on its regressor: a level measured slower than the next is noise, and without the constraint
one slow level would cap the capacity below levels that met the SLO. Beside the in-sample R² every fit
reports its leave-one-level-out error (``FitSummary.loo_mape``). ``slo_capacity`` never extrapolates: a
configuration meeting the SLO at its largest measured level has capacity "≥ that level" (``censored``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from pydantic import Field
from scipy.optimize import isotonic_regression

from analysis.characterize.dataset import METRICS, PERCENTILES
from benchcore.schema import StrictModel

__all__ = [
    "Capacity",
    "FitSummary",
    "SloError",
    "capacities",
    "curve_figure",
    "latency_throughput",
    "monotone_fit",
    "parse_slo",
    "predict",
    "slo_capacity",
]

SLO_KEYS = {"ttft": "ttft_s", "nttft": "nttft_s_per_token", "itl": "itl_s", "e2e": "e2e_s"}
SLO_UNITS = {"ttft": 1e-3, "nttft": 1e-3, "itl": 1e-3, "e2e": 1e-3}  # the flag's values are in ms (per token)


class SloError(ValueError):
    """An SLO that cannot be read or applied; the message names the fix."""


def parse_slo(text: str) -> dict[str, float]:
    """``ttft=500,itl=50`` (ms; nTTFT in ms per input token) → ``{'ttft_s': 0.5, 'itl_s': 0.05}``."""
    out: dict[str, float] = {}
    for item in filter(None, (p.strip() for p in text.split(","))):
        key, sep, value = item.partition("=")
        if not sep or key.strip() not in SLO_KEYS:
            raise SloError(f"--slo {item!r}: want KEY=MS with KEY one of {', '.join(SLO_KEYS)}")
        try:
            limit = float(value)
        except ValueError:
            raise SloError(f"--slo {item!r}: {value!r} is not a number of milliseconds") from None
        if not limit > 0 or not math.isfinite(limit):
            raise SloError(f"--slo {item!r}: the limit must be a positive number of milliseconds")
        out[SLO_KEYS[key.strip()]] = limit * SLO_UNITS[key.strip()]
    if not out:
        raise SloError("--slo needs at least one limit, e.g. ttft=500,itl=50 (milliseconds)")
    return out


class FitSummary(StrictModel):
    """A monotone fit of one latency column against users, for one configuration."""

    column: str
    users: list[int]
    measured: list[float]
    fitted: list[float]
    r2: float | None = Field(..., description="in-sample; None with fewer than 3 levels or no spread")
    loo_mape: float | None = Field(
        ..., description="leave-one-level-out mean absolute % error (interior levels)"
    )


def _iso(users: np.ndarray, values: np.ndarray, weights: np.ndarray) -> np.ndarray:
    order = np.argsort(users)
    fitted = np.empty_like(values)
    fitted[order] = isotonic_regression(values[order], weights=weights[order], increasing=True).x
    return fitted


def monotone_fit(levels: pd.DataFrame, column: str) -> FitSummary:
    """The isotonic fit of ``column`` over ``levels`` (one configuration; rows with a value only)."""
    frame = levels[levels[column].notna()].sort_values("users")
    users = frame["users"].to_numpy(int)
    values = frame[column].to_numpy(float)
    weights = np.maximum(frame["succeeded"].to_numpy(float), 1.0)
    if len(np.unique(users)) != len(users):
        frame = frame.groupby("users", as_index=False).agg({column: "median", "succeeded": "sum"})
        users, values = frame["users"].to_numpy(int), frame[column].to_numpy(float)
        weights = np.maximum(frame["succeeded"].to_numpy(float), 1.0)
    fitted = _iso(users, values, weights) if len(users) else values
    r2 = None
    ss_tot = float(((values - values.mean()) ** 2).sum()) if len(values) >= 3 else 0.0
    if ss_tot > 0:
        r2 = 1.0 - float(((values - fitted) ** 2).sum()) / ss_tot
    errors = []
    for i in range(1, len(users) - 1):  # interior levels only: the ends would be extrapolations
        keep = np.arange(len(users)) != i
        loo = _iso(users[keep], values[keep], weights[keep])
        guess = float(np.interp(users[i], users[keep], loo))
        if values[i] > 0:
            errors.append(abs(guess - values[i]) / values[i])
    return FitSummary(
        column=column,
        users=users.tolist(),
        measured=values.tolist(),
        fitted=fitted.tolist(),
        r2=r2,
        loo_mape=float(np.mean(errors)) * 100 if errors else None,
    )


def predict(fit: FitSummary, users: float) -> float | None:
    """The fitted latency at ``users`` within the measured range (None outside it: no extrapolation)."""
    if not fit.users or users < fit.users[0] or users > fit.users[-1]:
        return None
    return float(np.interp(users, fit.users, fit.fitted))


class Capacity(StrictModel):
    """The SLO capacity of one configuration."""

    config: str
    users: int | None = Field(
        ..., description="most users within the SLO (None: not even the fewest measured)"
    )
    censored: bool = Field(..., description="the SLO held at the largest measured level: capacity ≥ users")
    max_measured: int
    min_measured: int
    limiting: str | None = Field(..., description="the SLO metric that binds first")
    fits: dict[str, FitSummary]


def slo_capacity(levels: pd.DataFrame, config: str, slo: Mapping[str, float], percentile: str) -> Capacity:
    """Most users (integer, within the measured range) whose fitted latencies all meet ``slo``.

    Monotone fits make the set of users meeting the SLO an interval from the fewest measured, so the
    capacity is the largest integer in it; it grows with the SLO and never shrinks with more data points
    that agree.
    """
    if percentile not in PERCENTILES:
        raise SloError(f"percentile {percentile!r}: one of {', '.join(PERCENTILES)}")
    fits = {m: monotone_fit(levels, f"{m}_{percentile}") for m in slo}
    lo = max(f.users[0] for f in fits.values() if f.users) if any(f.users for f in fits.values()) else 0
    hi = min(f.users[-1] for f in fits.values() if f.users) if lo else 0
    best: int | None = None
    limiting: str | None = None
    for u in range(lo, hi + 1) if lo else []:
        over = [m for m, f in fits.items() if (p := predict(f, u)) is not None and p > slo[m]]
        if over:
            limiting = over[0]
            break
        best = u
    return Capacity(
        config=config,
        users=best,
        censored=best is not None and best == hi,
        max_measured=hi,
        min_measured=lo,
        limiting=limiting,
        fits=fits,
    )


def capacities(table: pd.DataFrame, slo: Mapping[str, float], percentile: str = "p90") -> list[Capacity]:
    """``slo_capacity`` of every configuration in the table."""
    for column in slo:
        if column not in METRICS:
            raise SloError(f"SLO metric {column!r} is not in the dataset ({', '.join(METRICS)})")
    return [slo_capacity(g, str(c), slo, percentile) for c, g in table.groupby("config", sort=True)]


def latency_throughput(table: pd.DataFrame, percentile: str = "p50") -> pd.DataFrame:
    """The latency–throughput curve of every configuration: per users level, output tokens/s against
    TTFT, nTTFT, ITL and E2E at ``percentile`` (seed 001's Fig. 7), sorted by configuration and users."""
    columns = ["config", "model", "device", "users", "output_tps", "request_rps"] + [
        f"{m}_{percentile}" for m in METRICS
    ]
    return table[columns].sort_values(["config", "users"]).reset_index(drop=True)


def curve_figure(table: pd.DataFrame, percentile: str = "p50") -> Figure:
    """ITL and TTFT against output throughput, one line per configuration, users marked at each point."""
    curve = latency_throughput(table, percentile)
    fig = Figure(figsize=(10, 4), layout="constrained")
    axes = fig.subplots(1, 2)
    for ax, metric, label in ((axes[0], "ttft_s", "TTFT"), (axes[1], "itl_s", "ITL")):
        for config, g in curve.groupby("config", sort=True):
            ax.plot(g["output_tps"], g[f"{metric}_{percentile}"] * 1e3, marker="o", label=str(config))
            for _, r in g.iterrows():
                ax.annotate(
                    str(int(r["users"])),
                    (r["output_tps"], r[f"{metric}_{percentile}"] * 1e3),
                    fontsize=7,
                    xytext=(3, 3),
                    textcoords="offset points",
                )
        ax.set_xlabel("output throughput (tokens/s)")
        ax.set_ylabel(f"{label} {percentile} (ms)")
        ax.set_yscale("log")
        ax.grid(True, alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.suptitle("latency–throughput per configuration (numbers: concurrent users)")
    return fig
