"""The committed calibration runs on the CPU engines (results/calibrate-{vllm,sglang}-cpu,
results/calibrate-{vllm,sglang}-cpu-isolated, results/calibrate-{vllm,sglang}-cpu-prefill-extra and
results/calibrate-{vllm,sglang}-cpu-distinct-prefixes, results/calibrate-{vllm,sglang}-cpu-repeat,
results/README.md)
and the repeatability run results/repeat-vllm-cpu-poisson-x4:
their predictions are what ``analysis.calibrate predict`` makes of their fit and traces today, and their
reports say what the READMEs quote."""

from __future__ import annotations

import itertools
from pathlib import Path

import pandas as pd
import pytest

from analysis.calibrate import stats
from analysis.calibrate.__main__ import main as calibrate_main
from analysis.calibrate.config import SimSettings, fit_to_sim
from analysis.calibrate.metrics import request_metrics, split_requests
from analysis.calibrate.predict import predict_trace
from analysis.calibrate.repeat import same_schedule
from analysis.calibrate.report import CalibrationReport
from microbench.results.trace import read_trace

RESULTS = Path(__file__).resolve().parents[2] / "results"


@pytest.mark.parametrize(
    "run",
    [
        "calibrate-vllm-cpu",
        "calibrate-vllm-cpu-isolated",
        "calibrate-vllm-cpu-prefill-extra",
        "calibrate-sglang-cpu",
        "calibrate-sglang-cpu-prefill-extra",
        "calibrate-sglang-cpu-isolated",
        "calibrate-sglang-cpu-distinct-prefixes",
        "calibrate-vllm-cpu-distinct-prefixes",
        "calibrate-vllm-cpu-repeat",
        "calibrate-sglang-cpu-repeat",
    ],
)
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
        # the engine logs of the two older runs were not kept (their boxes are gone): no step comparison
        ("calibrate-vllm-cpu", (296, 259), (6.6, 7.5), (4.5, 5.4), None),
        ("calibrate-vllm-cpu-isolated", (296, 259), (16.6, 12.2), (13.1, 7.2), 9018),
        ("calibrate-vllm-cpu-prefill-extra", (296, 259), (4.3, 7.1), (5.1, 4.6), 10689),
        ("calibrate-sglang-cpu", (252, 241), (10.9, 7.7), (11.9, 8.1), None),
        ("calibrate-sglang-cpu-prefill-extra", (252, 241), (9.3, 8.3), (11.1, 8.4), 10214),
        ("calibrate-sglang-cpu-isolated", (252, 241), (6.5, 11.4), (4.6, 6.3), 9900),
        ("calibrate-sglang-cpu-distinct-prefixes", (252, 241), (9.4, 8.3), (9.5, 7.7), 9830),
        ("calibrate-vllm-cpu-distinct-prefixes", (296, 259), (4.8, 4.7), (7.3, 4.0), 10201),
        ("calibrate-vllm-cpu-repeat", (296, 259), (3.9, 3.7), (6.2, 2.8), 10549),
        ("calibrate-sglang-cpu-repeat", (252, 241), (5.7, 8.0), (10.4, 5.6), 9824),
    ],
)
def test_the_reports_hold_the_quoted_figures(
    run: str, n: tuple[int, int], ttft: tuple[float, float], e2e: tuple[float, float], real_steps: int | None
) -> None:
    poisson, bursty = _reports(run)
    assert (poisson.n_compared, bursty.n_compared) == n
    for report, want_ttft, want_e2e in zip((poisson, bursty), ttft, e2e, strict=True):
        assert report.metric("ttft").median_ape_pct == pytest.approx(want_ttft, abs=0.05)
        assert report.metric("e2e").median_ape_pct == pytest.approx(want_e2e, abs=0.05)
    assert (poisson.steps.real.steps if poisson.steps is not None else None) == real_steps


def test_the_isolated_fit_charges_prefill_steps_and_takes_it_out_of_the_front_end() -> None:
    settings = fit_to_sim(RESULTS / "calibrate-vllm-cpu-isolated" / "fit")
    # 2.22 [1.39, 3.06] ms per prefill step + 1250 [540, 1950] ns per prompt token (results/README.md)
    assert settings.prefill_extra_ms == pytest.approx(2.22, abs=0.005)
    assert settings.prefill_extra_ns_per_token == pytest.approx(1250, abs=5)
    assert any(
        m.startswith("prefill extra per prompt-carrying step: 2.22 [1.39, 3.06] ms") for m in settings.matched
    )
    # the front end without what the replay now charges twice: 8.0 ms + 1118 ns per token before
    assert settings.frontend_fixed_ms == pytest.approx(5.86, abs=0.005)
    assert settings.frontend_ns_per_token == pytest.approx(7.8, abs=0.1)
    assert settings.beyond_log_ms(1, 2048) == pytest.approx(
        settings.stream_fixed_ms + settings.stream_ms_per_token + 2.22 + 1250e-6 * 2048, abs=0.02
    )


