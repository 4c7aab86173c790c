"""The committed calibration run on CPU vLLM (results/calibrate-vllm-cpu, results/README.md): its
predictions are what ``analysis.calibrate predict`` makes of its fit and traces today, and its reports say
what the README quotes."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from analysis.calibrate.config import fit_to_sim
from analysis.calibrate.predict import predict_trace
from analysis.calibrate.report import CalibrationReport
from microbench.results.trace import read_trace

RUN = Path(__file__).resolve().parents[2] / "results" / "calibrate-vllm-cpu"


@pytest.mark.parametrize("workload", ["poisson", "bursty"])
def test_the_committed_prediction_is_reproduced(workload: str, tmp_path: Path) -> None:
    predict_trace(RUN / f"observe-{workload}", fit_to_sim(RUN / "fit"), tmp_path)
    _, fresh = read_trace(tmp_path)
    _, kept = read_trace(RUN / f"predict-{workload}")
    for column in ("request_id", "first_chunk_ns", "last_chunk_ns", "output_tokens"):
        pd.testing.assert_series_equal(fresh[column], kept[column], check_names=False)


def test_the_reports_hold_the_quoted_figures() -> None:
    poisson = CalibrationReport.model_validate_json((RUN / "report-poisson/calibration.json").read_text())
    bursty = CalibrationReport.model_validate_json((RUN / "report-bursty/calibration.json").read_text())
    assert poisson.n_compared == 296 and bursty.n_compared == 259
    assert poisson.metric("ttft").median_ape_pct == pytest.approx(6.1, abs=0.05)
    assert poisson.metric("e2e").median_ape_pct == pytest.approx(4.7, abs=0.05)
    assert bursty.metric("e2e").median_ape_pct == pytest.approx(5.8, abs=0.05)
    assert poisson.steps is not None and poisson.steps.real.steps == 10546
