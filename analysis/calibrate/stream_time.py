"""The API server's time per streamed token: what the client's decode gap holds beyond the engine's step.

A decode stream's token gap at the client is one engine cycle: the step the engine times (its step log,
which the step model is fitted to) plus what the engine's timer leaves out, chiefly the API server's work
on the step's outputs (detokenizing, serializing one SSE event per stream) and the hand-off between them.
Per valid sweep record with decodes running, the run folder stores both sides of the same moment: the
client's median gap right before the injection (``local_baseline.tpot_p50_ms``) and the engine's median
decode-only step right before the first prefill step (``interference.decode_step_ms``). Their difference,
``excess_ms``, is fitted as ``fixed_ms + per_token_ms × D`` (``D`` streamed tokens per decode step) by the
suite's robust fit (``analysis.robust.huber_fit``: one record whose engine median caught a prefill or an
idle gap must not tilt the line) with both terms ≥ 0 (a step cannot stream in negative time: a negative
term is dropped and the other refitted alone, not clipped after the fit, which would keep a slope that
only compensated the negative intercept); with one decode batch size only, the slope cannot be told apart
and ``per_token_ms`` is 0 (said so). A term whose 95% CI holds 0 is dropped the same way (said in
``note``): the replay adds the time to every step, so over a busy period of hundreds of steps a term that
only noise made positive moves every later step boundary (the sim as reality, whose true stream time is 0:
a slope of 0.0086 [-0.002, 0.019] ms per token set its 450-step grid 16 ms late, and 8 of 36 requests
joined a step off). An engine whose step timer already spans the whole loop (SGLang: the interval between
its step lines) fits ≈ 0. The replay adds ``fixed_ms + per_token_ms × (tokens the step streams)`` to every
step it prices.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from analysis.robust import huber_fit
from microbench.results.records import RunRecord

__all__ = ["KeptTerms", "StreamTimeFit", "fit_stream_time", "kept_terms", "stream_time_rows"]


@dataclass(frozen=True)
class StreamTimeFit:
    """``excess_ms = fixed_ms + per_token_ms × D`` per decode step, with 95% CIs."""

    fixed_ms: float
    fixed_ci_ms: tuple[float, float]
    per_token_ms: float
    per_token_ci_ms: tuple[float, float] | None  # None: one decode batch size, no slope fitted
    n: int
    batch_sizes: tuple[int, ...]
    note: str = ""  # the terms dropped (negative, or a CI holding 0), with their estimates

    def text(self) -> str:
        """One line for the settings list: both terms with their intervals, the data and what was dropped."""
        ci = self.per_token_ci_ms
        slope = (
            f"{self.per_token_ms:.3g} [{ci[0]:.3g}, {ci[1]:.3g}] ms"
            if ci
            else "0 (one decode batch size: no slope)"
            if len(self.batch_sizes) < 2
            else "0"
        )
        low, high = self.fixed_ci_ms
        return (
            f"stream time per step: {self.fixed_ms:.3g} [{low:.3g}, {high:.3g}] ms + {slope} per streamed "
            f"token (client gap − engine step, robust fit, a term kept where its 95% CI is above 0, "
            f"n={self.n}, D={list(self.batch_sizes)})" + (f"; {self.note}" if self.note else "")
        )


def stream_time_rows(records: list[RunRecord]) -> pd.DataFrame:
    """One row per valid record with decodes and both medians: ``D``, ``client_gap_ms`` (the local
    baseline's median gap), ``engine_step_ms`` (the engine's median decode step) and their difference
    ``excess_ms``."""
    rows = [
        {
            "D": r.config.decode_batch_size,
            "client_gap_ms": r.local_baseline.tpot_p50_ms,
            "engine_step_ms": r.interference.decode_step_ms,
        }
        for r in records
        if r.validity.valid
        and r.config.decode_batch_size > 0
        and r.local_baseline is not None
        and r.local_baseline.tpot_p50_ms is not None
        and r.interference.decode_step_ms is not None
    ]
    frame = pd.DataFrame(rows, columns=["D", "client_gap_ms", "engine_step_ms"])
    frame["excess_ms"] = frame["client_gap_ms"] - frame["engine_step_ms"]
    return frame


def fit_stream_time(records: list[RunRecord]) -> StreamTimeFit:
    """Fit the per-step time the engine's step log leaves out (see the module). ``ValueError`` when fewer
    than two records have both a client median gap and an engine decode step (no engine step log)."""
    frame = stream_time_rows(records)
    if len(frame) < 2:
        raise ValueError(
            "the time per streamed token needs two valid records or more with decodes, a client baseline "
            "and the engine's decode steps (an engine step log)"
        )
    sizes = tuple(sorted({int(d) for d in frame["D"]}))
    d = frame["D"].to_numpy(float)
    slope = d if len(sizes) > 1 and len(d) > 2 else None
    terms = kept_terms(
        frame["excess_ms"].to_numpy(float), np.ones_like(d), slope, ("per step", "per streamed token")
    )
    return StreamTimeFit(
        terms.first, terms.first_ci, terms.second, terms.second_ci, len(frame), sizes, terms.note
    )


@dataclass(frozen=True)
class KeptTerms:
    """``y ≈ first × a + second × b`` with both terms ≥ 0 and each 95% CI above 0 (a dropped term is 0)."""

    first: float
    first_ci: tuple[float, float]
    second: float
    second_ci: tuple[float, float] | None  # None: no second column, or it was dropped before the first
    note: str  # the terms dropped, with their estimates


def kept_terms(
    y: np.ndarray,
    a: np.ndarray,
    b: np.ndarray | None,
    names: tuple[str, str],
    units: tuple[str, str] = ("ms", "ms"),
) -> KeptTerms:
    """The robust fit of ``y`` on columns ``a`` and ``b`` (``b`` None: on ``a`` alone) that keeps a term
    only where its 95% CI lies above 0: a negative term, or one whose CI holds 0, is dropped and the other
    refitted alone (not clipped after the joint fit, which would keep a value that only compensated the
    dropped one); ``names`` and ``units`` name the two terms in ``note``."""
    dropped: list[str] = []
    if b is not None:
        both = huber_fit(y, np.column_stack([a, b]))
        (first, second), (first_ci, second_ci) = (
            both.params,
            (_pair(both.conf_int[0]), _pair(both.conf_int[1])),
        )
        if _held(first_ci) and _held(second_ci):
            return KeptTerms(float(first), first_ci, float(second), second_ci, "")
        if _held(second_ci):  # the time is all in the second term
            dropped.append(_dropped(names[0], first, first_ci, units[0]))
            alone = huber_fit(y, b[:, None])
            value, ci = float(alone.params[0]), _pair(alone.conf_int[0])
            if _held(ci):
                return KeptTerms(0.0, (0.0, 0.0), value, ci, "; ".join(dropped))
            dropped.append(_dropped(f"{names[1]}, alone", value, ci, units[1]))
            return KeptTerms(0.0, (0.0, 0.0), 0.0, ci, "; ".join(dropped))
        dropped.append(
            _dropped(names[1], second, second_ci, units[1])
        )  # the time is all in the first (below)
    alone = huber_fit(y, a[:, None])
    value, ci = float(alone.params[0]), _pair(alone.conf_int[0])
    if not _held(ci):
        dropped.append(_dropped(names[0] + (", alone" if dropped else ""), value, ci, units[0]))
        value = 0.0
    return KeptTerms(value, ci, 0.0, None, "; ".join(dropped))


def _held(ci: tuple[float, float]) -> bool:
    """A term is kept when its 95% CI lies above 0 (an exact fit's zero-width CI: when it is above 0)."""
    return ci[0] > 0


def _dropped(term: str, value: float, ci: tuple[float, float], unit: str) -> str:
    why = "negative" if value < 0 else "its 95% CI holds 0"
    return f"{term} {value:.3g} [{ci[0]:.3g}, {ci[1]:.3g}] {unit} dropped ({why})"


def _pair(row: np.ndarray) -> tuple[float, float]:
    return float(row[0]), float(row[1])
