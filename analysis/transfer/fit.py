"""The link model ``t(bytes) = setup + bytes / bandwidth``: a robust fit (statsmodels RLM, Huber's norm:
one stalled transfer does not tilt the line) with 95 % intervals, its R² and its leave-one-P-out error.

Targets, on the valid disaggregated records:

* ``kv_xfer`` — the link: the transfer-time histogram of the engine that ran the transfer (pull: the
  consumer, push: the producer; NIXL's ``nixl_xfer_time_seconds``: the KV blocks moved and nothing
  else). This one becomes the ``measured-local`` link profile.
* ``handoff`` — what a request pays after its prefill (producer's answer → first token at the proxy):
  the proxy gap, the transfer and the consumer's first step (which grows with context); reported as
  that, never as NIXL's bandwidth. It becomes the ``measured-local-handoff`` profile: the transfer cost
  an offload table must use when it decides per request (the whole hand-off, not the wire alone).

The size axis is the bytes the connector reports it moved (``nixl_bytes_transferred``) where every
row has them, else ``P × kv_bytes_per_token`` from the served model's ``config.json`` (said in
``x_source``). Every slope carries its 95 % interval; when the interval spans zero the size term is
not resolvable at these sizes: the fit says so (``resolvable``, ``verdict``) and the link profile is
a flat ``fixed_ms`` (the mean), not an extrapolated bandwidth.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Literal

import numpy as np
import pandas as pd
import statsmodels.api as sm
import yaml
from pydantic import Field

from analysis.robust import CannotFit, RobustFit, huber_fit, r_squared
from benchcore.atomic import atomic_write_bytes
from benchcore.schema import StrictModel as Record

__all__ = ["LINK_NAMES", "NoTransferFit", "TransferFit", "fit_transfer", "link_profile", "write_link"]

Target = Literal["handoff", "kv_xfer"]
_COLUMNS: dict[Target, str] = {"handoff": "handoff_ms", "kv_xfer": "kv_xfer_ms"}
# The link profile each fit becomes (``analysis/links/<name>.yaml``) and what its time is, in words.
LINK_NAMES: dict[Target, str] = {"kv_xfer": "measured-local", "handoff": "measured-local-handoff"}
_WHAT: dict[Target, str] = {
    "kv_xfer": "KV transfer (kv_xfer)",
    "handoff": "the whole hand-off a request pays (handoff: producer's answer → first token at the proxy: "
    "proxy gap, KV transfer, the consumer's first step; use with --mode bulk)",
}
_BYTES = "kv_bytes"  # records_frame: from the engine that ran the transfer
OUTLIER_WEIGHT = 0.5  # Huber weight below which a time is named an outlier (> 2.7 robust scales off)


class TransferFit(Record):
    """One robust fit of ``t_ms = setup_ms + bytes / bytes_per_ms`` with 95 % intervals."""

    target: Target
    x_source: str = Field(description="where the bytes axis comes from (connector counter or model config)")
    n: int = Field(ge=0)
    prefill_tokens: list[int]
    kv_bytes_per_token: int
    kv_bytes_per_token_measured: float | None = Field(description="connector bytes counter / P (median)")
    setup_ms: float
    setup_ci_ms: tuple[float, float]
    ms_per_mib: float = Field(description="slope: ms per MiB of KV")
    ms_per_mib_ci: tuple[float, float]
    bandwidth_gbit_s: float | None = Field(description="None when the slope is not positive")
    bandwidth_ci_gbit_s: tuple[float, float] | None = Field(
        description="from the slope's interval (inf: open)"
    )
    r2: float | None = Field(description="R² over the times the robust fit kept (not the outliers)")
    fit_note: str | None = Field(
        default=None, description="a degenerate case the robust fit decided (an exact fit, a zero scale)"
    )
    lopo_error_pct: float | None = Field(
        default=None,
        description="out-of-sample: median absolute % error of each P's times predicted by the fit "
        "without that P (None: fewer than 3 distinct P)",
    )
    residual_sd_ms: float = Field(description="the robust fit's residual scale")
    downweighted_ms: list[float] = Field(
        default_factory=list, description="times the robust fit gave a weight below 0.5 (stalls)"
    )
    mean_ms: float
    median_ms: float
    max_ms: float
    resolvable: bool = Field(description="the slope's 95 % interval lies above zero")
    verdict: str = Field(description="one sentence a reader can act on")


class NoTransferFit(Record):
    """No line for ``target``, and why (too few points, no bytes axis, or data that cannot determine it)."""

    target: Target
    reason: str


def _size_axis(rows: pd.DataFrame, kv_per_token: int | None) -> tuple[np.ndarray, str] | None:
    """KV bytes of each row: the connector's counter when every row has it, else P × bytes per token."""
    if _BYTES in rows and rows[_BYTES].notna().all() and (rows[_BYTES] > 0).all():
        return rows[_BYTES].to_numpy(float), "connector bytes counter (nixl_bytes_transferred)"
    if kv_per_token is None:
        return None
    return rows["prefill_tokens"].to_numpy(float) * kv_per_token, "P × kv_bytes_per_token of the model config"


