"""The one robust fit (analysis.robust) and its two users on degenerate data: exact, constant, two points,
a singular design, an exact majority with outliers, non-finite values. Each case is decided by the guard,
never by statsmodels' arithmetic on a zero scale (which names exact points outliers, returns no weights,
or divides by zero)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import statsmodels.api as sm

from analysis.robust import CannotFit, huber_fit
from analysis.transfer.fit import NoTransferFit, TransferFit, fit_transfer


def _line(x: object) -> np.ndarray:
    return sm.add_constant(np.asarray(x, float), has_constant="add")


X = np.arange(8.0)


def test_an_exact_line_is_fitted_exactly_with_no_outlier_and_a_zero_width_interval() -> None:
    fit = huber_fit(2.0 + 3.0 * X, _line(X))
    assert fit.params == pytest.approx([2.0, 3.0], abs=1e-12)
    assert (fit.weights == 1.0).all() and fit.scale == 0.0
    assert fit.conf_int[:, 0] == pytest.approx(fit.conf_int[:, 1]) and "exact fit" in (fit.note or "")


def test_constant_data_give_a_flat_line_and_name_no_point_an_outlier() -> None:
    # RLM alone weights two of these six exact points at 0.4985: below the 0.5 outlier mark
    fit = huber_fit(np.full(6, 5.0), _line(X[:6]))
    assert fit.params == pytest.approx([5.0, 0.0], abs=1e-12)
    assert (fit.weights >= 0.5).all() and fit.scale == 0.0


def test_an_exact_majority_names_the_rest_outliers() -> None:
    y = np.where(X == 5, 60.0, 2.0 + 3.0 * X)
    fit = huber_fit(y, _line(X))
    assert fit.params == pytest.approx([2.0, 3.0], abs=1e-9)
    assert fit.weights.tolist() == [1, 1, 1, 1, 1, 0, 1, 1] and "7 of 8 points" in (fit.note or "")


def test_an_exact_majority_that_leaves_a_term_free_is_fitted_by_least_squares_over_every_point() -> None:
    # the sim's engine-clock steps of 2026-11-30: prefill steps exactly on 4 + 0.02·c (no decode in them),
    # decode-only steps 4 + 0.2·d plus a context cost the model has not (here 0.01·d·w, w in −1…1): the
    # exact points say nothing of the decode term, so the decode steps are not outliers but its only data
    prefill = np.tile([256.0, 512, 1024, 2048], 4)
    decode = np.array([2.0, 4, 8, 2, 4, 8])
    wobble = 0.01 * decode * np.array([-1.0, -0.5, 0.2, 0.6, 1.0, -0.3])  # no two decode steps on one line
    x = np.vstack(
        [
            np.column_stack([np.ones(16), prefill, np.zeros(16)]),
            np.column_stack([np.ones(6), 0 * decode, decode]),
        ]
    )
    y = np.concatenate([4 + 0.02 * prefill, 4 + 0.2 * decode + wobble])
    fit = huber_fit(y, x)
    assert "16 of 22 points exactly on one line" in (fit.note or "") and "least squares" in (fit.note or "")
    assert (fit.weights == 1).all()
    assert fit.params == pytest.approx([4.0, 0.02, 0.2], rel=0.02)
    lo, hi = fit.conf_int[2]
    assert lo < 0.2 < hi and hi - lo > 0  # the decode term's interval has the wobble's width


@pytest.mark.parametrize(
    ("y", "x", "reason"),
    [
        (np.array([1.0, 3.0]), _line([0.0, 1.0]), "2 points for 2 coefficients"),
        (np.array([1.0, 3.0, 4.0]), np.ones((3, 2)), "singular design"),
        (np.array([1.0, np.nan, 4.0]), _line([0.0, 1.0, 2.0]), "non-finite"),
    ],
)
def test_data_that_cannot_determine_the_line_say_why(y: np.ndarray, x: np.ndarray, reason: str) -> None:
    with pytest.raises(CannotFit, match=reason):
        huber_fit(y, x)


def test_noisy_data_keep_statsmodels_huber_result() -> None:
    y = 2.0 + 3.0 * X + np.random.default_rng(0).normal(0, 0.1, X.size)
    fit = huber_fit(y, _line(X))
    res = sm.RLM(y, _line(X), M=sm.robust.norms.HuberT()).fit()
    assert (
        fit.note is None and fit.params == pytest.approx(res.params) and fit.scale == pytest.approx(res.scale)
    )


def _table(times: list[float], prefill: list[int]) -> pd.DataFrame:
    return pd.DataFrame(
        {
            "mode": "disaggregated",
            "valid": True,
            "prefill_tokens": prefill,
            "kv_xfer_ms": times,
            "kv_bytes": [float(p * 1024) for p in prefill],
        }
    )


def test_the_link_fit_of_exact_times_is_a_fit_with_r2_one() -> None:
    prefill = [1024, 2048, 4096, 8192] * 2
    fit = fit_transfer(_table([0.5 + p / 1000 for p in prefill], prefill), None, "kv_xfer")
    assert isinstance(fit, TransferFit) and fit.r2 == pytest.approx(1.0) and fit.downweighted_ms == []
    assert fit.fit_note is not None and fit.resolvable


def test_the_link_fit_of_constant_times_is_flat_with_no_outlier() -> None:
    prefill = [1024, 2048, 4096, 8192] * 2
    fit = fit_transfer(_table([3.0] * 8, prefill), None, "kv_xfer")
    assert isinstance(fit, TransferFit) and fit.downweighted_ms == [] and fit.mean_ms == 3.0
    assert fit.ms_per_mib == pytest.approx(0.0, abs=1e-12)


def test_the_link_fit_of_a_design_it_cannot_solve_is_no_fit_with_the_reason() -> None:
    prefill = [1024, 2048, 1024, 2048]
    table = _table([1.0, 2.0, 1.5, 2.5], prefill).assign(kv_bytes=4096.0)  # one size for every P
    fit = fit_transfer(table, None, "kv_xfer")
    assert isinstance(fit, NoTransferFit) and "singular design" in fit.reason


def test_the_step_model_on_noiseless_steps_recovers_its_parameters(tmp_path: Path) -> None:
    # Steps exactly on the model: a zero robust scale, which RLM alone cannot weigh.
    from analysis.models import fit_step_model
    from analysis.synthetic import synthesize_run
    from analysis.table import load_records
    from engine_harness.step_model import StepModel

    params = StepModel(alpha_ms=2.0, beta_d_ms=0.05, beta_c_ms=0.03, gamma_ns=8.0, delta_ns=0.0)
    run = synthesize_run(
        tmp_path / "exact",
        chunks=(2048,),
        decode_batches=(0, 2, 8),
        prefill_tokens=(1024, 4096, 8192),
        repetitions=2,
        params=params,
        noise=0.0,
    )
    fit = fit_step_model(load_records(run), "c·(ctx + c/2)")
    assert fit.params["alpha_ms"] == pytest.approx(2.0, rel=1e-6)
    assert fit.params["beta_c_ms"] == pytest.approx(0.03, rel=1e-6) and fit.r2 == pytest.approx(1.0)


def test_a_result_without_weights_is_decided_here_not_a_type_error(monkeypatch: pytest.MonkeyPatch) -> None:
    # statsmodels 0.15 returned weights=None on some machines (issue #30): stand in for that outcome
    class NoWeights:
        params = np.array([0.0, 0.0])
        weights = None
        scale = 0.0

    class FakeRLM:
        def __init__(self, *args: object, **kwargs: object) -> None:
            pass

        def fit(self) -> NoWeights:
            return NoWeights()

    monkeypatch.setattr(sm, "RLM", FakeRLM)
    y = np.where(X == 5, 60.0, 2.0 + 3.0 * X)  # an exact majority: the line through it, one outlier
    assert huber_fit(y, _line(X)).weights.tolist() == [1, 1, 1, 1, 1, 0, 1, 1]
    noisy = 2.0 + 3.0 * X + np.random.default_rng(1).normal(0, 0.1, X.size)
    fit = huber_fit(noisy, _line(X))  # no exact majority: every point is data, none an outlier
    assert "least squares over every point" in (fit.note or "") and (fit.weights == 1).all()
    assert (
        fit.params == pytest.approx([2.0, 3.0], abs=0.2) and (fit.conf_int[:, 1] > fit.conf_int[:, 0]).all()
    )
