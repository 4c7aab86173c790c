"""The transfer figure: stacked TTFT breakdown per P (disaggregated vs colocated) and the hand-off fit.

Left: one panel per P with two bars — disaggregated TTFT stacked as producer (prefill + 1 token), KV
transfer (the connector's own time, when it reports one), the rest of the hand-off (proxy gap, consumer
scheduling and first step) and the client↔proxy legs; colocated TTFT on one engine. Medians over the
valid repetitions, with the repetitions' min–max as a whisker on each bar's total. Right: the hand-off
against KV bytes with the fitted ``setup + bytes / bandwidth`` line. Object API only (headless-safe).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from microbench.transfer.fit import TransferFit

__all__ = ["breakdown_figure", "breakdown_table"]

_STACK = [
    ("producer_ms", "producer: prefill + 1 token", "#4C72B0"),
    ("kv_xfer_ms", "KV transfer (connector)", "#DD8452"),
    ("handoff_rest_ms", "rest of hand-off (proxy, consumer step)", "#55A868"),
    ("client_overhead_ms", "client ↔ proxy", "#8172B3"),
]


def breakdown_table(table: pd.DataFrame) -> pd.DataFrame:
    """Per P: median phases of the valid disaggregated points and the median colocated TTFT."""
    valid = table[table["valid"]].copy()
    dis = valid[valid["mode"] == "disaggregated"].copy()
    for col in ("consumer_kv_xfer_ms", "handoff_ms", "producer_ms", "client_overhead_ms", "total_ttft_ms"):
        dis[col] = pd.to_numeric(dis[col], errors="coerce") if col in dis else np.nan
    dis["kv_xfer_ms"] = dis["consumer_kv_xfer_ms"].fillna(0.0).clip(upper=dis["handoff_ms"])
    dis["handoff_rest_ms"] = dis["handoff_ms"] - dis["kv_xfer_ms"]
    cols = [
        "total_ttft_ms",
        "producer_ms",
        "handoff_ms",
        "kv_xfer_ms",
        "handoff_rest_ms",
        "client_overhead_ms",
    ]
    out = dis.groupby("prefill_tokens")[cols].median()
    out["disagg_min_ms"] = dis.groupby("prefill_tokens")["total_ttft_ms"].min()
    out["disagg_max_ms"] = dis.groupby("prefill_tokens")["total_ttft_ms"].max()
    out["n_disagg"] = dis.groupby("prefill_tokens").size()
    col = valid[valid["mode"] == "colocated"].groupby("prefill_tokens")["total_ttft_ms"]
    out = out.join(
        pd.DataFrame(
            {
                "colocated_ttft_ms": col.median(),
                "coloc_min_ms": col.min(),
                "coloc_max_ms": col.max(),
                "n_coloc": col.size(),
            }
        ),
        how="outer",
    )
    return out.sort_index()


def breakdown_figure(table: pd.DataFrame, fit: TransferFit | None = None, title: str = "") -> Figure:
    """The two panels described in the module docstring; ``table`` is ``records_frame``'s output."""
    agg = breakdown_table(table)
    if agg.empty:
        raise ValueError("no valid point to draw")
    n = len(agg)
    fig = Figure(figsize=(3.0 + 2.0 * n + 4.5, 4.8), layout="constrained")
    subs: Any = fig.subfigures(1, 2, width_ratios=[1.0 + 2.0 * n, 4.5])
    left, right = subs[0], subs[1]
    axes = left.subplots(1, n, squeeze=False)[0]
    for ax, (p, row) in zip(axes, agg.iterrows(), strict=True):
        bottom = 0.0
        for col, label, color in _STACK:
            value = float(row[col]) if col in row and pd.notna(row[col]) else 0.0
            ax.bar(0, value, 0.7, bottom=bottom, label=label, color=color)
            bottom += value
        ax.errorbar(
            0, row["total_ttft_ms"], yerr=_span(row, "total_ttft_ms", "disagg"), fmt="none", ecolor="k"
        )
        if pd.notna(row.get("colocated_ttft_ms")):
            ax.bar(1, row["colocated_ttft_ms"], 0.7, label="colocated TTFT (one engine)", color="#C44E52")
            ax.errorbar(
                1,
                row["colocated_ttft_ms"],
                yerr=_span(row, "colocated_ttft_ms", "coloc"),
                fmt="none",
                ecolor="k",
            )
        ax.set_xticks([0, 1], ["disagg.", "coloc."])
        ax.set_xlim(-0.6, 1.6)
        ax.set_title(f"P = {int(p)}", fontsize=10)
        ax.grid(True, axis="y", alpha=0.3)
    axes[0].set_ylabel("time to first token (ms, median of valid reps)")
    handles, labels = axes[-1].get_legend_handles_labels()
    left.legend(handles, labels, loc="outside lower center", ncol=3, fontsize=8)
    left.suptitle(title or "PD-disaggregation TTFT breakdown")
    ax2 = right.subplots()

    dis = table[(table["mode"] == "disaggregated") & table["valid"]].dropna(subset=["handoff_ms"])
    kv = fit.kv_bytes_per_token if fit is not None else None
    xs = dis["prefill_tokens"].to_numpy(float) * (kv or 1) / (2**20 if kv else 1)
    ax2.scatter(xs, dis["handoff_ms"], s=18, label="hand-off (measured)", color="#55A868")
    if "consumer_kv_xfer_ms" in dis and dis["consumer_kv_xfer_ms"].notna().any():
        ax2.scatter(
            xs, dis["consumer_kv_xfer_ms"], s=18, marker="x", label="KV transfer (connector)", color="#DD8452"
        )
    if fit is not None:
        grid = np.linspace(0, max(xs.max(), 1e-9) * 1.05, 50)
        r2 = "–" if fit.r2 is None else f"{fit.r2:.2f}"
        bw = "n/a" if fit.bandwidth_gbit_s is None else f"{fit.bandwidth_gbit_s:.3g} Gbit/s"
        ax2.plot(
            grid, fit.setup_ms + fit.ms_per_mib * grid, color="k", lw=1,
            label=f"fit: {fit.setup_ms:.1f} ms + bytes / {bw} (R² {r2})",
        )  # fmt: skip
    ax2.set_xlabel("KV bytes (MiB)" if kv else "prompt tokens P")
    ax2.set_ylabel("ms")
    ax2.set_ylim(bottom=0)
    ax2.grid(True, alpha=0.3)
    ax2.legend(fontsize=8)
    ax2.set_title("hand-off vs KV size")
    return fig


def _span(row: pd.Series, col: str, prefix: str) -> list[list[float]]:
    """Whisker from the repetitions' min to max around the median."""
    lo, hi = row.get(f"{prefix}_min_ms"), row.get(f"{prefix}_max_ms")
    if pd.isna(lo) or pd.isna(hi):
        return [[0.0], [0.0]]
    return [[max(float(row[col]) - float(lo), 0.0)], [max(float(hi) - float(row[col]), 0.0)]]
