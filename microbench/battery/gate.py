"""The report's consistency gate: figures that contradict each other are a bug, shown loudly.

``check_report(report)`` (pure) returns one line per contradiction; the renderers print them in a banner
above everything else and never swap a figure for a "better" one. Checked:

* no level judged sustainable reports more output throughput than the battery's Max (the ledger's), and
  no level at all more than the peak; the Max is not above the peak; 5.3's optimal point is not above
  the Max;
* no open-loop level sends more requests in its window than were offered, beyond 3 standard deviations
  of the offered Poisson count (the bias of a window that dropped its empty tail shows up here), nor
  completes more in it than could finish there: the requests waiting at its start plus those sent in it
  (completions are not held to the window's arrivals: a backlog from a burst or a stall drains in it);
* every distribution's percentiles are in order (min ≤ P50 ≤ P90 ≤ P95 ≤ P99 ≤ P99.9 ≤ max).

5.10 measures other configurations than the battery's engine; its throughputs are not held to the Max.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator
from typing import Any

from pydantic import BaseModel

from microbench.battery.report import BatteryReport
from microbench.measure.levels import LevelRow
from microbench.measure.stats import Distribution

__all__ = ["check_report", "distribution_order", "walk"]

_ORDER = ("min", "p50", "p90", "p95", "p99", "p999", "max")
_EPS = 1e-9
_OTHER_SUT = {"guardrail"}


def walk(obj: Any, path: str = "") -> Iterator[tuple[str, Any]]:
    """Every pydantic model inside ``obj`` (itself included), with a dotted path."""
    if isinstance(obj, BaseModel):
        yield path, obj
        for name in type(obj).model_fields:
            yield from walk(getattr(obj, name), f"{path}.{name}" if path else name)
    elif isinstance(obj, list | tuple):
        for i, item in enumerate(obj):
            yield from walk(item, f"{path}[{i}]")
    elif isinstance(obj, dict):
        for key, item in obj.items():
            yield from walk(item, f"{path}[{key}]")


def distribution_order(d: Distribution) -> str | None:
    """None when the percentiles are in order, else which pair is not."""
    values = [(n, getattr(d, n)) for n in _ORDER if getattr(d, n) is not None]
    for (a, x), (b, y) in itertools.pairwise(values):
        if x > y + _EPS * max(1.0, abs(y)):
            return f"{a} {x:.6g} > {b} {y:.6g}"
    return None


def _level_problems(where: str, row: LevelRow, max_tps: float | None, peak: float | None) -> list[str]:
    out = []
    if max_tps is not None and row.sustainable and row.output_tps > max_tps * (1 + _EPS):
        out.append(
            f"{where}: a sustainable level reports {row.output_tps:.1f} tok/s, "
            f"above the Max {max_tps:.1f} tok/s"
        )
    elif peak is not None and row.output_tps > peak * (1 + _EPS):
        out.append(f"{where}: a level reports {row.output_tps:.1f} tok/s, above the peak {peak:.1f} tok/s")
    if row.loop == "open" and row.window_s:
        out += _open_counts(where, row, row.window_s)
    return out


def _open_counts(where: str, row: LevelRow, window_s: float) -> list[str]:
    """Completions in a window are bounded by what could finish in it (the backlog at its start plus its
    sends), not by its arrivals: a backlog from a burst or a stall drains inside it. Arrivals in a window
    are Poisson whatever came before, so they alone are held to the offered rate."""
    out = []
    sent = round((row.sent_rps or 0.0) * window_s)
    expected = row.offered * window_s
    limit = expected + 3 * math.sqrt(max(expected, 1.0)) + 1
    if sent > limit:
        out.append(
            f"{where}: {sent} requests sent in {window_s:.2f} s where {row.offered:.2f} req/s "
            f"were offered ({limit:.0f} at most, 3σ)"
        )
    done = round(row.request_rps * window_s)
    if row.backlog is not None and done > row.backlog + sent:
        out.append(
            f"{where}: {done} completions in {window_s:.2f} s, more than could finish in it "
            f"({row.backlog} waiting at its start + {sent} sent in it)"
        )
    return out


def check_report(report: BatteryReport) -> list[str]:
    """Every contradiction between the report's figures (empty: the gate passes)."""
    cap = report.capacity
    max_tps = None if cap is None else cap.max_output_tps
    peak = None if cap is None else cap.peak_output_tps
    problems: list[str] = []
    if max_tps is not None and peak is not None and max_tps > peak * (1 + _EPS):
        problems.append(f"Max {max_tps:.1f} tok/s is above the peak {peak:.1f}")
    for test in report.tests:
        if test.data is None:
            continue
        for path, obj in walk(test.data):
            where = f"{test.section} {path}"
            if isinstance(obj, Distribution) and (bad := distribution_order(obj)):
                problems.append(f"{where}: percentiles out of order ({bad})")
            if isinstance(obj, LevelRow) and test.name not in _OTHER_SUT:
                problems += _level_problems(where, obj, max_tps, peak)
        optimal = getattr(test.data, "throughput_within_slo", None)
        if max_tps is not None and optimal is not None and optimal > max_tps * (1 + _EPS):
            problems.append(
                f"{test.section}: throughput at the optimal point {optimal:.1f} tok/s is above the Max "
                f"{max_tps:.1f} tok/s"
            )
    return problems
