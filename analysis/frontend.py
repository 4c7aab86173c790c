"""The API server's share of a prompt's time to first token, fitted over a run's valid records.

``frontend_ms`` of a record is the client's send → first token less the engine's own queue and prefill
times (its ``/metrics`` histograms): request serialization, the API server's parsing, tokenization and
hand-off, and the first token's way back. It grows with the prompt: ``frontend_ms = fixed + per_token × P``,
fitted robustly (``analysis.robust.huber_fit``): on a loaded host a few injections wait for a core and take
3–10× the usual time (a CPU sweep's 512-token injections: 4.4–8.4 ms, and three at 19–20 ms), which
least squares would spread into every request's fixed part.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from analysis.robust import huber_fit, r_squared
from microbench.results.records import RunRecord

__all__ = ["FrontendFit", "fit_frontend"]


@dataclass
class FrontendFit:
    """The API server's share of the injection's TTFT: ``frontend_ms = fixed + per_token × P``."""

    per_token_ns: float
    ci_ns: tuple[float, float]
    fixed_ms: float
    r2: float
    n: int


def fit_frontend(records: list[RunRecord]) -> FrontendFit:
    """Robust (Huber) fit of the measured front-end time (send → engine queue, and the first token's way
    back: the client's TTFT less the engine's queue and prefill times) on P, over valid records."""
    rows = [
        (r.config.new_prefill_tokens, r.interference.frontend_ms)
        for r in records
        if r.validity.valid and r.interference.frontend_ms is not None
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
