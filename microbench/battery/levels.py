"""One load level of an open- or closed-loop test, summarised the same way for 5.2, 5.3, 5.5 and 5.10.

The steady window is the level's issuing window without its first 10% (ramp-up, 5.2.3.2). Throughputs
count requests that *finished* inside that window; latency percentiles are over the successful requests
sent inside it. Saturation and steady-state checks come from ``stats.steady_state``.
"""

from __future__ import annotations

import numpy as np
from pydantic import Field

from benchcore.schema import StrictModel
from microbench.battery.context import StageWindow
from microbench.battery.stats import Distribution, SteadyState, steady_state, summarize

__all__ = ["LevelRow", "level_row"]


class LevelRow(StrictModel):
    """Measurements of one load level."""

    offered: float = Field(..., description="requests/s (open loop) or concurrency (closed loop)")
    requests: int
    succeeded: int
    success_rate: float
    output_tps: float = Field(..., description="output tokens/s finished in the steady window")
    input_tps: float
    request_rps: float
    ttft: Distribution
    tpot: Distribution
    e2e: Distribution
    steady: SteadyState
    errors: list[str] = Field(default_factory=list, description="distinct error texts (first 5)")
    slo_met: bool | None = None


def level_row(window: StageWindow, offered: float) -> LevelRow:
    """Summarise ``window`` (one stage) as a load level offered at ``offered``."""
    lat = window.latencies
    steady = steady_state(lat, window.start_s, window.issue_end_s)
    begin = window.start_s + 0.1 * (window.issue_end_s - window.start_s)
    done, send = lat["done_s"].to_numpy(), lat["send_s"].to_numpy()
    ok = lat["ok"].to_numpy()
    finished = ok & (done >= begin) & (done <= window.issue_end_s)
    span = max(window.issue_end_s - begin, 1e-9)
    measured = lat[ok & (send >= begin)]
    if measured.empty:  # a level too short for a ramp-up cut: use everything that succeeded
        measured = lat[ok]
    errors = list(dict.fromkeys(str(e) for e in lat.loc[~ok, "error"]))[:5]
    return LevelRow(
        offered=offered,
        requests=len(lat),
        succeeded=int(ok.sum()),
        success_rate=float(ok.mean()) if len(lat) else 0.0,
        output_tps=float(np.nansum(lat["output_tokens"].to_numpy()[finished])) / span,
        input_tps=float(np.nansum(lat["input_tokens"].to_numpy()[finished])) / span,
        request_rps=float(finished.sum()) / span,
        ttft=summarize(measured["ttft_s"]),
        tpot=summarize(measured["tpot_s"]),
        e2e=summarize(measured["e2e_s"]),
        steady=steady,
        errors=errors,
    )