def _gbit(ms_per_mib: float) -> float:
    return math.inf if ms_per_mib <= 0 else 2**20 * 8 / (ms_per_mib * 1e-3) / 1e9


def _verdict(
    target: Target, slope: float, ci: tuple[float, float], bw: float | None, y: np.ndarray, odd: np.ndarray
) -> str:
    what = "the link (connector's own transfer time)" if target == "kv_xfer" else "the hand-off"
    named = ", ".join(f"{v:.3g}" for v in sorted(odd))
    outliers = f"; {odd.size} of {y.size} times down-weighted as outliers ({named} ms)" if odd.size else ""
    if ci[0] > 0 and bw is not None:
        lo, hi = _gbit(ci[1]), _gbit(ci[0])
        return f"{what}: {bw:.3g} Gbit/s (95 % CI {lo:.3g}…{hi:.3g}){outliers}"
    return (
        f"{what}: the size term is not resolvable at these sizes (slope {slope:.3g} ms/MiB, 95 % CI "
        f"{ci[0]:.3g}…{ci[1]:.3g} spans zero): only the time itself is known, mean {y.mean():.3g} ms, "
        f"median {np.median(y):.3g} ms, max {y.max():.3g} ms{outliers}"
    )


def _robust_line(mib: np.ndarray, y: np.ndarray) -> RobustFit:
    return huber_fit(y, sm.add_constant(mib, has_constant="add"))


def _lopo(mib: np.ndarray, y: np.ndarray, prefill: np.ndarray) -> float | None:
    """Median absolute % error of each P's times, predicted by the line fitted without that P."""
    if len(np.unique(prefill)) < 3:
        return None  # two P left out in turn leave one: no line
    errors = []
    for p in np.unique(prefill):
        train, test = prefill != p, (prefill == p) & (y != 0)
        try:
            setup, slope = _robust_line(mib[train], y[train]).params
        except CannotFit:
            continue  # the other P cannot determine a line: this P is not predicted
        errors += list(np.abs(setup + slope * mib[test] - y[test]) / np.abs(y[test]) * 100)
    return float(np.median(errors)) if errors else None