def test_predict_without_the_prefill_extra_fits_the_front_end_without_it(tmp_path: Path) -> None:
    folder = RESULTS / "calibrate-vllm-cpu-prefill-extra"
    outs = {flag: tmp_path / f"pred{len(flag)}" for flag in ((), ("--no-prefill-extra",))}
    for flag, out in outs.items():
        args = ["predict", str(folder / "observe-bursty"), "--model", str(folder / "fit"), "--out", str(out)]
        assert calibrate_main([*args, *flag]) == 0
    plain = SimSettings.model_validate_json((outs[("--no-prefill-extra",)] / "sim-settings.json").read_text())
    charged = SimSettings.model_validate_json((outs[()] / "sim-settings.json").read_text())
    assert plain.prefill_extra_ms == 0.0 and "prefill extra=0 (--no-prefill-extra)" in plain.defaulted
    assert charged.prefill_extra_ms == pytest.approx(1.97, abs=0.005)  # results/README.md
    # the front end keeps what the replay no longer charges: 1.5 ms more per request here
    assert plain.frontend_fixed_ms == pytest.approx(4.72, abs=0.005)
    assert charged.frontend_fixed_ms == pytest.approx(3.19, abs=0.005)
    # the prediction without the term: a prompt-carrying step ends sooner, no request's first token later
    _, with_extra = read_trace(outs[()])
    _, without = read_trace(outs[("--no-prefill-extra",)])
    assert (without["last_chunk_ns"] <= with_extra["last_chunk_ns"] + 5_000_000).mean() > 0.9


@pytest.mark.parametrize(
    ("run", "workload", "model", "repeat"),
    [
        # E2E median APE (predicted, the engine's repeat) of each run against the other (results/README.md)
        ("calibrate-vllm-cpu-repeat", "poisson", 6.2, 11.4),
        ("calibrate-vllm-cpu-repeat", "poisson-repeat", 7.6, 10.2),
        ("calibrate-vllm-cpu-repeat", "bursty", 2.8, 18.5),
        ("calibrate-vllm-cpu-repeat", "bursty-repeat", 18.7, 15.9),
        ("calibrate-sglang-cpu-repeat", "poisson", 10.4, 6.6),
        ("calibrate-sglang-cpu-repeat", "poisson-repeat", 12.4, 6.8),
        ("calibrate-sglang-cpu-repeat", "bursty", 5.6, 5.4),
        ("calibrate-sglang-cpu-repeat", "bursty-repeat", 5.6, 5.6),
    ],
)
def test_the_repeat_runs_reproduce_their_floor(
    run: str, workload: str, model: float, repeat: float, tmp_path: Path
) -> None:
    """Each workload ran twice on one engine (results/calibrate-{vllm,sglang}-cpu-repeat): the report of each
    run, with the other as its repeat, made again from the committed traces, says what results/README.md
    quotes."""
    folder = RESULTS / run
    other = workload.removesuffix("-repeat") if workload.endswith("-repeat") else f"{workload}-repeat"
    predict_trace(folder / f"observe-{workload}", fit_to_sim(folder / "fit"), tmp_path / "pred")
    args = [
        str(folder / f"observe-{workload}"),
        str(tmp_path / "pred"),
        "--repeat",
        str(folder / f"observe-{other}"),
    ]
    assert calibrate_main(["report", *args, "--bootstrap", "100", "--out", str(tmp_path / "r")]) == 0
    fresh = CalibrationReport.model_validate_json((tmp_path / "r" / "calibration.json").read_text())
    kept = CalibrationReport.model_validate_json(
        (folder / f"report-{workload}" / "calibration.json").read_text()
    )
    assert fresh.repeat is not None and kept.repeat is not None
    for rows in (fresh.repeat.rows, kept.repeat.rows):
        e2e = next(r for r in rows if r.metric == "e2e")
        assert (e2e.model_median_ape_pct, e2e.repeat_median_ape_pct) == (
            pytest.approx(model, abs=0.05),
            pytest.approx(repeat, abs=0.05),
        )


def test_four_runs_of_one_engine_on_one_schedule_differ_by_more_than_the_goal() -> None:
    """results/repeat-vllm-cpu-poisson-x4: one CPU vLLM engine ran the Poisson workload four times back to
    back (same schedule, new cold prompts). Each run against each other, E2E median APE 6.2-16.1% over the 12
    ordered pairs and TTFT 4.5-12.5% (results/README.md): none within issue #36's 5% E2E."""
    folder = RESULTS / "repeat-vllm-cpu-poisson-x4"
    frames = [read_trace(folder / f"observe-{i}")[1] for i in range(1, 5)]
    for frame in frames[1:]:
        same_schedule(frames[0], frame)
    e2e, ttft = [], []
    for a, b in itertools.permutations(frames, 2):
        ids = split_requests(a, b).compared
        assert len(ids) == 296
        ra, rb = request_metrics(a).loc[ids], request_metrics(b).loc[ids]
        e2e.append(stats.median_ape(ra["e2e_ms"].to_numpy(), rb["e2e_ms"].to_numpy()))
        ttft.append(stats.median_ape(ra["ttft_ms"].to_numpy(), rb["ttft_ms"].to_numpy()))
    assert (min(e2e), max(e2e)) == (pytest.approx(6.2, abs=0.05), pytest.approx(16.1, abs=0.05))
    assert (min(ttft), max(ttft)) == (pytest.approx(4.5, abs=0.05), pytest.approx(12.5, abs=0.05))
