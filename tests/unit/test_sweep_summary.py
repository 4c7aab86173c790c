"""Seed 002's table-level success criteria as the sweep prints them."""

import pandas as pd

from microbench.sweep.summary import criteria


def _table(cv_tpot: list[float], cv_engine: list[float], ratio: list[float]) -> pd.DataFrame:
    n = len(cv_tpot)
    return pd.DataFrame(
        {
            "chunk_size": [8192] * n,
            "decode_batch_size": [4] * n,
            "new_prefill_tokens": [4096 * (i + 1) for i in range(n)],
            "penalty_ratio": ratio,
            "repetitions": [5] * n,
            "cv_tpot_interference_ms": cv_tpot,
            "cv_step_time_mixed_ms": cv_engine,
        }
    )


def test_criteria_pass_and_fail_with_the_failing_cells_named() -> None:
    ok = criteria(_table([0.05, 0.1], [0.04, 0.09], [2.0, 3.0]))
    assert [c.passed for c in ok] == [True, True]
    bad = criteria(_table([0.05, 0.3], [0.04, 0.25], [1.05, 3.0]))
    ratio, cv = bad
    assert ratio.passed is False and "c8192/D4/P4096" in ratio.detail and "min ratio 1.05" in ratio.detail
    assert cv.passed is False and "1/2 cells pass" in cv.detail and "c8192/D4/P8192" in cv.detail
    # the engine's own step-time spread in the failing cells tells harness noise from engine noise
    assert "engine's own logged prefill-step time varied by CV 25%" in cv.detail