def fit_transfer(
    table: pd.DataFrame, kv_per_token: int | None, target: Target = "handoff"
) -> TransferFit | NoTransferFit:
    """Robust fit of ``target`` on KV bytes over the valid disaggregated rows, or why there is none
    (fewer than 3 points, fewer than 2 distinct P, no bytes axis, data that cannot determine a line)."""
    col = _COLUMNS[target]
    if table.empty or col not in table:
        return NoTransferFit(target=target, reason=f"no {col} column in the table")
    rows = table[(table["mode"] == "disaggregated") & table["valid"].astype(bool)].dropna(subset=[col])
    if len(rows) < 3 or rows["prefill_tokens"].nunique() < 2:
        return NoTransferFit(
            target=target,
            reason=f"{len(rows)} valid disaggregated points over {rows['prefill_tokens'].nunique()} P: "
            "a line needs ≥ 3 points over ≥ 2 P",
        )
    axis = _size_axis(rows, kv_per_token)
    if axis is None:
        return NoTransferFit(
            target=target,
            reason="no bytes axis: neither the connector's byte counter nor a model config.json",
        )
    nbytes, x_source = axis
    mib = nbytes / 2**20
    y = rows[col].to_numpy(float)
    try:
        res = _robust_line(mib, y)
    except CannotFit as err:
        return NoTransferFit(target=target, reason=f"cannot fit: {err}")
    (setup, slope), ci = res.params, res.conf_int
    prefill = rows["prefill_tokens"].to_numpy(int)
    slope_ci = (float(ci[1][0]), float(ci[1][1]))
    per_token = nbytes / rows["prefill_tokens"].to_numpy(float)
    bw = _gbit(slope) if slope > 0 else None
    kept = res.weights >= OUTLIER_WEIGHT  # R² over the times the fit kept; the outliers are named apart
    r2 = r_squared(y[kept], res.fitted[kept])
    return TransferFit(
        target=target,
        x_source=x_source,
        n=len(rows),
        prefill_tokens=sorted(int(p) for p in rows["prefill_tokens"].unique()),
        kv_bytes_per_token=int(kv_per_token or round(float(np.median(per_token)))),
        kv_bytes_per_token_measured=float(np.median(per_token)) if x_source.startswith("connector") else None,
        setup_ms=float(setup),
        setup_ci_ms=(float(ci[0][0]), float(ci[0][1])),
        ms_per_mib=float(slope),
        ms_per_mib_ci=slope_ci,
        bandwidth_gbit_s=bw,
        bandwidth_ci_gbit_s=(_gbit(slope_ci[1]), _gbit(slope_ci[0])) if slope > 0 else None,
        r2=None if math.isnan(r2) else r2,
        fit_note=res.note,
        downweighted_ms=sorted(float(v) for v in y[res.weights < OUTLIER_WEIGHT]),
        lopo_error_pct=_lopo(mib, y, prefill),
        residual_sd_ms=float(res.scale),
        mean_ms=float(y.mean()),
        median_ms=float(np.median(y)),
        max_ms=float(y.max()),
        resolvable=slope_ci[0] > 0,
        verdict=_verdict(target, float(slope), slope_ci, bw, y, y[res.weights < OUTLIER_WEIGHT]),
    )


def link_profile(fit: TransferFit, run: str, connector: str, notes: str = "") -> dict[str, Any]:
    """The fit as an ``analysis/links`` profile named ``LINK_NAMES[fit.target]`` (``run``: the run folder,
    e.g. ``results/<run id>``): a bandwidth only where the slope is resolvable, else the flat mean."""
    r2 = "–" if fit.r2 is None else f"{fit.r2:.3f}"
    lopo = "–" if fit.lopo_error_pct is None else f"{fit.lopo_error_pct:.1f}%"
    profile: dict[str, Any] = {
        "name": LINK_NAMES[fit.target],
        "description": (
            f"{_WHAT[fit.target]} measured between two engines on one host, connector {connector}: "
            f"robust (Huber) fit over P {fit.prefill_tokens}, n={fit.n}, R²={r2}, leave-one-P-out error "
            f"{lopo}, bytes from the {fit.x_source}. "
            f"{fit.verdict[:1].upper()}{fit.verdict[1:]}. {notes}"
        ).strip(),
        "basis": "measured",
        "run": run,
        "source": f"python -m microbench.transfer, {run}/fit.json ({fit.target})",
    }
    if fit.resolvable and fit.bandwidth_gbit_s is not None and math.isfinite(fit.bandwidth_gbit_s):
        profile |= {
            "setup_latency_ms": round(max(fit.setup_ms, 0.0), 4),
            "setup_latency_ci_ms": [round(v, 4) for v in fit.setup_ci_ms],
            "bandwidth_gbit_s": round(fit.bandwidth_gbit_s, 4),
            "bandwidth_ci_gbit_s": [round(v, 4) for v in fit.bandwidth_ci_gbit_s or (math.nan, math.nan)],
        }
    else:
        profile["fixed_ms"] = round(fit.mean_ms, 4)
    return profile


def write_link(path: Path, profile: dict[str, Any]) -> None:
    header = "# Written by python -m microbench.transfer; see fit.json and the description.\n"
    atomic_write_bytes(path, (header + yaml.safe_dump(profile, sort_keys=False, allow_unicode=True)).encode())
