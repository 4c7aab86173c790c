"""What a run of load-generator stages gives the measurement rules, and the runner that produces it.

A job hands the rules here (``levels``, ``capacity``) a ``StageRunner``: an async callable that runs
``stages`` under a ``label`` against its engine (or ``base_url``), keeps whatever it keeps (the battery
writes a trace per label) and returns a ``Run``. ``run_of`` turns a finished load-generator session into
that ``Run``: the trace frame, per-request latencies and each stage's window.
"""

from __future__ import annotations

from collections.abc import Awaitable
from dataclasses import dataclass
from typing import Protocol

import pandas as pd

from microbench.loadgen.stages import SessionResult, Stage
from microbench.loadgen.trace import StageHealth, stage_health, trace_frame
from microbench.measure.stats import request_latencies

__all__ = ["Run", "StageRunner", "StageWindow", "run_of"]


@dataclass
class StageWindow:
    """One stage of a run: its requests' latencies and its issuing window (s from the session start)."""

    name: str
    latencies: pd.DataFrame
    start_s: float
    issue_end_s: float
    end_s: float
    metrics: pd.DataFrame | None = None  # the session's /metrics series (loadgen.metrics_series), same clock

    @property
    def output_tokens_per_s(self) -> float:
        """Output tokens of successful requests over the stage's wall time (start to drained)."""
        ok = self.latencies[self.latencies["ok"]]
        return float(ok["output_tokens"].fillna(0).sum()) / max(self.end_s - self.start_s, 1e-9)


@dataclass
class Run:
    """The records of one session: trace frame, latencies, stage windows, load-generator health."""

    frame: pd.DataFrame
    latencies: pd.DataFrame
    stages: dict[str, StageWindow]
    health: list[StageHealth]

    def stage(self, name: str) -> StageWindow:
        return self.stages[name]

    @property
    def generator_warnings(self) -> list[str]:
        return [h.warning for h in self.health if h.warning]


class StageRunner(Protocol):
    """Runs ``stages`` against the engine (or ``base_url``) as one session labelled ``label``."""

    def __call__(self, label: str, stages: list[Stage], base_url: str | None = None) -> Awaitable[Run]: ...


def run_of(result: SessionResult, metrics: pd.DataFrame | None = None) -> Run:
    """The ``Run`` of a finished session: its trace frame, latencies and one window per stage (each with
    the session's /metrics series, when one was sampled)."""
    frame = trace_frame(result)
    latencies = request_latencies(frame)
    windows = {}
    for outcome in result.stages:
        mask = (frame["stage"] == outcome.name).to_numpy()
        windows[outcome.name] = StageWindow(
            outcome.name,
            latencies[mask].reset_index(drop=True),
            (outcome.start_ns - result.t0_ns) / 1e9,
            (outcome.issue_end_ns - result.t0_ns) / 1e9,
            (outcome.end_ns - result.t0_ns) / 1e9,
            metrics,
        )
    return Run(frame, latencies, windows, stage_health(result, frame))
