"""The API server's share of TTFT per record: from the engine's histograms, else from SGLang's step log."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from analysis.frontend import fit_frontend, record_frontend_ms


def _rec(p: int, ttft: float, prefill: float | None, decode: float | None, timing: str | None,
         frontend: float | None = None) -> Any:  # fmt: skip
    """The fields the fit reads of a sweep record (a RunRecord stand-in)."""
    return SimpleNamespace(
        config=SimpleNamespace(new_prefill_tokens=p),
        validity=SimpleNamespace(valid=True),
        interference=SimpleNamespace(
            frontend_ms=frontend,
            prefill_duration_ms=ttft,
            engine_prefill_ms=prefill,
            decode_step_ms=decode,
            step_mode=SimpleNamespace(timing=timing) if timing else None,
        ),
    )


def test_an_interval_timed_step_log_gives_the_front_end_less_half_a_decode_step() -> None:
    # SGLang: send → first token 60 ms, the prefill interval (end of the step in progress → end of the
    # prefill step) 46 ms, decode steps of 8 ms: 60 − 46 − 4 = 10 ms
    assert record_frontend_ms(_rec(1024, 60.0, 46.0, 8.0, "log_interval")) == pytest.approx(10.0)
    # the histograms' figure wins where there is one; an engine field or no decodes say nothing here
    assert record_frontend_ms(_rec(1024, 60.0, 46.0, 8.0, "log_interval", frontend=3.0)) == 3.0
    assert record_frontend_ms(_rec(1024, 60.0, 46.0, 8.0, "engine_field")) is None
    assert record_frontend_ms(_rec(1024, 60.0, 46.0, None, "log_interval")) is None


def test_the_fit_reads_sglang_records_on_a_known_line() -> None:
    # front end = 5 ms + 2 µs × P, the prefill interval and the decode step differing per record
    records = [
        _rec(p, 5.0 + 2e-3 * p + prefill + decode / 2, prefill, decode, "log_interval")
        for p, prefill, decode in ((512, 30.0, 8.0), (1024, 50.0, 10.0), (2048, 110.0, 9.0))
    ]
    fit = fit_frontend(records)
    assert fit.fixed_ms == pytest.approx(5.0) and fit.per_token_ns == pytest.approx(2000.0)
    assert fit.n == 3
