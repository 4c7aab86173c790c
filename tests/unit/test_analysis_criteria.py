"""Seed 002's four success criteria (``analysis.criteria``) on hand-built tables: each verdict names what
it judged, and a set of verdicts that contradicts its own figures is caught."""

import pandas as pd

from analysis.criteria import ModelFit, contradictions, success_criteria


def _table(
    ratio: list[float], cv: list[float], delay: list[float], step_cv: list[float] | None = None
) -> pd.DataFrame:
    n = len(ratio)
    return pd.DataFrame(
        {
            "chunk_size": [8192] * n,
            "decode_batch_size": [4] * n,
            "new_prefill_tokens": [4096 * (i + 1) for i in range(n)],
            "tpot_baseline_ms": [3.0 + i for i in range(n)],
            "penalty_ratio": ratio,
            "repetitions": [5] * n,
            "cv_penalty_ratio": cv,
            "cv_step_time_full_chunk_ms": step_cv if step_cv is not None else [0.02] * n,
            "aggregate_decode_delay_ms": delay,
        }
    )


def _fits(seed_r2: float = -0.69, step_r2: float = 0.98) -> list[ModelFit]:
    return [
        ModelFit(name="seed", formula="num_chunks × D × penalty(D, chunk)", parameters=6, r2=seed_r2,
                 loo_median_ape_pct=163.1, n=120),
        ModelFit(name="step", formula="α + β_d·D + β_c·c + γ·c·(ctx + c/2)", parameters=4, r2=step_r2,
                 loo_median_ape_pct=6.6, n=120),
    ]  # fmt: skip


def _status(table: pd.DataFrame, fits: list[ModelFit] | None = None) -> list[str]:
    return [c.status for c in success_criteria(table, fits)]


def test_all_four_pass_and_each_fails_on_its_own() -> None:
    good = _table([2.0, 3.0], [0.05, 0.10], [40.0, 60.0])
    assert _status(good, _fits()) == ["PASS"] * 4
    assert _status(_table([1.05, 3.0], [0.05, 0.10], [40.0, 60.0]), _fits())[0] == "FAIL"
    assert _status(good, _fits(0.7, 0.8))[1] == "FAIL"
    assert _status(_table([2.0, 3.0], [0.05, 0.10], [40.0, 49.0]), _fits())[2] == "FAIL"
    assert _status(_table([2.0, 3.0], [0.05, 0.15], [40.0, 60.0]), _fits())[3] == "FAIL"  # 15% is not < 15%


def test_model_fits_names_the_model_it_judged_and_states_the_other() -> None:
    """The seed's product model fails while the step model passes: the PASS says it is the step model's."""
    fits = success_criteria(_table([2.0], [0.05], [60.0]), _fits(-0.694, 0.981))[1]
    assert fits.status == "PASS" and fits.model == "step" and fits.value == 0.981
    assert "step model" in fits.judged and "c·(ctx + c/2)" in fits.judged
    assert fits.measured == "step model R² = 0.981 (leave-one-P-out median error 6.6%)"
    assert fits.beside == [
        "seed 002's product model R² = -0.694 (leave-one-P-out median error 163.1%): fails the bar on its own"
    ]
    swapped = success_criteria(_table([2.0], [0.05], [60.0]), _fits(0.9, 0.5))[1]
    assert swapped.model == "seed" and "step model R² = 0.500" in swapped.beside[0]


def test_reproducible_shows_the_step_times_cv_and_the_baseline_beside_the_ratios() -> None:
    """A noisy ratio over a quiet step time: the reader sees the noise is the small denominator's."""
    table = _table([20.0, 30.0, 40.0], [0.30, 0.05, 0.22], [60.0] * 3, step_cv=[0.01, 0.08, 0.03])
    rep = success_criteria(table, _fits())[3]
    assert rep.status == "FAIL" and rep.value == 2
    assert rep.measured.startswith("CV of penalty_ratio: 2 of 3 cells at or above 15% (range 5.0%–30.0%")
    assert rep.beside[0] == "CV of the full-chunk step time: 0 of 3 cells at or above 15% (range 1.0%–8.0%)"
    assert "decode baseline TPOT (3–5 ms" in rep.beside[1]


def test_a_verdict_that_contradicts_its_figures_or_the_fits_is_caught() -> None:
    table, fits = _table([2.0, 3.0], [0.05, 0.30], [40.0, 60.0]), _fits()
    criteria = success_criteria(table, fits)
    assert contradictions(criteria, table, fits) == []
    flipped = [criteria[0], criteria[1], criteria[2], criteria[3].model_copy(update={"status": "PASS"})]
    assert contradictions(flipped, table, fits) == [
        "reproducible: status PASS but its judged figure 1.0 says FAIL"
    ]
    other_fit = _fits(-0.69, 0.90)  # the models section shows another R² than the verdict judged
    assert any("the step model's R² is 0.9" in p for p in contradictions(criteria, table, other_fit))
    quiet = [*criteria[:3], criteria[3].model_copy(update={"value": 0.0, "status": "PASS"})]
    assert any("is not the table's 1.0" in p for p in contradictions(quiet, table, fits))
    unnamed = [criteria[0], criteria[1].model_copy(update={"beside": []}), *criteria[2:]]
    assert contradictions(unnamed, table, fits) == [
        "model_fits does not name the model it judged and state the other's R²"
    ]


def test_no_cell_or_no_fit_is_not_applicable() -> None:
    assert _status(_table([], [], [])) == ["N/A"] * 4
