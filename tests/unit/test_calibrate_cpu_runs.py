"""The committed calibration runs on the CPU engines (results/calibrate-{vllm,sglang}-cpu and
results/calibrate-vllm-cpu-isolated, results/README.md):
their predictions are what ``analysis.calibrate predict`` makes of their fit and traces today, and their
reports say what the READMEs quote."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from analysis.calibrate.config import fit_to_sim
from analysis.calibrate.predict import predict_trace
from analysis.calibrate.report import CalibrationReport
from microbench.results.trace import read_trace

RESULTS = Path(__file__).resolve().parents[2] / "results"


@pytest.mark.parametrize("run", ["calibrate-vllm-cpu", "calibrate-vllm-cpu-isolated", "calibrate-sglang-cpu"])
@pytest.mark.parametrize("workload", ["poisson", "bursty"])
def test_the_committed_prediction_is_reproduced(run: str, workload: str, tmp_path: Path) -> None:
    folder = RESULTS / run
    predict_trace(folder / f"observe-{workload}", fit_to_sim(folder / "fit"), tmp_path)
    _, fresh = read_trace(tmp_path)
    _, kept = read_trace(folder / f"predict-{workload}")
    for column in ("request_id", "first_chunk_ns", "last_chunk_ns", "output_tokens"):
        pd.testing.assert_series_equal(fresh[column], kept[column], check_names=False)


def _reports(run: str) -> tuple[CalibrationReport, CalibrationReport]:
    read = CalibrationReport.model_validate_json
    return (
        read((RESULTS / run / "report-poisson/calibration.json").read_text()),
        read((RESULTS / run / "report-bursty/calibration.json").read_text()),
    )


@pytest.mark.parametrize(
    ("run", "n", "ttft", "e2e", "real_steps"),
    [
        ("calibrate-vllm-cpu", (296, 259), (6.9, 10.4), (5.0, 6.8), 10641),
        ("calibrate-vllm-cpu-isolated", (296, 259), (18.0, 15.6), (14.6, 8.1), 9018),
        ("calibrate-sglang-cpu", (252, 241), (9.4, 9.2), (11.4, 7.1), 10242),
    ],
)
def test_the_reports_hold_the_quoted_figures(
    run: str, n: tuple[int, int], ttft: tuple[float, float], e2e: tuple[float, float], real_steps: int
) -> None:
    poisson, bursty = _reports(run)
    assert (poisson.n_compared, bursty.n_compared) == n
    for report, want_ttft, want_e2e in zip((poisson, bursty), ttft, e2e, strict=True):
        assert report.metric("ttft").median_ape_pct == pytest.approx(want_ttft, abs=0.05)
        assert report.metric("e2e").median_ape_pct == pytest.approx(want_e2e, abs=0.05)
    assert poisson.steps is not None and poisson.steps.real.steps == real_steps
