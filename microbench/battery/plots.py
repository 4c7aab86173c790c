"""Figures of a battery report (matplotlib object API, headless), one function per test that draws any.

``figures_for(result)`` returns ``(name, Figure)`` pairs for a test result: the TTFT CDF (5.1.5.4), the
throughput search (5.2), the throughput–latency curve with its knee and saturation points (5.3), ITL
histograms per load level (5.4), the capacity search (5.5) and the context-scaling fit (5.9).
Everything is drawn from the report's data, so a report read back from JSON draws the same figures.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
from matplotlib.figure import Figure
from matplotlib.ticker import LogLocator, NullFormatter, ScalarFormatter

from microbench.battery.report import TestData, TestResult
from microbench.battery.sections.capacity import CapacityData
from microbench.battery.sections.itl import ItlData
from microbench.battery.sections.long_context import LongContextData
from microbench.battery.sections.throughput import ThroughputData
from microbench.battery.sections.tradeoff import TradeoffData
from microbench.battery.sections.ttft import TtftData

__all__ = [
    "capacity_search",
    "context_scaling",
    "figures_for",
    "itl_histograms",
    "throughput_search",
    "tradeoff_curve",
    "ttft_cdf",
]


def _plain_log(ax: Any, axis: str = "x", base: int = 10) -> None:
    """Log scale with plain numbers on the major ticks (1-2-5 steps in base 10) and no minor labels."""
    target = ax.xaxis if axis == "x" else ax.yaxis
    (ax.set_xscale if axis == "x" else ax.set_yscale)("log", base=base)
    if base == 10:
        target.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
    target.set_major_formatter(ScalarFormatter())
    target.set_minor_formatter(NullFormatter())


def _figure(panels: int = 1, width: float = 6.0) -> tuple[Figure, list[Any]]:
    fig = Figure(figsize=(width * panels, 4.0), layout="constrained")
    axes = fig.subplots(1, panels, squeeze=False)[0]
    for ax in axes:
        ax.grid(True, alpha=0.3)
    return fig, list(axes)


def ttft_cdf(data: TtftData) -> Figure:
    fig, (ax,) = _figure()
    values = np.asarray(data.samples_s) * 1e3
    ax.step(values, np.arange(1, values.size + 1) / values.size, where="post", color="C0")
    for q, style in ((0.5, ":"), (0.99, "--")):
        if values.size:
            ax.axvline(np.percentile(values, q * 100), color="grey", ls=style, lw=1, label=f"P{q * 100:g}")
    ax.set(
        xlabel="TTFT (ms)",
        ylabel="fraction of requests",
        title=f"TTFT CDF ({data.workload}, {values.size} requests)",
    )
    if values.size and values.max() / max(values.min(), 1e-9) > 20:
        _plain_log(ax)
    ax.legend(loc="lower right")
    return fig


def throughput_search(data: ThroughputData) -> Figure:
    fig, (ax,) = _figure()
    for row in data.search.open_loop:
        ax.errorbar(
            row.offered,
            row.output_tps,
            yerr=row.output_tps_ci or 0,
            fmt="o",
            color="C2" if row.sustainable else "C3",
            zorder=3,
        )
    ax.scatter([], [], color="C2", label="sustainable")
    ax.scatter([], [], color="C3", label="saturated / SLO missed")
    if data.search.sustainable_rps is not None:
        ax.axvline(data.search.sustainable_rps, color="grey", ls="--", lw=1, label="max sustainable rate")
    ax.set(
        xlabel="offered load (req/s)", ylabel="output tokens/s (steady window)", title="5.2 throughput search"
    )
    ax.legend()
    return fig


def tradeoff_curve(data: TradeoffData) -> Figure:
    fig, (left, right) = _figure(2)
    offered = [r.offered for r in data.levels]
    left.plot(offered, [r.output_tps for r in data.levels], "o-", color="C0")
    left.set(xlabel="offered load (req/s)", ylabel="achieved output tokens/s", title="achieved vs offered")
    for x, label, color in (
        (data.knee_rps, "knee", "C1"),
        (data.saturation_rps, "saturation", "C3"),
        (data.optimal_rps, "optimal", "C2"),
    ):
        if x is not None:
            left.axvline(x, color=color, ls="--", lw=1, label=label)
    left.legend()
    tps = [r.output_tps for r in data.levels]
    for key, style in (("p50", "o-"), ("p99", "s--")):
        right.plot(
            tps,
            [getattr(r.ttft, key) * 1e3 if getattr(r.ttft, key) is not None else np.nan for r in data.levels],
            style,
            label=f"TTFT {key.upper()}",
        )
    right.axhline(data.ttft_slo_ms, color="grey", ls=":", lw=1, label=f"SLO {data.ttft_slo_ms:g} ms")
    right.set(
        xlabel="achieved output tokens/s", ylabel="TTFT (ms)", title="throughput–latency curve (load order)"
    )
    _plain_log(right, "y")
    right.legend()
    return fig


def itl_histograms(data: ItlData) -> Figure:
    fig, (ax,) = _figure()
    for lv in data.levels:
        if lv.histogram_counts:
            edges = np.asarray(lv.histogram_edges_s) * 1e3
            share = np.asarray(lv.histogram_counts) / max(sum(lv.histogram_counts), 1)
            ax.stairs(share, edges, label=f"{lv.load_fraction:.0%} load ({lv.gaps.count} gaps)")
    ax.set(xlabel="inter-chunk gap (ms)", ylabel="share of gaps", title="5.4 ITL distribution")
    _plain_log(ax)
    ax.legend()
    return fig


def capacity_search(data: CapacityData) -> Figure:
    fig, (ax,) = _figure()
    for row in data.levels:
        y = np.nan if row.ttft.p99 is None else row.ttft.p99 * 1e3
        ax.scatter(row.offered, y, color="C2" if row.slo_met else "C3", zorder=3)
    ax.axhline(data.ttft_p99_limit_ms, color="grey", ls=":", lw=1, label="TTFT P99 limit")
    ax.scatter([], [], color="C2", label="pass")
    ax.scatter([], [], color="C3", label="fail")
    ax.set(xlabel="concurrency", ylabel="TTFT P99 (ms)", title="5.5 capacity search")
    _plain_log(ax, base=2)
    ax.legend()
    return fig


def context_scaling(data: LongContextData) -> Figure:
    fig, (ax,) = _figure()
    for row in data.lengths:
        ax.scatter([row.length] * len(row.samples_s), np.asarray(row.samples_s) * 1e3, color="C0", alpha=0.6)
    if data.fit is not None and data.lengths:
        xs = np.geomspace(min(r.length for r in data.lengths), max(r.length for r in data.lengths), 50)
        f = data.fit
        ax.plot(
            xs,
            f.coefficient * xs**f.exponent * 1e3,
            "C1-",
            label=f"power law k={f.exponent:.2f} (R²={f.r2_power:.3f})",
        )
        ax.plot(
            xs,
            (f.intercept_s + f.slope_s_per_token * xs) * 1e3,
            "C2--",
            label=f"linear (R²={f.r2_linear:.3f})",
        )
        ax.legend()
    ax.set(
        xlabel="context length (tokens)",
        ylabel="TTFT (ms)",
        title="5.9 long context scaling",
    )
    _plain_log(ax)
    _plain_log(ax, "y")
    return fig


_PLOTTERS: dict[type[TestData], Callable[..., Figure]] = {
    TtftData: ttft_cdf,
    ThroughputData: throughput_search,
    TradeoffData: tradeoff_curve,
    ItlData: itl_histograms,
    CapacityData: capacity_search,
    LongContextData: context_scaling,
}


def figures_for(result: TestResult) -> list[tuple[str, Figure]]:
    """The figures of one test result (none for a test without data or without a figure)."""
    if result.data is None or type(result.data) not in _PLOTTERS:
        return []
    return [(f"{result.name}.png", _PLOTTERS[type(result.data)](result.data))]


CAPTIONS: dict[str, str] = {
    "ttft": "Figure 5.1: cumulative distribution of TTFT (ms) over every request of the test, "
    "with P50/P99 marks.",
    "throughput": "Figure 5.2: open-loop levels of the capacity search: achieved output tokens/s (± 95% "
    "Poisson half-width) against the offered rate (req/s); green sustainable, red saturated.",
    "tradeoff": "Figure 5.3: achieved output tokens/s and TTFT P99 (ms) against the offered rate (req/s), "
    "with the knee, saturation and optimal points.",
    "itl": "Figure 5.4: distribution of inter-chunk gaps (ms, log scale) per load level.",
    "capacity": "Figure 5.5: TTFT P99 (ms) per closed-loop concurrency, against the success criterion.",
    "long_context": "Figure 5.9: TTFT (ms) against context length (tokens), log-log, "
    "with the fitted power law.",
}


def caption_for(name: str) -> str:
    """The caption of a test's figure (its file is ``<name>.png``)."""
    return CAPTIONS.get(name, f"Figure: {name}")
