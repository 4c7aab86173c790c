"""analysis.calibrate.speed: the engine's decode-only steps over the fit's price, per window, on hand-built
step logs whose ratios are known."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from analysis.calibrate.speed import MIN_STEPS, engine_speed
from engine_harness.step_model import StepModel

MODEL = StepModel(alpha_ms=2.0, beta_d_ms=1.0, beta_c_ms=0.05, gamma_ns=10.0)  # a D-decode step: 2 + D ms


def _steps(rows: list[tuple[float, int, int, float]]) -> pd.DataFrame:
    return pd.DataFrame(rows, columns=["t_end_s", "prefill_tokens", "decode_tokens", "elapsed_ms"])


def test_the_trace_s_median_and_its_most_common_step_per_window() -> None:
    rows = [(0.1 * i, 0, 2, 4.0) for i in range(MIN_STEPS + 5)]  # 0-2.4 s: D = 2 at the fit's 4 ms
    rows += [(10.0 + 0.1 * i, 0, 2, 6.0) for i in range(MIN_STEPS)]  # 10-11.9 s: D = 2 at 1.5× the price
    rows += [(12.0 + 0.1 * i, 0, 1, 1.5) for i in range(MIN_STEPS)]  # D = 1 at half its 3 ms: not D's mode
    rows += [(20.0 + 0.1 * i, 0, 2, 2.0) for i in range(MIN_STEPS - 1)]  # too few for a window: 0.5 each
    rows += [(5.0, 512, 2, 400.0), (6.0, 0, 2, math.nan), (7.0, 0, 0, 1.0)]  # prefill, untimed, empty: out
    speed = engine_speed(_steps(rows), MODEL)
    assert speed is not None and speed.steps == 4 * MIN_STEPS + 4
    assert speed.batch == 2 and speed.batch_price_ms == pytest.approx(4.0)
    assert [(w.start_s, w.steps, w.median_ms) for w in speed.windows] == [
        (0.0, MIN_STEPS + 5, 4.0),
        (10.0, MIN_STEPS, 6.0),
    ]
    assert [w.median_ratio for w in speed.windows] == pytest.approx([1.0, 1.5])
    assert speed.spread == pytest.approx((1.0, 1.5))
    # 84 steps: 25 at 1.0, 20 at 1.5, 20 at 0.5, 19 at 0.5; the 42nd and 43rd are 1.0
    assert speed.median_ratio == pytest.approx(1.0)


def test_windows_start_at_the_first_logged_step_whatever_its_kind() -> None:
    # a prefill step at 100 s, then decode steps every 0.25 s from 105 s: 20 before 110 s, 20 after
    rows = [(100.0, 256, 0, 50.0)] + [(105.0 + 0.25 * i, 0, 2, 8.0) for i in range(2 * MIN_STEPS)]
    speed = engine_speed(_steps(rows), MODEL)
    assert speed is not None
    assert [(w.start_s, w.steps, w.median_ratio) for w in speed.windows] == [
        (0.0, MIN_STEPS, 2.0),
        (10.0, MIN_STEPS, 2.0),
    ]


def test_nothing_is_priced_with_a_decode_context_cost_or_without_decode_only_steps() -> None:
    rows = [(0.1 * i, 0, 2, 4.0) for i in range(MIN_STEPS)]
    with_delta = MODEL.model_copy(update={"delta_ns": 100.0})  # the log lacks each decode's context
    assert engine_speed(_steps(rows), with_delta) is None
    assert engine_speed(_steps([(0.0, 512, 0, 40.0), (1.0, 256, 2, 30.0)]), MODEL) is None
