"""The API server's share of a prompt's time to first token, fitted over a run's valid records.

``frontend_ms`` of a record is the client's send → first token less the engine's own queue and prefill
times (its ``/metrics`` histograms): request serialization, the API server's parsing, tokenization and
hand-off, and the first token's way back. It grows with the prompt: ``frontend_ms = fixed + per_token × P``,
fitted robustly (``analysis.robust.huber_fit``): on a loaded host a few injections wait for a core and take
3–10× the usual time (a CPU sweep's 512-token injections: 4.4–8.4 ms, and three at 19–20 ms), which
least squares would spread into every request's fixed part.

An engine without those histograms whose step log times the injection's prefill steps by the intervals
between step lines (SGLang: ``engine_prefill_ms``, from the end of the step in progress when the request
came to the end of its last prefill step) gives ``record_frontend_ms``: the client's send → first token
less that interval and the expected wait for the step in progress (half a decode step, the mean residual
of a step the send lands in at random). SGLang's own ``queue_time`` cannot stand in: it starts when the
scheduler takes the request in, after the step in progress (≈ 0.3 ms on the CPU engine).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from analysis.robust import huber_fit, r_squared
from microbench.results.records import RunRecord

__all__ = ["FrontendFit", "fit_frontend", "record_frontend_ms"]


@dataclass
class FrontendFit:
    """The API server's share of the injection's TTFT: ``frontend_ms = fixed + per_token × P``."""

    per_token_ns: float
    ci_ns: tuple[float, float]
    fixed_ms: float
    r2: float
    n: int


def record_frontend_ms(rec: RunRecord) -> float | None:
    """The record's front-end time: from the engine's histograms, else from its interval-timed step log
    with decodes running (see the module); None where neither says."""
    i = rec.interference
    if i.frontend_ms is not None:
        return i.frontend_ms
    timed = i.step_mode is not None and i.step_mode.timing == "log_interval"
    if not timed or i.prefill_duration_ms is None or i.engine_prefill_ms is None or i.decode_step_ms is None:
        return None
    return i.prefill_duration_ms - i.engine_prefill_ms - i.decode_step_ms / 2


def fit_frontend(records: list[RunRecord], less: Callable[[RunRecord], float] | None = None) -> FrontendFit:
    """Robust (Huber) fit of the measured front-end time (send → engine queue, and the first token's way
    back: the client's TTFT less the engine's queue and prefill times) on P, over valid records. With
    ``less``, each record's time less that (the calibration's replay charges part of it to the engine:
    ``analysis.calibrate.prefill_time.charged_twice_ms``, so its first token pays it once)."""
    rows = [
        (r.config.new_prefill_tokens, fe - (less(r) if less else 0.0))
        for r in records
        if r.validity.valid and (fe := record_frontend_ms(r)) is not None
    ]
    if len({p for p, _ in rows}) < 2:
        raise ValueError(
            "front-end times need valid records at two prompt lengths or more (engine /metrics "
            "with queue and prefill time histograms)"
        )
    p = np.array([r[0] for r in rows], float)
    y = np.array([r[1] for r in rows], float)
    fit = huber_fit(y, np.column_stack([np.ones_like(p), p]))
    low, high = fit.conf_int[1]
    return FrontendFit(
        float(fit.params[1]) * 1e6,
        (float(low) * 1e6, float(high) * 1e6),
        float(fit.params[0]),
        r_squared(y, fit.fitted),
        len(rows),
    )
