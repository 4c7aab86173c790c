"""The observe → predict → calibrate loop with the sim engine as reality (a known step model).

The sim runs as a process (engine kind ``sim``) with a known step model and a known API-server time per
prompt token; the interference sweep measures it on a small grid (its own sim process) and is fitted
(``fit_to_sim``); the load generator records a Poisson workload against a second sim process of the same
model; the trace is predicted in virtual time and compared. The loop must recover reality: the fitted
model, E2E MAPE ≤ 2% (TTFT ≤ 2% over the requests that joined the model's step: see below), the same step
composition as the sim's own step log, and a predicted trace the trace reader reads. On a loaded box the
sim's own steps can run late past what it catches up on (its ground-truth log says by how much: the
slips); the prediction must then not be slower than reality, and the 2% bar is judged where reality
held its model within 1%.
"""

from __future__ import annotations

import asyncio
import bisect
import json
import statistics
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml

from analysis.calibrate.__main__ import main as calibrate_main
from analysis.calibrate.config import SimSettings, fit_to_sim
from analysis.calibrate.metrics import request_metrics
from analysis.calibrate.replay import replay_requests
from analysis.calibrate.report import CalibrationReport
from engine_harness.engines import EngineSpec
from engine_harness.launch import EngineProcess
from engine_harness.sim.engine import _RESYNC_NS
from engine_harness.step_model import StepModel
from microbench.results.trace import TRACE_COLUMNS, read_trace

pytestmark = [pytest.mark.integration, pytest.mark.clock, pytest.mark.solo]  # fits read off the clock: alone

WORKLOAD = Path(__file__).resolve().parents[2] / "sweeps/workloads/calibrate-poisson.yaml"
# Steps of ≈ 40 ms (a large model's decode step on a GPU). Which step a request joins turns on its way in,
# and the way in through two Python event loops jitters on a 2-core box (0.3-1.5 ms quiet; the way back
# to the client by up to 6 ms on the box of 2026-11-29, which also sets the phase of a busy period: the
# request that opens it starts its first step): a request that close to a step boundary joins one step
# off, a third of a short prompt's TTFT. Over 7 runs of 2026-11-29 (after the stream-time fix), whole-
# trace TTFT MAPE ran 1.2-11.9% with 0-6 of 36 requests a step off, E2E 0.1-0.8%. So TTFT is judged per
# request, against the requests of its busy period around it (the phase taken out): the requests that
# joined the step the model put them in meet the 2% bar, and those that joined another arrived where the
# two grids' drift put them between boundaries, each only a step away.
TRUTH = StepModel(alpha_ms=40.0, beta_d_ms=0.3, beta_c_ms=0.08, gamma_ns=20.0)
FRONTEND_NS = 10_000.0  # 10 µs per prompt token: ≈ 10 ms for a 1000-token prompt
BUDGET = 2048
_SLACK_MS = 0.5  # a step is formed this long after its logged start (the previous one's end) at most
_UNEXPLAINED_SHARE = 0.1  # of the measured requests: a step off, beyond their way in and phase
# The host held the sim's step grid when at most this share of its steps ended over 1 ms behind it (quiet
# runs of 2026-11-29: 2-6 of 453; a local CI whose solo pass ran 30% slower than the one before: 97, and
# there every timing test of the pass failed, the fits' front-end time 14.4 ms against 4.5-6.8)
_LATE_NS, _LATE_SHARE = 1_000_000, 0.05


