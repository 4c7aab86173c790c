"""The transfer figure: per-P TTFT breakdown with the uncontended baseline, and the link fit.

Left: one panel per P with up to three bars — disaggregated TTFT stacked as producer (prefill + 1
token), proxy gap, KV transfer (the connector's own time), consumer rest (its scheduling and first
decode step) and client ↔ proxy, taken from the median repetition so the stack adds up to the total
it stands for; colocated (the producer while its connector peer idles); alone (the same engine with no
connector and no peer). Whiskers: the repetitions' min–max; the contention factor colocated ÷ alone is
written over each panel. A connector that reports no transfer time leaves the consumer leg undivided
(hatched) and the footnote says so. Right: the connector's transfer time against the KV bytes it
moved, with the fitted ``setup + bytes / bandwidth`` line, and the hand-off beside it for contrast.
Object API only (headless-safe).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from analysis.transfer.breakdown import breakdown_table
from analysis.transfer.fit import TransferFit

__all__ = ["breakdown_figure"]

_STACK = [
    ("producer_ms", "producer: prefill + 1 token", "#4C72B0"),
    ("proxy_gap_ms", "proxy gap", "#937860"),
    ("kv_xfer_ms", "KV transfer (connector's own time)", "#DD8452"),
    ("consumer_rest_ms", "consumer rest: scheduling + first step", "#55A868"),
    ("client_overhead_ms", "client ↔ proxy", "#8172B3"),
]
_BARS = [
    ("colocated", "colocated (peer idling)", "#C44E52"),
    ("alone", "alone (no connector, no peer)", "#64B5CD"),
]


def _stack(ax: Axes, row: pd.Series) -> bool:
    """The disaggregated bar; True when the consumer leg had to stay undivided."""
    undivided = pd.isna(row.get("kv_xfer_ms"))
    bottom = 0.0
    for col, label, color in _STACK:
        if undivided and col == "kv_xfer_ms":
            continue
        value = row.get("consumer_ttft_ms") if undivided and col == "consumer_rest_ms" else row.get(col)
        if value is None or pd.isna(value):
            continue
        hatch, name = (
            ("//", "consumer leg, undivided (no transfer time reported)")
            if undivided and col == "consumer_rest_ms"
            else (None, label)
        )
        ax.bar(0, float(value), 0.7, bottom=bottom, label=name, color=color, hatch=hatch)
        bottom += float(value)
    ax.errorbar(0, row["total_ttft_ms"], yerr=_span(row, "disaggregated"), fmt="none", ecolor="k")
    return bool(undivided)


def _panel(ax: Axes, p: int, row: pd.Series) -> bool:
    undivided = _stack(ax, row) if pd.notna(row.get("total_ttft_ms")) else False
    for x, (mode, label, color) in enumerate(_BARS, start=1):
        if pd.notna(row.get(f"{mode}_ttft_ms")):
            ax.bar(x, row[f"{mode}_ttft_ms"], 0.7, label=label, color=color)
            ax.errorbar(x, row[f"{mode}_ttft_ms"], yerr=_span(row, mode), fmt="none", ecolor="k")
    factor = row.get("contention_factor")
    title = f"P = {int(p)}" + (f"\ncontention ×{factor:.2f}" if pd.notna(factor) else "\ncontention: n/a")
    ax.set_title(title, fontsize=9)
    ax.set_xticks([0, 1, 2], ["disagg.", "coloc.", "alone"], fontsize=8)
    ax.set_xlim(-0.6, 2.6)
    ax.grid(True, axis="y", alpha=0.3)
    return undivided


def _fit_panel(ax: Axes, table: pd.DataFrame, link: TransferFit | None) -> None:
    dis = table[(table["mode"] == "disaggregated") & table["valid"].astype(bool)]
    has_bytes = "kv_bytes" in dis and dis["kv_bytes"].notna().any()
    x = dis["kv_bytes"].to_numpy(float) / 2**20 if has_bytes else dis["prefill_tokens"].to_numpy(float)
    if "kv_xfer_ms" in dis and dis["kv_xfer_ms"].notna().any():
        ax.scatter(x, dis["kv_xfer_ms"], s=18, marker="x", color="#DD8452", label="KV transfer (connector)")
    ax.scatter(
        x, dis["handoff_ms"], s=12, color="#999999", label="hand-off (transfer + consumer step; not the link)"
    )
    if link is not None and has_bytes and len(x):
        grid = np.linspace(0, max(float(np.nanmax(x)), 1e-9) * 1.05, 50)
        line = link.setup_ms + link.ms_per_mib * grid if link.resolvable else np.full_like(grid, link.mean_ms)
        ax.plot(grid, line, color="k", lw=1, ls="-" if link.resolvable else "--", label=_fit_label(link))
    ax.set_xlabel("KV bytes moved (MiB, connector's counter)" if has_bytes else "prompt tokens P")
    ax.set_ylabel("ms")
    ax.set_ylim(bottom=0)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7)
    ax.set_title("the link: transfer time vs KV size", fontsize=10)


def _fit_label(fit: TransferFit) -> str:
    quality = (
        f"R² {'–' if fit.r2 is None else f'{fit.r2:.2f}'}, leave-one-P-out error "
        f"{'–' if fit.lopo_error_pct is None else f'{fit.lopo_error_pct:.0f}%'}"
    )
    if fit.resolvable and fit.bandwidth_ci_gbit_s is not None:
        lo, hi = fit.bandwidth_ci_gbit_s
        return (
            f"fit: {fit.setup_ms:.2f} ms + bytes / {fit.bandwidth_gbit_s:.3g} Gbit/s (CI {lo:.3g}…{hi:.3g}); "
            + quality
        )
    return f"fit: slope not resolvable at these sizes; mean {fit.mean_ms:.2f} ms; {quality}"


def breakdown_figure(
    table: pd.DataFrame, link: TransferFit | None = None, title: str = "", footnotes: list[str] | None = None
) -> Figure:
    """The two panels described in the module docstring; ``table`` is ``records_frame``'s output."""
    agg = breakdown_table(table)
    if agg.empty:
        raise ValueError("no valid point to draw")
    n = len(agg)
    notes = ["stacks: the median repetition's phases (they add up to its TTFT); whiskers: min–max"]
    notes += list(footnotes or [])
    fig = Figure(figsize=(3.0 + 2.2 * n + 5.0, 5.6 + 0.16 * len(notes)), layout="constrained")
    rows: Any = fig.subfigures(2, 1, height_ratios=[5.6, 0.3 + 0.16 * len(notes)])
    top, bottom = rows[0], rows[1]
    subs: Any = top.subfigures(1, 2, width_ratios=[1.0 + 2.2 * n, 5.0])
    axes = subs[0].subplots(1, n, squeeze=False)[0]
    undivided = [_panel(ax, int(p), row) for ax, (p, row) in zip(axes, agg.iterrows(), strict=True)]
    axes[0].set_ylabel("time to first token (ms)")
    seen: dict[str, Any] = {}
    for ax in axes:
        for h, lab in zip(*ax.get_legend_handles_labels(), strict=True):
            seen.setdefault(lab, h)
    subs[0].legend(list(seen.values()), list(seen), loc="outside lower center", ncol=3, fontsize=7)
    subs[0].suptitle(title or "PD-disaggregation TTFT breakdown")
    _fit_panel(subs[1].subplots(), table, link)
    if any(undivided):
        notes.append(
            "hatched: the connector reported no transfer time, so the consumer leg is not split (not 0)"
        )
    bottom.text(0.005, 0.98, "\n".join(notes), fontsize=7, ha="left", va="top")
    return fig


def _span(row: pd.Series, mode: str) -> list[list[float]]:
    """Whisker from the repetitions' min to max around the bar's value."""
    value = row["total_ttft_ms"] if mode == "disaggregated" else row[f"{mode}_ttft_ms"]
    lo, hi = row.get(f"{mode}_min_ms"), row.get(f"{mode}_max_ms")
    if pd.isna(lo) or pd.isna(hi) or pd.isna(value):
        return [[0.0], [0.0]]
    return [[max(float(value) - float(lo), 0.0)], [max(float(hi) - float(value), 0.0)]]
