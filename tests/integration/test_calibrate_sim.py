"""The observe → predict → calibrate loop with the sim engine as reality (a known step model).

The sim runs as a process (engine kind ``sim``) with a known step model and a known API-server time per
prompt token; the interference sweep measures it on a small grid (its own sim process) and is fitted
(``fit_to_sim``); the load generator records a Poisson workload against a second sim process of the same
model; the trace is predicted in virtual time and compared. The loop must recover reality: the fitted
model's terms, a predicted trace the trace reader reads with the sim's tokens, E2E MAPE ≤ 2%; from the
arrivals reality had, the replay must plan and price every step the sim ran, TTFT and E2E within 2%; and
where reality's ways in held to the model's (p10-p90 within 1 ms), the prediction's TTFT within 2% too,
over what their constant offset from the fitted way in moves every TTFT by.

Why from reality's arrivals. Which step a request joins turns on its way in: the load generator's send to
the sim's handler, through two Python event loops. On the 2-core boxes that strays from request to request
by ms (p10-p90 −2.4 to −0.4 ms about its model, quiet, 2026-11-30; a constant offset moves every request
alike and changes nothing). A request that near a step boundary joins the step next to the model's, a
third of a short prompt's TTFT. Over 6 quiet runs the prediction's whole-trace TTFT MAPE was 1.1-8.3%
from that alone, while the replay from reality's arrivals missed by 0.01-0.09%. The sim logs when each
request reached it (its ground truth, on the host's monotonic clock, which the trace's header anchors too).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml

from analysis.calibrate.__main__ import main as calibrate_main
from analysis.calibrate.config import SimSettings, fit_to_sim
from analysis.calibrate.replay import replay, replay_requests
from analysis.calibrate.report import CalibrationReport
from engine_harness.engines import EngineSpec
from engine_harness.launch import EngineProcess
from engine_harness.sim.engine import _RESYNC_NS
from engine_harness.step_model import StepModel
from microbench.results.trace import TRACE_COLUMNS, read_trace

pytestmark = [pytest.mark.integration, pytest.mark.clock, pytest.mark.solo]  # fits read off the clock: alone

WORKLOAD = Path(__file__).resolve().parents[2] / "sweeps/workloads/calibrate-poisson.yaml"
# Steps of ≈ 40 ms (a large model's decode step on a GPU): a request that joins the step next to the
# model's is a step off, a third of a short prompt's TTFT (see the module's text for why that happens)
TRUTH = StepModel(alpha_ms=40.0, beta_d_ms=0.3, beta_c_ms=0.08, gamma_ns=20.0)
FRONTEND_NS = 10_000.0  # 10 µs per prompt token: ≈ 10 ms for a 1000-token prompt
BUDGET = 2048
# The host held the sim's step grid when at most this share of its steps ended over 1 ms behind it (quiet
# runs of 2026-11-29: 2-6 of 453; a local CI whose solo pass ran 30% slower than the one before: 97, and
# there every timing test of the pass failed, the fits' front-end time 14.4 ms against 4.5-6.8)
_LATE_NS, _LATE_SHARE = 1_000_000, 0.05
_COMPOSITION = ["decode_tokens", "prefill_tokens"]
_BEYOND_LOG = ("stream_fixed_ms", "stream_ms_per_token", "prefill_extra_ms", "prefill_extra_ns_per_token")


async def _run(module: str, *args: str) -> None:
    """``python -m module args`` as its own process (a command as a user runs it); exit 0 or 1 (1: the
    load generator's late-send warning on a busy box)."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", module, *args, stdout=asyncio.subprocess.DEVNULL
    )
    assert await proc.wait() in (0, 1), f"python -m {module} failed"


