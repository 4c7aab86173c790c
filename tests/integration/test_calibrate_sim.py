"""The observe → predict → calibrate loop with the sim engine as reality (a known step model).

The sim runs as a process (engine kind ``sim``) with a known step model and a known API-server time per
prompt token; the interference sweep measures it on a small grid (its own sim process) and is fitted
(``fit_to_sim``); the load generator records a Poisson workload against a second sim process of the same
model; the trace is predicted in virtual time and compared. The loop must recover reality: the fitted
model, E2E MAPE ≤ 2% (TTFT ≤ 2% where reality had no host stall: see below), the same step composition
as the sim's own step log, and a predicted trace the trace reader reads. On a loaded box the sim's own
steps run late (its ground-truth log says by how much: the stretch); the prediction must then
not be slower than reality, and the 2% bar is judged where reality held its model within 1%.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml

from analysis.calibrate.__main__ import main as calibrate_main
from analysis.calibrate.config import fit_to_sim
from analysis.calibrate.report import CalibrationReport
from engine_harness.engines import EngineSpec
from engine_harness.launch import EngineProcess
from engine_harness.step_model import StepModel
from microbench.results.trace import TRACE_COLUMNS, read_trace

pytestmark = pytest.mark.integration

WORKLOAD = Path(__file__).resolve().parents[2] / "sweeps/workloads/calibrate-poisson.yaml"
TRUTH = StepModel(alpha_ms=15.0, beta_d_ms=0.3, beta_c_ms=0.08, gamma_ns=20.0)
FRONTEND_NS = 10_000.0  # 10 µs per prompt token: ≈ 10 ms for a 1000-token prompt
BUDGET = 2048


async def _run(module: str, *args: str) -> None:
    """``python -m module args`` as its own process (a command as a user runs it); exit 0 or 1 (1: the
    load generator's late-send warning on a busy box)."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", module, *args, stdout=asyncio.subprocess.DEVNULL
    )
    assert await proc.wait() in (0, 1), f"python -m {module} failed"


async def test_loop_recovers_the_sim(tmp_path: Path) -> None:
    params = tmp_path / "truth.yaml"
    params.write_text(yaml.safe_dump({"frontend_ns_per_token": FRONTEND_NS, "step": TRUTH.model_dump()}))
    sweep = tmp_path / "sweep"
    await _run(
        "microbench.sweep", "--engine", "sim", "--chunk", str(BUDGET), "--D", "0", "2", "4", "8",
        "--P", "256", "1024", "2048", "4096", "--reps", "1", "--decode-context", "512",
        "--engine-args", f"--params {params}", "--out", str(sweep),
    )  # fmt: skip
    settings = fit_to_sim(sweep)
    assert settings.mode == "vllm" and settings.max_num_batched_tokens == BUDGET
    for name in ("alpha_ms", "beta_c_ms", "gamma_ns"):  # the sim reports its steps' model durations
        assert getattr(settings.step, name) == pytest.approx(getattr(TRUTH, name), rel=0.02), name
    assert settings.frontend_ns_per_token == pytest.approx(FRONTEND_NS, rel=0.25)

    steps_log = tmp_path / "sim-steps.jsonl"
    extra = ["--params", str(params), "--step-log", str(steps_log)]
    spec = EngineSpec(kind="sim", model="sim", chunk_size=BUDGET, extra_args=extra)
    trace = tmp_path / "observed"
    async with EngineProcess(spec, log_path=tmp_path / "sim.log") as engine:
        await _run(
            "microbench.loadgen", "run", "--workload", str(WORKLOAD), "--url", engine.base_url,
            "--rate", "2", "--duration", "15s", "--warmup-requests", "4", "--out", str(trace),
        )  # fmt: skip
    _, real = read_trace(trace)
    assert (real["status"] == "ok").sum() >= 30

    predicted, report_dir = tmp_path / "predicted", tmp_path / "report"
    assert calibrate_main(["predict", str(trace), "--model", str(sweep), "--out", str(predicted)]) == 0
    pred_head, pred = read_trace(predicted)  # the predicted trace round-trips through the trace reader
    assert tuple(pred.columns) == TRACE_COLUMNS and len(pred) == len(real)
    assert (pred["request_id"] == real["request_id"]).all() and pred_head.engine["kind"] == "prediction"
    ok = real["status"] == "ok"
    assert (pred.loc[ok, "output_tokens"] == real.loc[ok, "output_tokens"]).all()

    # step composition: the replay schedules the tokens the sim's own step log shows
    sim_steps = pd.DataFrame([json.loads(line) for line in steps_log.read_text().splitlines()])
    replayed = pd.read_parquet(predicted / "steps.parquet")
    assert replayed["prefill_tokens"].sum() == sim_steps["prefill_tokens"].sum()
    assert replayed["decode_tokens"].sum() == sim_steps["decode_tokens"].sum()
    assert abs(len(replayed) - len(sim_steps)) <= 0.1 * len(sim_steps)

    assert calibrate_main(["report", str(trace), str(predicted), "--out", str(report_dir)]) == 0
    report = CalibrationReport.model_validate_json((report_dir / "calibration.json").read_text())
    assert report.warmup_excluded == 4 and report.n_compared == ok.sum() - 4
    ttft, e2e = report.metric("ttft"), report.metric("e2e")
    assert ttft.mape_pct is not None and e2e.mape_pct is not None and e2e.bias_pct is not None
    # Reality's own deviation from its model, from its ground-truth step log: on a loaded box the sim's
    # steps run late (the process waits for a core), and no prediction from the model can know by how much.
    stretch = sim_steps["duration_ns"].sum() / (sim_steps["model_duration_s"].sum() * 1e9)
    # a host stall: a step ending over 1 ms past its model time; the sim's clock then moves on, and every
    # later step boundary (which step a request joins) departs from the model's by as much
    stalls = int((sim_steps["duration_ns"] - sim_steps["model_duration_s"] * 1e9 > 1e6).sum())
    figures = (
        f"stretch {stretch:.3f}, {stalls} stalls, TTFT MAPE {ttft.mape_pct:.1f}%, E2E {e2e.mape_pct:.1f}%"
    )
    print(figures)  # pytest -s shows what the bars were judged on
    # a busy box only slows reality down: the prediction is never slower than reality (a replay that
    # batched worse than the engine would be)
    assert e2e.bias_pct <= 2.0 and ttft.bias_pct is not None and ttft.bias_pct <= 5.0, figures
    if stretch <= 1.01:  # reality held its model: the loop recovers it
        assert e2e.pearson_r is not None and e2e.pearson_r > 0.98, figures
        assert e2e.mape_pct <= 2.0, figures  # issue #36's bar (measured on a quiet box: 0.7%)
        # TTFT turns on which 15 ms step a request joins: a tenth of a short prompt's TTFT. Issue #36's 2%
        # where reality held its model step by step (no host stall); else each stall re-phases the step
        # grid (measured on this 2-core box shared by 8 jobs, 21-35 stalls in 15 s: 3.7-7.3%)
        assert ttft.mape_pct <= (2.0 if stalls == 0 else 10.0), figures
    for name in ("calibration.md", "calibration.html", "calibration_qq.png", "calibration_scatter.png"):
        assert (report_dir / name).stat().st_size > 0
