"""The API server's share of the first token (analysis.frontend.fit_frontend): a few injections a loaded
host made wait for a core must not move every request's fixed part."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from analysis.frontend import fit_frontend


def _rec(p: int, frontend_ms: float) -> Any:
    """The fields the fit reads of a sweep record (a RunRecord stand-in)."""
    return SimpleNamespace(
        config=SimpleNamespace(new_prefill_tokens=p),
        validity=SimpleNamespace(valid=True),
        interference=SimpleNamespace(frontend_ms=frontend_ms),
    )


def test_a_few_stalled_injections_do_not_move_the_line() -> None:
    # 5 ms + 1 µs per prompt token, ±0.2 ms, three repetitions per P; then three injections that waited
    # 12-15 ms for a core (a CPU sweep on a shared box: 512-token injections at 4.4-8.4 ms and 19-20 ms)
    noise = [0.2, -0.2, 0.0]
    records = [_rec(p, 5.0 + 1e-3 * p + e) for p in (512, 1024, 2048, 4096) for e in noise]
    records += [_rec(512, 5.5 + 15.0), _rec(1024, 6.0 + 12.0), _rec(2048, 7.0 + 14.0)]
    fit = fit_frontend(records)
    assert fit.fixed_ms == pytest.approx(5.0, abs=0.3)  # least squares: 9.4 ms
    assert fit.per_token_ns == pytest.approx(1000.0, rel=0.15)
    assert fit.n == 15