def _engine_side(sim_steps: pd.DataFrame, real: pd.DataFrame, origin_ns: int | None) -> pd.DataFrame:
    """Per completed trace request, from the sim's ground-truth step log, on the trace's clock: when it
    reached the engine, and the ends of the steps that gave it its first and its last token. The sim does
    not know the trace's request ids: each trace request, in order of sending, is the first request of its
    prompt length the sim saw after it was sent."""
    assert origin_ns is not None, "the trace's header has no monotonic origin"
    prompt: dict[str, int] = {}
    for chunks in sim_steps["prefill_chunks"]:
        for rid, tokens, context in chunks:
            prompt[rid] = max(prompt.get(rid, 0), tokens + context)
    first: dict[str, int] = {}
    last: dict[str, int] = {}
    for step in sim_steps.itertuples():
        end = step.t_start_ns + step.duration_ns - origin_ns
        partial = {rid for rid, tokens, context in step.prefill_chunks if tokens + context < prompt[rid]}
        for rid in set(step.request_ids) - partial:  # its prompt's last chunk, or a decode: a token
            first.setdefault(rid, end)
            last[rid] = end
    left = sorted((t - origin_ns, rid) for arrived in sim_steps["arrivals"] for rid, t in arrived)
    rows = {}
    for row in real.loc[real["status"] == "ok"].sort_values("send_ns").itertuples():
        tokens = int(row.input_tokens) if pd.notna(row.input_tokens) else int(row.prompt_tokens)
        i = next(i for i, (t, rid) in enumerate(left) if prompt[rid] == tokens and t > row.send_ns)
        t, rid = left.pop(i)
        rows[str(row.request_id)] = {"arrived_ns": t, "first_ns": first[rid], "last_ns": last[rid]}
    assert not left, "the sim saw requests the trace did not send"
    return pd.DataFrame.from_dict(rows, orient="index")


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
    # the sweep reads the sim's steps on its own clock (their model durations), so the fit is exact (read off
    # wall times, γ came out 20.41 in the CI of ecbab4c: a busy event loop's late steps)
    for name in ("alpha_ms", "beta_c_ms", "gamma_ns"):
        assert getattr(settings.step, name) == pytest.approx(getattr(TRUTH, name), rel=1e-3), name
    assert settings.frontend_ns_per_token == pytest.approx(FRONTEND_NS, rel=0.25)
    # one decode context: the decodes' context cost cannot be told from β_d, so it is not fitted (it once
    # was, from a loaded box's noise, and priced the replay's longer contexts 4% high)
    assert settings.step.delta_ns == 0.0 and settings.step.beta_d_ms == pytest.approx(
        TRUTH.beta_d_ms, rel=0.1
    )

    steps_log = tmp_path / "sim-steps.jsonl"
    extra = ["--params", str(params), "--step-log", str(steps_log)]
    spec = EngineSpec(kind="sim", model="sim", chunk_size=BUDGET, extra_args=extra)
    trace = tmp_path / "observed"
    async with EngineProcess(spec, log_path=tmp_path / "sim.log") as engine:
        await _run(
            "microbench.loadgen", "run", "--workload", str(WORKLOAD), "--url", engine.base_url,
            "--rate", "2", "--duration", "15s", "--warmup-requests", "4", "--out", str(trace),
        )  # fmt: skip
    real_head, real = read_trace(trace)
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
    # Reality's own deviation from its model, from its ground-truth step log. The sim holds its step grid
    # on the model's through host hiccups up to 50 ms (late steps deliver their tokens late, but a request
    # joins the step the grid says: test_sim_admission); a longer stall (the host gave the process no core)
    # moves the grid on, and every later step boundary departs from the model's by the slip. No prediction
    # from the model can know it.
    behind = sim_steps["behind_ns"]
    moved_on = behind > _RESYNC_NS
    late = float((behind > _LATE_NS).mean())  # steps the host let end over 1 ms late (caught up after)
    slips, slip_ms = int(moved_on.sum()), float(behind[moved_on].sum() / 1e6)
    busy_ms = float(sim_steps["model_duration_s"].sum() * 1e3)

    # The replay of the sim's own model (no stream time: the sim's step log holds all of its time) from the
    # arrivals reality had, judged on the engine's side (arrival to the step end that gave a token, as
    # vLLM's own TTFT metric counts): does the replay schedule and time what the engine did? The fitted
    # model is judged above by its terms; replayed, a term that only noise put there (a stream time of
    # 0.034 ms a step, its 95% CI above 0 in 1 of 8 runs of 2026-11-30) moves every later step boundary
    # of a 450-step busy period by 15 ms, and which step a request joins with them
    settings_used = SimSettings.model_validate_json((predicted / "sim-settings.json").read_text())
    sent = replay_requests(real, settings_used)
    sim_side = _engine_side(sim_steps, real, real_head.session_start_perf_ns)
    reality_model = settings_used.model_copy(update=dict.fromkeys(_BEYOND_LOG, 0.0) | {"step": TRUTH})
    given = replay(
        sorted(
            (dataclasses.replace(q, arrival_ns=int(sim_side.at[q.request_id, "arrived_ns"])) for q in sent),
            key=lambda q: q.arrival_ns,
        ),
        reality_model,
    )
    measured = real.loc[ok & ~real["warmup"].astype(bool), "request_id"].astype(str)
    truth = sim_side.loc[measured]
    model = pd.DataFrame(
        {
            "first_ns": [given.token_ns[r][0] for r in measured],
            "last_ns": [given.token_ns[r][-1] for r in measured],
        },
        index=measured,
    )

    def mape(end: str) -> float:  # of the engine's time from arrival to the step end named
        spent = truth[end] - truth["arrived_ns"]
        return float(((model[end] - truth[end]).abs() / spent).mean() * 100)

    way_in_ms = pd.Series(
        {q.request_id: sim_side.at[q.request_id, "arrived_ns"] - q.arrival_ns for q in sent}
    )
    way_in_ms = way_in_ms[measured] / 1e6  # reality's way in less the model's
    figures = (
        f"{slips} slips of the step grid ({slip_ms:.1f} ms in {busy_ms:.0f} ms busy), {late:.1%} of the "
        f"steps over 1 ms late; ways in off the model's by {way_in_ms.median():+.2f} ms (median), "
        f"{way_in_ms.quantile(0.1):+.2f} to {way_in_ms.quantile(0.9):+.2f} (p10-p90); from reality's "
        f"arrivals, on the engine's side: TTFT MAPE {mape('first_ns'):.2f}%, E2E {mape('last_ns'):.2f}%; the "
        f"prediction's TTFT {ttft.mape_pct:.1f}% (bias {ttft.bias_pct:+.1f}%), E2E {e2e.mape_pct:.2f}% (bias "
        f"{e2e.bias_pct:+.2f}%)"
    )
    print(figures)  # pytest -s shows what the bars were judged on
    # a busy box only slows reality down: the prediction is never slower than reality (a replay that
    # batched worse than the engine would be)
    assert e2e.bias_pct <= 2.0 and ttft.bias_pct is not None and ttft.bias_pct <= 5.0, figures
    if slip_ms <= 0.01 * busy_ms:  # reality held its model's grid: the loop recovers it
        assert e2e.pearson_r is not None and e2e.pearson_r > 0.98, figures
        assert e2e.mape_pct <= 2.0, figures  # issue #36's bar, for the prediction itself
        # issue #36's TTFT bar, for the model given reality's arrivals (a model that priced or scheduled
        # steps otherwise would move every request); a box that let over 5% of the sim's steps end late
        # delivered their tokens late (local CI 47: a 30% slower solo pass), judged against 10%
        bar = 2.0 if late <= _LATE_SHARE else 10.0
        assert mape("first_ns") <= bar and mape("last_ns") <= bar, figures
        # the prediction starts each request from the client's send and the fitted way in; where reality's
        # ways in held to the model's (their p10-p90 within 1 ms: 0.6-0.9 ms in quiet runs of 2026-11-30,
        # prediction 0.4-0.6%), issue #36's bar holds for the prediction itself; a box that let them stray
        # by 2-5 ms (the day before) moved requests a step, by at most that: 0.2-7.3% over 7 runs
        strayed = way_in_ms.quantile(0.9) - way_in_ms.quantile(0.1) > _LATE_NS / 1e6
        # The way in is the host's HTTP path, fitted on the sweep's minutes, not the sim's model: where the
        # observed minutes ran it faster or slower by a constant (local CI 66: −0.93 ms, p10-p90 within 0.77
        # ms; prediction 2.4%, bias +2.4%, r 1.000), every TTFT moves by that much. Over the 2%, the bar
        # allows that share of each request's TTFT, nothing more (a request that joins a step off moves by
        # a whole step: tens of percent of a short prompt's TTFT)
        times = real.set_index(real["request_id"].astype(str)).loc[measured]
        first_ms = (times["first_chunk_ns"] - times["send_ns"]).astype(float) / 1e6
        offset_pct = float((abs(way_in_ms.median()) / first_ms).mean() * 100)
        ttft_bar = 20.0 if strayed else 2.0 + offset_pct
        assert ttft.mape_pct <= ttft_bar, f"{figures}; the constant way-in offset: {offset_pct:.1f}% of TTFT"
    if slips == 0:  # from the same arrivals, the replay plans every step the engine ran, and prices it alike
        planned = given.steps_frame()
        ran_shapes, planned_shapes = (f[_COMPOSITION].to_numpy().tolist() for f in (sim_steps, planned))
        assert ran_shapes == planned_shapes, figures
        priced = planned["duration_ns"].to_numpy() - sim_steps["engine_ns"].to_numpy()
        assert abs(priced).max() <= 1_000, figures  # ns: the two round the same model time
    for name in ("calibration.md", "calibration.html", "calibration_qq.png", "calibration_scatter.png"):
        assert (report_dir / name).stat().st_size > 0
