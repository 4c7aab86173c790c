"""The API server's time per streamed token (analysis.calibrate.stream_time) and its place in the replay."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from analysis.calibrate.replay import ReplayRequest, replay
from analysis.calibrate.stream_time import fit_stream_time, stream_time_rows
from tests.unit.test_calibrate_replay import MS, _settings


def _rec(d: int, gap_ms: float | None, step_ms: float | None, valid: bool = True) -> Any:
    """The four fields the fit reads of a sweep record (a RunRecord stand-in)."""
    return SimpleNamespace(
        config=SimpleNamespace(decode_batch_size=d),
        validity=SimpleNamespace(valid=valid),
        local_baseline=SimpleNamespace(tpot_p50_ms=gap_ms),
        interference=SimpleNamespace(decode_step_ms=step_ms),
    )


def test_the_fit_recovers_a_known_line() -> None:
    # excess = 0.4 ms + 0.05 ms × D exactly, engine steps differing per record
    records = [_rec(d, step + 0.4 + 0.05 * d, step) for d in (2, 4, 8) for step in (2.5, 3.0)]
    fit = fit_stream_time(records)
    assert fit.fixed_ms == pytest.approx(0.4) and fit.per_token_ms == pytest.approx(0.05)
    assert fit.per_token_ci_ms is not None and fit.per_token_ci_ms == pytest.approx((0.05, 0.05), abs=1e-9)
    assert fit.n == 6 and fit.batch_sizes == (2, 4, 8)


def test_the_fit_with_noise_has_a_ci_holding_the_truth() -> None:
    noise = [0.03, -0.02, 0.01, -0.03, 0.02, -0.01]
    records = [
        _rec(d, 3.0 + 0.6 + 0.02 * d + e, 3.0) for (d, e) in zip((1, 2, 4, 8, 16, 32), noise, strict=True)
    ]
    fit = fit_stream_time(records)
    assert fit.per_token_ci_ms is not None and fit.per_token_ci_ms[0] < 0.02 < fit.per_token_ci_ms[1]
    assert fit.fixed_ci_ms[0] < 0.6 < fit.fixed_ci_ms[1]


def test_a_slope_whose_ci_holds_zero_is_dropped_and_the_step_term_refitted() -> None:
    # excess = 0.5 ms per step, no per-token time: the noise gives the joint fit a small slope either way
    noise = [-0.02, 0.01, -0.01, 0.02, 0.01, -0.005]
    records = [_rec(d, 3.0 + 0.5 + e, 3.0) for (d, e) in zip((2, 2, 4, 4, 8, 8), noise, strict=True)]
    fit = fit_stream_time(records)
    assert fit.per_token_ms == 0.0 and fit.per_token_ci_ms is None
    assert fit.fixed_ms == pytest.approx(0.5, abs=0.02) and fit.fixed_ci_ms[0] > 0
    assert fit.note.startswith("per streamed token") and "CI holds 0" in fit.note


def test_noise_around_zero_gives_no_stream_time() -> None:
    # the sim as reality: its steps are the whole cycle, the client's gap only adds noise of either sign
    noise = [0.004, -0.003, 0.002, -0.004, 0.003, -0.001, 0.001, -0.002]
    records = [_rec(d, 40.0 + e, 40.0) for (d, e) in zip((1, 2, 4, 8) * 2, noise, strict=True)]
    fit = fit_stream_time(records)
    assert fit.fixed_ms == 0.0 and fit.per_token_ms == 0.0
    assert "per streamed token" in fit.note and "per step" in fit.note


def test_a_time_all_per_token_keeps_the_slope_alone() -> None:
    noise = [0.001, -0.002, 0.002, -0.001, 0.0, 0.001]
    records = [_rec(d, 3.0 + 0.05 * d + e, 3.0) for (d, e) in zip((2, 2, 4, 4, 8, 8), noise, strict=True)]
    fit = fit_stream_time(records)
    assert fit.fixed_ms == 0.0 and fit.per_token_ms == pytest.approx(0.05, abs=0.002)
    assert fit.per_token_ci_ms is not None and fit.per_token_ci_ms[0] > 0 and fit.note.startswith("per step")


def test_one_batch_size_gives_the_mean_and_no_slope() -> None:
    fit = fit_stream_time([_rec(4, 3.5, 3.0), _rec(4, 3.7, 3.0)])
    assert fit.fixed_ms == pytest.approx(0.6) and fit.per_token_ms == 0.0 and fit.per_token_ci_ms is None


def test_rows_leave_out_what_cannot_say() -> None:
    records = [
        _rec(4, 3.5, 3.0),
        _rec(0, 3.5, 3.0),  # no decodes
        _rec(4, 3.5, None),  # no engine step log
        _rec(4, None, 3.0),  # no client baseline
        _rec(4, 3.5, 3.0, valid=False),
    ]
    rows = stream_time_rows(records)
    assert len(rows) == 1 and rows["excess_ms"].iloc[0] == pytest.approx(0.5)
    with pytest.raises(ValueError, match="two valid records"):
        fit_stream_time(records)


def test_the_replay_adds_stream_time_per_step_and_streamed_token() -> None:
    req = ReplayRequest("a", 5 * MS, list(range(1000)), 3)
    result = replay([req], _settings(stream_fixed_ms=0.5, stream_ms_per_token=0.25))
    # each step streams one token: + 0.75 ms on 51 ms (prefill) and 1.1 ms (decodes)
    assert result.token_ns["a"] == [5 * MS + 51_750_000, 5 * MS + 53_600_000, 5 * MS + 55_450_000]
    two = [ReplayRequest("a", 0, list(range(800)), 2), ReplayRequest("b", 0, list(range(5000, 5800)), 1)]
    steps = replay(two, _settings(max_num_batched_tokens=1024, stream_ms_per_token=0.25)).steps
    # step 1 streams a's first token only (b's prompt is not done); step 2 a's decode and b's first token
    assert [s["duration_ns"] + s["stream_ns"] for s in steps] == [
        round((1 + 0.05 * 1024 + 0.25) * MS),
        round((1 + 0.05 * 576 + 0.1 + 0.5) * MS),
    ]


def test_a_stray_record_does_not_tilt_a_zero_excess_into_a_slope() -> None:
    # SGLang's step-line intervals already span the whole loop: client gap − engine step ≈ 0, except one
    # record whose engine median caught a prefill (−37 ms at D = 2). Least squares with the negative
    # intercept clipped afterwards kept its slope: +2.5 ms per streamed token, +10 ms on a 4-decode step.
    excess = {2: [-0.4, -0.3, -0.5, 0.1, -37.0], 4: [-0.3, -0.2, -0.4, 0.6, -0.1]}
    records = [_rec(d, 10.0 + e, 10.0) for d, values in excess.items() for e in values]
    fit = fit_stream_time(records)
    assert fit.fixed_ms == 0.0 and fit.per_token_ms == pytest.approx(0.0, abs=0.05)


def test_a_negative_intercept_is_dropped_and_the_slope_refitted_through_the_origin() -> None:
    records = [_rec(d, 5.0 + 0.25 * d - 0.1, 5.0) for d in (1, 2, 4, 8)]  # OLS: −0.1 + 0.25 × D
    fit = fit_stream_time(records)
    assert fit.fixed_ms == 0.0
    # through the origin: Σ D·y / Σ D² = 0.25 − 0.1 × 15 / 85
    assert fit.per_token_ms == pytest.approx(0.25 - 0.1 * 15 / 85, rel=1e-6)
