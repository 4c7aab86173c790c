"""The transfer model ``t(P) = setup + P × kv_bytes_per_token / bandwidth``, fitted by OLS, as a link profile.

Two targets are fitted on the valid disaggregated records: ``handoff`` (producer's answer → first token
at the proxy: everything disaggregation adds after the prefill, what a request pays) and ``kv_xfer``
(the consumer's own transfer-time histogram, the connector's wire time alone, when it reports one).
``kv_bytes_per_token = 2 × layers × kv_heads × head_dim × dtype bytes`` comes from the served model's
``config.json`` and the engine's dtype (the same formula ``analysis.breakeven`` applies), and is
checked against the connector's bytes counter when it has one. The link profile written for the
break-even analysis (``analysis/links`` format: ``setup_latency_ms`` + ``bandwidth_gbit_s``) is the
``handoff`` fit; a slope that is not positive cannot give a bandwidth, and the profile then carries a
flat ``fixed_ms`` (the mean) instead, saying so.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Literal

import numpy as np
import pandas as pd
import statsmodels.api as sm
import yaml
from pydantic import Field

from benchcore.atomic import atomic_write_bytes
from benchcore.schema import StrictModel as Record

__all__ = ["TransferFit", "fit_transfer", "kv_bytes_per_token", "link_profile", "write_link"]

Target = Literal["handoff", "kv_xfer"]
_COLUMNS: dict[Target, str] = {"handoff": "handoff_ms", "kv_xfer": "consumer_kv_xfer_ms"}
_DTYPE_BYTES = {"float32": 4, "float": 4, "bfloat16": 2, "float16": 2, "half": 2, "fp8": 1}


def kv_bytes_per_token(model: str, dtype: str | None) -> int | None:
    """2 × layers × kv_heads × head_dim × dtype bytes of a local model folder (None: no config)."""
    cfg_path = Path(model) / "config.json"
    if not cfg_path.is_file():
        return None
    cfg = json.loads(cfg_path.read_text())
    heads = int(cfg["num_attention_heads"])
    kv_heads = int(cfg.get("num_key_value_heads") or heads)
    head_dim = int(cfg.get("head_dim") or int(cfg["hidden_size"]) // heads)
    name = str(dtype if dtype and dtype != "auto" else cfg.get("torch_dtype", "bfloat16"))
    return 2 * int(cfg["num_hidden_layers"]) * kv_heads * head_dim * _DTYPE_BYTES[name]


class TransferFit(Record):
    """One OLS fit of ``t_ms = setup_ms + bytes / bytes_per_ms`` with 95 % intervals."""

    target: Target
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
    r2: float | None
    residual_sd_ms: float
    mean_ms: float


def fit_transfer(table: pd.DataFrame, kv_per_token: int, target: Target = "handoff") -> TransferFit | None:
    """OLS of ``target`` on KV bytes over the valid disaggregated rows (None: fewer than 3 points or
    fewer than 2 distinct P)."""
    col = _COLUMNS[target]
    if table.empty or col not in table:
        return None
    rows = table[(table["mode"] == "disaggregated") & table["valid"]].dropna(subset=[col])
    if len(rows) < 3 or rows["prefill_tokens"].nunique() < 2:
        return None
    mib = rows["prefill_tokens"].to_numpy(float) * kv_per_token / 2**20
    y = rows[col].to_numpy(float)
    res = sm.OLS(y, sm.add_constant(mib)).fit()
    (setup, slope), ci = res.params, res.conf_int(0.05)
    bytes_measured = None
    if "consumer_kv_bytes" in rows and rows["consumer_kv_bytes"].notna().any():
        bytes_measured = float(
            np.nanmedian(rows["consumer_kv_bytes"].to_numpy(float) / rows["prefill_tokens"])
        )

    def gbit(ms_per_mib: float) -> float:
        return math.inf if ms_per_mib <= 0 else 2**20 * 8 / (ms_per_mib * 1e-3) / 1e9

    return TransferFit(
        target=target,
        n=len(rows),
        prefill_tokens=sorted(int(p) for p in rows["prefill_tokens"].unique()),
        kv_bytes_per_token=kv_per_token,
        kv_bytes_per_token_measured=bytes_measured,
        setup_ms=float(setup),
        setup_ci_ms=(float(ci[0][0]), float(ci[0][1])),
        ms_per_mib=float(slope),
        ms_per_mib_ci=(float(ci[1][0]), float(ci[1][1])),
        bandwidth_gbit_s=gbit(slope) if slope > 0 else None,
        bandwidth_ci_gbit_s=(gbit(ci[1][1]), gbit(ci[1][0])) if slope > 0 else None,
        r2=float(res.rsquared) if np.isfinite(res.rsquared) else None,
        residual_sd_ms=float(np.sqrt(res.scale)),
        mean_ms=float(y.mean()),
    )


def link_profile(fit: TransferFit, run_id: str, connector: str, notes: str = "") -> dict[str, Any]:
    """The fit as an ``analysis/links`` profile named ``measured-local``."""
    profile: dict[str, Any] = {
        "name": "measured-local",
        "description": (
            f"Measured KV hand-off ({fit.target}) between two engines on one host, connector {connector}: "
            f"OLS over P {fit.prefill_tokens}, n={fit.n}, "
            f"R²={fit.r2 if fit.r2 is None else round(fit.r2, 3)}. " + notes
        ).strip(),
        "placeholder": False,
        "source": f"python -m microbench.transfer, run {run_id}, fit.json",
    }
    if fit.ms_per_mib_ci[0] <= 0 < fit.ms_per_mib:
        lo = fit.bandwidth_ci_gbit_s[0] if fit.bandwidth_ci_gbit_s else math.nan
        profile["description"] += (
            f" The size term is not significant at 95 % (bandwidth CI {lo:.3g} Gbit/s … unbounded): the "
            "fixed cost dominates at these KV sizes; do not extrapolate the bandwidth to much larger KV."
        )
    if fit.bandwidth_gbit_s is not None and math.isfinite(fit.bandwidth_gbit_s):
        profile |= {
            "setup_latency_ms": round(max(fit.setup_ms, 0.0), 4),
            "bandwidth_gbit_s": round(fit.bandwidth_gbit_s, 4),
        }
    else:
        profile["fixed_ms"] = round(fit.mean_ms, 4)
        profile["description"] += " The slope was not positive: no bandwidth could be fitted; flat mean used."
    return profile


def write_link(path: Path, profile: dict[str, Any]) -> None:
    header = "# Written by python -m microbench.transfer (fit of the measured hand-off); see fit.json.\n"
    atomic_write_bytes(path, (header + yaml.safe_dump(profile, sort_keys=False, allow_unicode=True)).encode())
