"""The characterization's HTML page (``benchcore.pages``): the latency–throughput figure, the SLO capacity
and the monotone fits (R² beside leave-one-level-out error) per configuration, and every level."""

from __future__ import annotations

import io

import pandas as pd

from analysis.characterize.curves import Capacity, curve_figure, latency_throughput
from benchcore.pages import png_data_uri, render_page

__all__ = ["METHOD", "page_html"]

METHOD = (
    "Capacity: the most users whose latencies, fitted by isotonic regression in users (scipy, weighted "
    "by measured requests, interpolated linearly between measured levels), all meet the SLO; read only "
    "inside the measured users range ('+': the SLO held at the largest measured level, "
    "the capacity may be higher)."
)


def _ms(value: float | None) -> str:
    return "–" if value is None or pd.isna(value) else f"{value * 1e3:.3g}"


def page_html(table: pd.DataFrame, caps: list[Capacity], slo: str, percentile: str) -> str:
    buf = io.BytesIO()
    curve_figure(table, percentile).savefig(buf, format="png", dpi=110)
    curve = latency_throughput(table, percentile)
    metrics = [c for c in curve.columns if c.endswith(f"_{percentile}")]
    curve_rows = [
        [
            r["config"],
            r["device"],
            int(r["users"]),
            f"{r['output_tps']:.0f}",
            f"{r['request_rps']:.2f}",
            *(_ms(r[m]) for m in metrics),
        ]
        for _, r in curve.iterrows()
    ]
    fits = [(c.config, f) for c in caps for f in c.fits.values()]
    return render_page(
        "analysis",
        "characterize.html",
        title="Characterization",
        banner=None,
        method=METHOD,
        figure=png_data_uri(buf.getvalue()),
        slo=f"{slo}, {percentile}",
        cap_columns=["configuration", "users within the SLO", "largest measured", "binds first"],
        cap_rows=[
            [
                c.config,
                "none" if c.users is None else f"{c.users}{'+' if c.censored else ''}",
                c.max_measured,
                c.limiting or "–",
            ]
            for c in caps
        ],
        fit_columns=["configuration", "metric", "users", "R²", "LOO MAPE %"],
        fit_rows=[
            [
                cfg,
                f.column,
                ", ".join(map(str, f.users)),
                "–" if f.r2 is None else f"{f.r2:.3f}",
                "–" if f.loo_mape is None else f"{f.loo_mape:.1f}",
            ]
            for cfg, f in fits
        ],
        curve_columns=[
            "configuration",
            "device",
            "users",
            "output tok/s",
            "req/s",
            *(f"{m} (ms)" for m in metrics),
        ],
        curve_rows=curve_rows,
        curve_numeric=tuple(range(2, 5 + len(metrics))),
    )
