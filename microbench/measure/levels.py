"""One load level of an open- or closed-loop test, summarised the same way for 5.2, 5.3, 5.5 and 5.10.

The measured window is the level's *nominal* issuing window (the open loop now ends at its deadline, not
at its last send, so a level's empty tail counts) without its ramp (``saturation.steady_state``: 10% or
two E2E times, whichever is longer). The request rate counts requests that *finished* inside that window;
the output token rate counts the tokens *delivered* inside it (``tokens_within``): a finished request's
whole output would count tokens made before the window and drop those of requests still running at its
end, and when requests finish in bursts (a batch that started together ends together) a window holds
one burst more or fewer: on the sim of ``test_battery_capacity_sim``, bursts of 4 every 0.17 s put a 1.6 s
window's figure 5% either side of the step model's capacity, and the battery's capacity (the highest
level) on the high side. Latency percentiles are over the successful requests sent inside the window.
Every level carries its offered rate (what was asked), its sent rate (what the Poisson draw delivered)
and its achieved rate.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
from pydantic import Field

from benchcore.schema import StrictModel
from microbench.loadgen.metrics_series import time_average
from microbench.measure.runs import StageWindow
from microbench.measure.saturation import SteadyState, steady_state
from microbench.measure.stats import Distribution, summarize
from microbench.measure.sustainable import LedgerEntry, tested_rate

__all__ = ["LevelRow", "ledger_entry", "level_row", "token_rate_ci", "tokens_within", "verdict_text"]


class LevelRow(StrictModel):
    """Measurements of one load level."""

    offered: float = Field(..., description="requests/s asked (open loop) or concurrency (closed loop)")
    loop: str = Field(default="open", description="open (Poisson rate) or closed (concurrency)")
    requests: int
    succeeded: int
    success_rate: float | None = Field(..., description="None: no request was sent")
    window_s: float | None = Field(default=None, description="measured window (s): nominal, less the ramp")
    sent_rps: float | None = Field(default=None, description="requests/s sent inside the window")
    backlog: int | None = Field(
        default=None,
        description="requests sent before the window and not finished by its start: with the window's sends, "
        "the most that can finish inside it (None: a report from before this field)",
    )
    output_tps: float = Field(..., description="output tokens/s delivered in the window (of successes)")
    output_tps_ci: float | None = Field(
        default=None,
        description="95% half-width: batch means over 5 equal parts of the window where each lasts two "
        "median E2E times or more, else the Poisson bound of the completions counted (conservative)",
    )
    input_tps: float
    request_rps: float = Field(..., description="achieved: completions/s inside the window")
    ttft: Distribution
    tpot: Distribution
    e2e: Distribution
    steady: SteadyState
    errors: list[str] = Field(default_factory=list, description="distinct error texts (first 5)")
    slo_met: bool | None = None
    mean_running: float | None = Field(
        default=None,
        description="requests the engine ran at once, averaged over the window (/metrics; None: no series)",
    )

    @property
    def sustainable(self) -> bool:
        """Not saturated, meeting its test's criteria where it has some, and (open loop) judged over a
        window of at least three E2E times: a shorter one cannot tell a ramp from growth."""
        judged = self.loop == "closed" or self.steady.conclusive
        return judged and not self.steady.saturated and self.slo_met is not False

    @property
    def tested_rps(self) -> float:
        """Open loop: the rate this level vouches for (``sustainable.tested_rate``), as its ledger entry's."""
        return tested_rate(self.offered, self.sent_rps)


def tokens_within(lat: pd.DataFrame, begin: float, end: float) -> np.ndarray:
    """Per request of ``lat``: its output tokens delivered inside [``begin``, ``end``) (s) — the first at
    send + TTFT, the other ``output_tokens − 1`` spread evenly up to its end (a stream's tokens come at
    its decode steps, whose length varies little within one request); 0 for a failed request."""
    out = lat["output_tokens"].to_numpy(dtype=float)
    first = (lat["send_s"] + lat["ttft_s"]).to_numpy(dtype=float)
    done = lat["done_s"].to_numpy(dtype=float)
    head = (first >= begin) & (first < end)
    span = done - first
    with np.errstate(invalid="ignore", divide="ignore"):
        share = np.clip(np.minimum(done, end) - np.maximum(first, begin), 0.0, None) / span
    share = np.where(span > 0, share, (done >= begin) & (done < end))
    tokens = head + np.maximum(out - 1, 0) * share
    return np.where(lat["ok"].to_numpy() & np.isfinite(tokens), tokens, 0.0)


