"""Figures of a battery report (matplotlib object API, headless): the shared drawing helpers, and the
figure each test registered with itself (``register_test(..., figure=FigureSpec(plot, caption))``, in its
section module). A new test with a figure is one file; nothing here lists the tests.

Everything is drawn from the report's data, so a report read back from JSON draws the same figures.
"""

from __future__ import annotations

from typing import Any

from matplotlib.figure import Figure
from matplotlib.ticker import LogLocator, NullFormatter, ScalarFormatter

from microbench.battery.registry import TESTS
from microbench.battery.report import TestResult

__all__ = ["caption_for", "figures_for", "new_figure", "plain_log"]


def plain_log(ax: Any, axis: str = "x", base: int = 10) -> None:
    """Log scale with plain numbers on the major ticks (1-2-5 steps in base 10) and no minor labels."""
    target = ax.xaxis if axis == "x" else ax.yaxis
    (ax.set_xscale if axis == "x" else ax.set_yscale)("log", base=base)
    if base == 10:
        target.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
    target.set_major_formatter(ScalarFormatter())
    target.set_minor_formatter(NullFormatter())


def new_figure(panels: int = 1, width: float = 6.0) -> tuple[Figure, list[Any]]:
    fig = Figure(figsize=(width * panels, 4.0), layout="constrained")
    axes = fig.subplots(1, panels, squeeze=False)[0]
    for ax in axes:
        ax.grid(True, alpha=0.3)
    return fig, list(axes)


def figures_for(result: TestResult) -> list[tuple[str, Figure]]:
    """The figures of one test result (none for a test without data or without a figure)."""
    spec = TESTS.get(result.name).figure if result.name in TESTS else None
    if result.data is None or spec is None:
        return []
    return [(f"{result.name}.png", spec.plot(result.data))]


def caption_for(name: str) -> str:
    """The caption of a test's figure (its file is ``<name>.png``)."""
    spec = TESTS.get(name).figure if name in TESTS else None
    return spec.caption if spec is not None else f"Figure: {name}"