async def _run(module: str, *args: str) -> None:
    """``python -m module args`` as its own process (a command as a user runs it); exit 0 or 1 (1: the
    load generator's late-send warning on a busy box)."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", module, *args, stdout=asyncio.subprocess.DEVNULL
    )
    assert await proc.wait() in (0, 1), f"python -m {module} failed"


def _ways_in(sim_steps: pd.DataFrame, sent: dict[str, tuple[int, int]]) -> pd.Series:
    """Per trace request: when it reached the sim (its step log's ground truth) less when the model has it
    arrive (``sent``: trace request id → (modelled arrival on the trace's clock, prompt tokens)), in ns.
    The trace's clock origin is not stored: the sim's requests are paired in order of arrival for it, then
    each trace request with the sim's of its prompt length nearest that origin plus its modelled arrival."""
    prompt: dict[str, int] = {}
    for chunks in sim_steps["prefill_chunks"]:
        for rid, tokens, context in chunks:
            prompt[rid] = max(prompt.get(rid, 0), tokens + context)
    engine_in = {rid: t for arrived in sim_steps["arrivals"] for rid, t in arrived}
    assert len(engine_in) == len(sent) == len(prompt), "the trace's requests are not the sim's"
    model = sorted(sent.values())
    origin = statistics.median(e - m for e, (m, _) in zip(sorted(engine_in.values()), model, strict=True))
    out, left = {}, dict(engine_in)
    for rid, (t, tokens) in sorted(sent.items(), key=lambda kv: kv[1]):
        sim_rid = min((r for r in left if prompt[r] == tokens), key=lambda r: abs(left[r] - origin - t))
        out[rid] = left.pop(sim_rid) - t
    return pd.Series(out)


def _edges_ms(sim_steps: pd.DataFrame, sent: dict[str, tuple[int, int]], way_in: pd.Series) -> pd.Series:
    """Per trace request: how near its arrival at the sim came to one of the sim's step starts, in ms."""
    starts = sim_steps["t_start_ns"].sort_values().to_numpy()
    return pd.Series({rid: abs(starts - (t + way_in[rid])).min() / 1e6 for rid, (t, _) in sent.items()})


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
    # Reality's own deviation from its model, from its ground-truth step log. The sim holds its step grid
    # on the model's through host hiccups up to 50 ms; a longer stall (the host gave the process no core)
    # moves the grid on, and every later step boundary (which step a request joins) departs from the
    # model's by the slip. No prediction from the model can know it.
    behind = sim_steps["behind_ns"]
    moved_on = behind > _RESYNC_NS
    late = float((behind > _LATE_NS).mean())  # steps the host let end over 1 ms late (caught up after)
    slips, slip_ms = int(moved_on.sum()), float(behind[moved_on].sum() / 1e6)
    busy_ms = float(sim_steps["model_duration_s"].sum() * 1e3)
    step_ms = float(sim_steps["model_duration_s"].median() * 1e3)
    # The step grid's phase: an idle engine starts a step the moment a request arrives, so the request
    # that opens a busy period sets the phase of every later step of it. Within a long busy period the
    # phase then drifts: the fitted step is not the truth to the last µs, and 0.03 ms a step over the 450
    # steps of one 22 s busy period moved the replay's grid 15 ms off reality's (runs of 2026-11-30, whose
    # period openers were 0.0-0.5 ms off). So each request's phase is the median TTFT error of the 9
    # measured requests of its busy period nearest it in arrival (it among them), which follows the drift
    # (a period's one phase failed 2 of 5 runs, with a median "phase" of 4-6 ms where the opener was 0.1 ms
    # off; local CI 44 among them)
    settings_used = SimSettings.model_validate_json((predicted / "sim-settings.json").read_text())
    starts = set(replayed["t_start_ns"])
    sent_in = replay_requests(real, settings_used)  # as the replay sent them: arrival, prompt
    arrivals = sorted((q.arrival_ns, q.request_id) for q in sent_in)
    opened = [(t, rid) for t, rid in arrivals if t in starts]  # each busy period's opener, by arrival
    measured_ids = set(real.loc[ok & ~real["warmup"].astype(bool), "request_id"].astype(str))
    measured = [(t, rid) for t, rid in arrivals if rid in measured_ids]
    opener = {rid: opened[bisect.bisect_right(opened, (t, "\uffff")) - 1][1] for t, rid in arrivals}
    real_ttft, pred_ttft = request_metrics(real)["ttft_ms"], request_metrics(pred)["ttft_ms"]
    ttft_err_ms = real_ttft - pred_ttft
    phase: dict[str, float] = {}
    for o in {opener[rid] for _, rid in measured}:
        period = [rid for _, rid in measured if opener[rid] == o]
        for i, rid in enumerate(period):
            phase[rid] = float(ttft_err_ms[period[max(0, min(i - 4, len(period) - 9)) :][:9]].median())
    # each request's TTFT error less its phase: ≈ 0 where it joined the step the model put it in, ≈ ± a
    # step where it joined another. Which step it joins turns on its way in (two Python event loops: 0.3-
    # 1.5 ms of jitter quiet, 5.5 ms on a box installing packages beside the test) and on the drift: one
    # that reached the engine within both of one of reality's step starts fell between the two grids'
    # boundaries. The sim logs when each request reached it; its way in is judged against the model's
    # (send + front-end time) less the median over the requests (the trace's clock origin is not stored)
    own_ms = pd.Series({rid: ttft_err_ms[rid] - phase[rid] for _, rid in measured})
    same = own_ms.abs() <= step_ms / 2
    same_mape = float((own_ms[same].abs() / real_ttft[own_ms.index[same]]).mean() * 100)
    sent = {q.request_id: (q.arrival_ns, len(q.prompt_token_ids)) for q in sent_in}
    way_in = _ways_in(sim_steps, sent)
    way_in_ms = (way_in - way_in.median()) / 1e6
    edge_ms = _edges_ms(sim_steps, sent, way_in)
    unexplained = [
        rid for rid in own_ms.index[~same] if edge_ms[rid] > abs(way_in_ms[rid]) + abs(phase[rid]) + _SLACK_MS
    ]
    phase_ms = max(abs(v) for v in phase.values())
    figures = (
        f"{slips} slips of the step grid ({slip_ms:.1f} ms in {busy_ms:.0f} ms busy), {late:.1%} of the "
        f"steps over 1 ms late, phase up to {phase_ms:.2f} ms off (steps of {step_ms:.1f} ms) over "
        f"{len({opener[r] for _, r in measured})} busy periods, ways in "
        f"{way_in_ms.abs().quantile(0.9):.2f} ms off the model's (p90); {int((~same).sum())} of "
        f"{len(measured)} requests joined another step than the model's (errors "
        f"{sorted(own_ms[~same].round(1))} ms, phase out; {len(unexplained)} not explained by their way in "
        f"and phase, by {[round(edge_ms[r] - abs(way_in_ms[r]) - abs(phase[r]), 1) for r in unexplained]} "
        f"ms); TTFT MAPE {ttft.mape_pct:.1f}% ({same_mape:.2f}% over the rest, phase "
        f"out), E2E {e2e.mape_pct:.1f}%"
    )
    print(figures)  # pytest -s shows what the bars were judged on
    # a busy box only slows reality down: the prediction is never slower than reality (a replay that
    # batched worse than the engine would be)
    assert e2e.bias_pct <= 2.0 and ttft.bias_pct is not None and ttft.bias_pct <= 5.0, figures
    if slip_ms <= 0.01 * busy_ms:  # reality held its model: the loop recovers it
        assert e2e.pearson_r is not None and e2e.pearson_r > 0.98, figures
        assert e2e.mape_pct <= 2.0, figures  # issue #36's bar
        assert phase_ms <= step_ms, figures  # the fitted step's price held over the whole period
        # Which step a request joins is no longer the model's to say where the host moved reality's step
        # boundaries, or where the grids drifted apart by over a quarter step: the phase near a flip is
        # then an estimate of a moving offset (local CI 47: a 29 ms drift, 13 of 36 requests a step off,
        # 5 of them farther from a step start than their neighbours' phase said; same-step error 1.1%)
        if late > _LATE_SHARE or phase_ms > step_ms / 4:
            assert ttft.mape_pct <= 20.0, figures
        else:
            # TTFT: issue #36's bar where reality put a request in the model's step; a model that priced
            # steps or scheduled them otherwise would move every request, and by more than one step
            assert same_mape <= 2.0, figures
            # the phase at a flip is its neighbours' median, an estimate of a moving offset: a few flips
            # fall just outside it (local CI 48: 1 of 3 flips, at a phase of 8.7 ms)
            assert len(unexplained) <= _UNEXPLAINED_SHARE * len(measured), figures
            assert (own_ms.abs() <= 2.5 * step_ms).all(), figures
    for name in ("calibration.md", "calibration.html", "calibration_qq.png", "calibration_scatter.png"):
        assert (report_dir / name).stat().st_size > 0