_BATCHES, _T975 = 5, 2.776  # batch means: t(0.975) with 4 degrees of freedom


def token_rate_ci(lat: pd.DataFrame, begin: float, end: float) -> float | None:
    """95% half-width of the token rate over [``begin``, ``end``) by batch means: the rates of its 5 equal
    parts, t with 4 degrees of freedom; None where a part is shorter than two median E2E times (parts that
    close share their requests: their rates are correlated and the interval would be too narrow)."""
    e2e = lat.loc[lat["ok"], "e2e_s"].to_numpy(dtype=float)
    width = (end - begin) / _BATCHES
    if not e2e.size or not width >= 2 * float(np.nanmedian(e2e)):
        return None
    rates = [tokens_within(lat, b, b + width).sum() / width for b in begin + width * np.arange(_BATCHES)]
    return _T975 * float(np.std(rates, ddof=1)) / math.sqrt(_BATCHES)


def level_row(window: StageWindow, offered: float, loop: str = "open") -> LevelRow:
    """Summarise ``window`` (one stage) as a load level offered at ``offered``."""
    lat = window.latencies
    steady = steady_state(lat, window.start_s, window.issue_end_s, closed=loop == "closed")
    begin, end = window.issue_end_s - steady.window_s, window.issue_end_s
    done, send = lat["done_s"].to_numpy(), lat["send_s"].to_numpy()
    ok = lat["ok"].to_numpy()
    finished = ok & (done >= begin) & (done < end)
    span = max(steady.window_s, 1e-9)
    measured = lat[ok & (send >= begin)]
    if measured.empty:  # a level too short for a ramp-up cut: use everything that succeeded
        measured = lat[ok]
    errors = list(dict.fromkeys(str(e) for e in lat.loc[~ok, "error"]))[:5]
    out_tokens = lat["output_tokens"].to_numpy(dtype=float)[finished]
    n_done = int(finished.sum())
    per_request = float(np.nanmean(out_tokens)) if n_done else 0.0
    ci = token_rate_ci(lat, begin, end)
    return LevelRow(
        offered=offered,
        loop=loop,
        requests=len(lat),
        succeeded=int(ok.sum()),
        success_rate=float(ok.mean()) if len(lat) else None,
        window_s=span,
        sent_rps=float(np.sum((send >= begin) & (send < end))) / span,
        backlog=int(np.sum(send < begin) - np.sum(ok & (done < begin))),
        output_tps=float(tokens_within(lat, begin, end).sum()) / span,
        output_tps_ci=1.96 * math.sqrt(n_done) * per_request / span if ci is None else ci,
        input_tps=float(np.nansum(lat["input_tokens"].to_numpy(dtype=float)[finished])) / span,
        request_rps=n_done / span,
        ttft=summarize(measured["ttft_s"]),
        tpot=summarize(measured["tpot_s"]),
        e2e=summarize(measured["e2e_s"]),
        steady=steady,
        errors=errors,
        mean_running=None
        if window.metrics is None
        else time_average(window.metrics, "requests_running", begin, end),
    )


def verdict_text(row: LevelRow) -> str:
    """Why a level is not sustainable ('' when it is)."""
    reasons = list(row.steady.reasons)
    if row.slo_met is False:
        reasons.append("criteria not met")
    if row.loop == "open" and not row.steady.conclusive:
        reasons.append("window shorter than three E2E times: a ramp cannot be told from growth")
    return "; ".join(reasons)


def ledger_entry(test: str, label: str, row: LevelRow) -> LedgerEntry:
    """``row`` as the capacity ledger's entry (``sustainable.capacity_from`` reads these)."""
    why = verdict_text(row)
    return LedgerEntry(
        test=test,
        label=label,
        loop="closed" if row.loop == "closed" else "open",
        offered=row.offered,
        sent_rps=row.sent_rps,
        achieved_rps=row.request_rps,
        output_tps=row.output_tps,
        output_tps_ci=row.output_tps_ci,
        sustainable=row.sustainable,
        why=why,
    )
