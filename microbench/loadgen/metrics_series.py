"""The engine's ``/metrics`` as a time series while a session runs, stored beside its trace.

``MetricsSampler`` scrapes ``{base_url}/metrics`` every ``interval_s`` (on the suite's one clock,
``perf_counter_ns``, as the trace's stamps) and keeps, per scrape, the quantities in ``QUANTITIES`` as the
engine's metric table names them (``engine_harness.metric_names``): gauges (requests running and waiting,
KV-cache use) and counters (preemptions, prompt and generation tokens). Only those families' lines are
parsed (``metrics.only_families``): the sampler shares its event loop with the dispatcher, and a full vLLM
page of histograms takes milliseconds to parse (8-14 ms for the sim's on this shared 2-core box; ≈2.8 ms
filtered). ``series_frame`` turns the samples
into rows ``t_ns`` (offset from the session start, like the trace) · ``quantity`` · ``value``; the trace
writer stores them as ``metrics.csv`` and names the file, interval and quantities in the header.

Derived figures read the stored series through two pure functions: ``time_average`` (a gauge's mean over
a window: 5.2's batch size) and ``increments`` (where a counter rose: 5.8's preemption events).
An engine without ``/metrics`` (a gateway) gives no series; the header says so.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

import numpy as np
import pandas as pd

from engine_harness.metric_names import METRIC_TABLES, MetricNames, served_table
from engine_harness.metrics import MetricsError, Snapshot, scrape
from microbench.client.session import engine_session

__all__ = [
    "DEFAULT_INTERVAL_S",
    "QUANTITIES",
    "SERIES_COLUMNS",
    "MetricsSampler",
    "increments",
    "series_frame",
    "series_header",
    "time_average",
]

DEFAULT_INTERVAL_S = 0.5
QUANTITIES = (
    "requests_running", "requests_waiting", "kv_cache_usage", "preemptions", "prompt_tokens",
    "generation_tokens",
)  # fmt: skip
SERIES_COLUMNS = ("t_ns", "quantity", "value")


@dataclass
class MetricsSampler:
    """``async with MetricsSampler(url, names) as s: ...``; ``s.samples`` holds (t_ns, quantity, value).

    ``names`` None: the table whose names the first scrape serves (an external engine). A scrape that
    fails is counted in ``failures`` and skipped; sampling never fails the session it watches.
    """

    base_url: str
    names: MetricNames | None = None
    interval_s: float = DEFAULT_INTERVAL_S
    samples: list[tuple[int, str, float]] = field(default_factory=list)
    failures: int = 0
    _task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> MetricsSampler:
        self._task = asyncio.create_task(self._loop())
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    def _keep(self, snap: Snapshot) -> None:
        if self.names is None:
            self.names = METRIC_TABLES[served_table(snap.names())]
        for quantity in QUANTITIES:
            value = snap.total(getattr(self.names, quantity))
            if value is not None:
                self.samples.append((snap.t_ns, quantity, value))

    async def _loop(self) -> None:
        async with engine_session() as http:
            while True:
                started = time.perf_counter()
                families = (
                    None if self.names is None else [n for q in QUANTITIES for n in getattr(self.names, q)]
                )  # the first scrape of an unknown engine reads everything to pick its table
                try:
                    snap = await scrape(http, self.base_url, max(self.interval_s, 1.0), families)
                    self._keep(snap)
                except MetricsError:
                    self.failures += 1
                await asyncio.sleep(max(self.interval_s - (time.perf_counter() - started), 0.0))


def series_frame(samples: list[tuple[int, str, float]], t0_ns: int) -> pd.DataFrame:
    """Rows ``t_ns`` (from the session start) · ``quantity`` · ``value``, in time order."""
    frame = pd.DataFrame(samples, columns=list(SERIES_COLUMNS))
    frame["t_ns"] = (frame["t_ns"] - t0_ns).astype("int64")
    return frame.sort_values("t_ns", kind="stable").reset_index(drop=True)


def series_header(sampler: MetricsSampler | None, frame: pd.DataFrame | None) -> dict[str, Any]:
    """What the trace header says about the series: its file, interval, quantities, or why there is none."""
    if sampler is None or frame is None:
        return {"file": None, "note": "no /metrics time series was sampled for this session"}
    if frame.empty:
        return {
            "file": None,
            "note": f"/metrics gave no sample of {', '.join(QUANTITIES)} ({sampler.failures} failed scrapes)",
        }
    return {
        "file": "metrics.csv",
        "interval_s": sampler.interval_s,
        "scrapes": int(frame["t_ns"].nunique()),
        "failed_scrapes": sampler.failures,
        "quantities": sorted(frame["quantity"].unique()),
        "clock": "t_ns: perf_counter_ns at each reply, offset from the session start (the trace's clock)",
    }


def _one(series: pd.DataFrame, quantity: str) -> tuple[np.ndarray, np.ndarray]:
    rows = series[series["quantity"] == quantity]
    return rows["t_ns"].to_numpy(dtype=float) / 1e9, rows["value"].to_numpy(dtype=float)


def time_average(series: pd.DataFrame, quantity: str, start_s: float, end_s: float) -> float | None:
    """Time-weighted mean of a gauge over [start_s, end_s) (s from the session start).

    Each sample holds until the next (a step function, the last sample before ``start_s`` opening the
    window); None when no sample falls before ``end_s`` or the window is empty.
    """
    t, v = _one(series, quantity)
    if end_s <= start_s or t.size == 0 or t[0] >= end_s:
        return None
    edges = np.clip(np.append(t, np.inf), start_s, end_s)
    weights = np.diff(edges)
    if weights.sum() <= 0:
        return None
    return float(np.dot(weights, v) / weights.sum())


def increments(series: pd.DataFrame, quantity: str) -> list[tuple[float, float, float]]:
    """Where a counter rose: (previous sample s, sample s, increase) for every rise between two samples."""
    t, v = _one(series, quantity)
    rises = np.flatnonzero(np.diff(v) > 0)
    return [(float(t[i]), float(t[i + 1]), float(v[i + 1] - v[i])) for i in rises]
