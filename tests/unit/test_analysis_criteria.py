"""Seed 002's four success criteria (``analysis.criteria``) on hand-built tables."""

import pandas as pd

from analysis.criteria import success_criteria


def _table(ratio: list[float], cv: list[float], delay: list[float]) -> pd.DataFrame:
    n = len(ratio)
    return pd.DataFrame(
        {
            "chunk_size": [8192] * n,
            "decode_batch_size": [4] * n,
            "new_prefill_tokens": [4096 * (i + 1) for i in range(n)],
            "penalty_ratio": ratio,
            "repetitions": [5] * n,
            "cv_penalty_ratio": cv,
            "aggregate_decode_delay_ms": delay,
        }
    )


def _status(table: pd.DataFrame, comparison: pd.DataFrame | None = None) -> list[str]:
    return success_criteria(table, comparison)["status"].tolist()


def test_all_four_pass_and_each_fails_on_its_own() -> None:
    comparison = pd.DataFrame(
        {"model": ["seed: x", "step: y"], "r2": [0.7, 0.99], "loo_p_median_ape_pct": [30, 3]}
    )
    assert _status(_table([2.0, 3.0], [0.05, 0.10], [40.0, 60.0]), comparison) == ["PASS"] * 4
    assert _status(_table([1.05, 3.0], [0.05, 0.10], [40.0, 60.0]), comparison)[0] == "FAIL"
    low = comparison.assign(r2=[0.7, 0.8])
    assert _status(_table([2.0, 3.0], [0.05, 0.10], [40.0, 60.0]), low)[1] == "FAIL"
    assert _status(_table([2.0, 3.0], [0.05, 0.10], [40.0, 49.0]), comparison)[2] == "FAIL"
    assert (
        _status(_table([2.0, 3.0], [0.05, 0.15], [40.0, 60.0]), comparison)[3] == "FAIL"
    )  # 15% is not < 15%


def test_leave_one_p_out_error_is_printed_beside_every_r2() -> None:
    comparison = pd.DataFrame(
        {"model": ["seed: x", "step: y"], "r2": [0.7, 0.99], "loo_p_median_ape_pct": [30, 3]}
    )
    measured = success_criteria(_table([2.0], [0.05], [60.0]), comparison)["measured"].iloc[1]
    assert "seed R² = 0.700 (leave-one-P-out median error 30.0%)" in measured
    assert "step R² = 0.990 (leave-one-P-out median error 3.0%)" in measured


def test_no_cell_or_no_fit_is_not_applicable() -> None:
    statuses = _status(_table([], [], []))
    assert statuses == ["N/A"] * 4
