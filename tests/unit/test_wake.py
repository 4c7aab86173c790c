"""The wake cost: its table (engine_harness.wake_model), its fit from a probe (analysis.calibrate.wake) and
the replay charging it, on hand-built data with hand-computed answers."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from pydantic import ValidationError

from analysis.calibrate.__main__ import main
from analysis.calibrate.config import FitSummary, SimSettings, fit_to_sim
from analysis.calibrate.replay import ReplayRequest, replay
from analysis.calibrate.wake import fit_wake
from analysis.synthetic import synthesize_run
from engine_harness.step_model import StepModel
from engine_harness.wake_model import WakeCost
from microbench.measure.grid import SweepConfig, shard_plans
from microbench.measure.plan import split_plans
from microbench.results.layout import RunFolder
from microbench.results.trace import INT_COLUMNS, TRACE_COLUMNS, TraceHeader, read_trace, write_trace_files
from microbench.results.wake import WakeProbeConfig, WakeProbeRecord, WakeSample

MS = 1_000_000


def _row(i: int, send_ms: float) -> dict[str, Any]:
    """One completed request of a trace: 256 prompt tokens, 2 output tokens, sent at ``send_ms``."""
    row: dict[str, Any] = dict.fromkeys(TRACE_COLUMNS)
    row.update(
        request_id=str(i), stage="s", warmup=False, client_id="c", tenant_id="", slo_class="", session_id="",
        round_index=0, prefix_group="", prefix_tokens=0, streaming=True, prompt_tokens=256, max_tokens=2,
        input_tokens=256, output_tokens=2, send_ns=int(send_ms * MS), status="ok", http_status=200,
        chunk_ns=[], chunk_tokens=[],
    )  # fmt: skip
    return row


def _frame(rows: list[dict[str, Any]]) -> pd.DataFrame:
    frame = pd.DataFrame(rows, columns=list(TRACE_COLUMNS))
    for c in INT_COLUMNS:
        frame[c] = frame[c].astype("Int64")
    return frame


def test_wake_cost_interpolates_in_log_idle() -> None:
    cost = WakeCost(points=[(0.02, 0.0), (0.2, 40.0), (2.0, 100.0)])
    assert cost.extra_ms(0.01) == 0.0 and cost.extra_ms(0.0) == 0.0  # below a 0 first point: 0
    assert cost.extra_ms(0.2) == pytest.approx(40.0)
    assert cost.extra_ms(math.sqrt(0.2 * 2.0)) == pytest.approx(70.0)  # half way in log: the mean
    assert cost.extra_ms(math.sqrt(0.02 * 0.2)) == pytest.approx(20.0)
    assert cost.extra_ms(50.0) == 100.0  # past the last point: its value
    one = WakeCost(points=[(0.1, 10.0)])
    assert one.extra_ms(0.05) == pytest.approx(5.0) and one.extra_ms(1.0) == 10.0  # linear to 0 below
    assert WakeCost().extra_ms(5.0) == 0.0  # no table: no cost


@pytest.mark.parametrize(
    "points", [[(0.2, 1.0), (0.1, 2.0)], [(0.1, 1.0), (0.1, 2.0)], [(0.0, 1.0)], [(0.1, -1.0)]]
)
def test_wake_cost_refuses_a_table_out_of_order_or_negative(points: list[tuple[float, float]]) -> None:
    with pytest.raises(ValidationError):
        WakeCost(points=points)


def _probe(samples: list[tuple[float, float | None, int | None]], chunk: int = 2048) -> WakeProbeRecord:
    config = WakeProbeConfig(gaps_s=sorted({g for g, _, _ in samples}), repetitions=3)
    return WakeProbeRecord(
        chunk_size=chunk,
        config=config,
        samples=[
            WakeSample(gap_s=g, idle_s=g, ttft_ms=t, cached_prompt_tokens=c, error=None if t else "broken")
            for g, t, c in samples
        ],
    )


def test_fit_wake_gives_each_gaps_median_over_the_shortest_gaps() -> None:
    probe = _probe(
        [
            *[(0.02, 30.0, 0), (0.02, 32.0, 0), (0.02, 31.0, 1), (0.02, 29.0, 0)],  # median 30.5
            *[(1.0, 100.0, 0), (1.0, 110.0, 0), (1.0, 90.0, 0), (1.0, 5.0, 64)],  # a warm prompt: out
            *[(0.3, 60.0, 0), (0.3, None, None), (0.3, 70.0, 0)],  # a failed one: out, and too few left
        ]
    )
    fit = fit_wake([probe])
    assert [r.gap_s for r in fit.rows] == [0.02, 1.0] and fit.dropped == [0.3]
    assert fit.excluded == 2
    ref, one = fit.rows
    assert ref.ttft_ms == pytest.approx(30.5) and ref.extra_ms == 0.0 and ref.n == 4
    assert one.extra_ms == pytest.approx(100.0 - 30.5) and one.n == 3
    low, high = one.extra_ci_ms
    assert 90.0 - 32.0 <= low <= one.extra_ms <= high <= 110.0 - 29.0  # within the samples' extremes
    assert fit.cost.points == [(0.02, 0.0), (1.0, pytest.approx(69.5))]
    assert "1 s +69.5" in fit.text() and "2 samples left out" in fit.text()
    assert fit_wake([probe]).rows == fit.rows  # seeded: the same interval every time


def test_fit_wake_needs_a_warm_reference() -> None:
    with pytest.raises(ValueError, match="no wake probe"):
        fit_wake([])
    short = _probe([(0.02, 30.0, 0), (0.02, 31.0, 0), (1.0, 90.0, 0), (1.0, 95.0, 0), (1.0, 99.0, 0)])
    with pytest.raises(ValueError, match="no warm reference"):
        fit_wake([short])


def _settings(wake: WakeCost) -> SimSettings:
    base: dict[str, Any] = dict(
        kind="sim", mode="vllm", max_num_batched_tokens=2048, max_num_seqs=8, block_size=16,
        num_kv_blocks=4096, enable_prefix_caching=False, max_model_len=16384, frontend_ns_per_token=0.0,
        frontend_fixed_ms=0.0, step=StepModel(alpha_ms=1.0, beta_d_ms=0.0, beta_c_ms=0.01, gamma_ns=0.0),
        wake=wake, fit=FitSummary(run="hand-built", candidate="c", r2=1.0, loo_step_mape_pct=0.0, n_steps=1),
    )  # fmt: skip
    return SimSettings.model_validate(base)


def test_the_replay_charges_the_first_step_after_an_idle_spell() -> None:
    wake = WakeCost(points=[(0.01, 0.0), (1.0, 50.0)])
    requests = [
        ReplayRequest("a", 0, list(range(100)), 2),  # 100-token prefill: 2 ms; then a 1 ms decode
        ReplayRequest("b", 1 * MS, list(range(1000, 1100)), 1),  # arrives while a runs: no wake
        ReplayRequest("c", 1003 * MS, list(range(2000, 2100)), 1),  # 1 s after the last step's end
    ]
    plain = replay(requests, _settings(WakeCost()))
    woken = replay(requests, _settings(wake))
    # a arrived at the trace's start (no idle time); b joined a busy engine; c waited 1.000 s: +50 ms
    assert woken.token_ns["a"] == plain.token_ns["a"] and woken.token_ns["b"] == plain.token_ns["b"]
    idle_s = (1003 * MS - plain.steps[-2]["t_start_ns"] - plain.steps[-2]["duration_ns"]) / 1e9
    assert woken.token_ns["c"][0] - plain.token_ns["c"][0] == round(wake.extra_ms(idle_s) * MS)
    assert woken.token_ns["c"][0] - plain.token_ns["c"][0] == pytest.approx(50 * MS, rel=1e-3)
    assert woken.steps[-1]["duration_ns"] - plain.steps[-1]["duration_ns"] == pytest.approx(50 * MS, rel=1e-3)
    assert _settings(wake).sim_params()["wake"] == {"points": [(0.01, 0.0), (1.0, 50.0)]}


def test_a_sweep_probes_wake_once_per_chunk_even_split() -> None:
    sweep = SweepConfig.model_validate(
        {"chunks": [512], "decode_batch_sizes": [0, 2, 4], "wake_probe": {"gaps_s": [1, 0.02, 0.3]}}
    )
    assert sweep.wake_probe is not None and sweep.wake_probe.gaps_s == [0.02, 0.3, 1.0]  # sorted
    parts = split_plans(shard_plans(sweep, "CPU: test"), shards=2)
    assert len(parts) == 2 and [p.wake is not None for p in parts] == [False, True]
    with pytest.raises(ValidationError):
        SweepConfig.model_validate({"wake_probe": {"gaps_s": [0.5]}})  # no reference besides it


def test_fit_to_sim_takes_the_runs_wake_probe(tmp_path: Path) -> None:
    grid = {"chunks": (2048,), "decode_batches": (0, 2), "prefill_tokens": (512, 1024, 2048)}
    run = synthesize_run(tmp_path / "run", **grid, repetitions=2, noise=0.01)
    assert fit_to_sim(run).wake == WakeCost()  # no probe: no wake cost, and it says why
    assert any(line.startswith("wake=none (the run has no wake probe") for line in fit_to_sim(run).defaulted)
    samples = [(0.02, 30.0 + i, 0) for i in range(3)] + [(1.0, 80.0 + i, 0) for i in range(3)]
    RunFolder(run).write_wake(_probe(samples))
    settings = fit_to_sim(run)
    assert settings.wake.points == [(0.02, 0.0), (1.0, 50.0)]
    assert any(line.startswith("wake: 1 s +50 [") for line in settings.matched), settings.matched


def test_predict_charges_the_probes_wake_unless_told_not_to(tmp_path: Path, capsys: Any) -> None:
    grid = {"chunks": (2048,), "decode_batches": (0, 2), "prefill_tokens": (512, 1024, 2048)}
    run = synthesize_run(tmp_path / "run", **grid, repetitions=2, noise=0.01)
    samples = [(0.02, 30.0 + i, 0) for i in range(3)] + [(1.0, 80.0 + i, 0) for i in range(3)]
    RunFolder(run).write_wake(_probe(samples))
    rows = [_row(i, 5000.0 * i) for i in range(3)]  # 5 s apart: every request reaches an idle engine
    real = tmp_path / "real"
    header = TraceHeader(
        created_at="2026-11-30T00:00:00+00:00", session_start_unix_ns=0, stages=[], saturated=False
    )
    write_trace_files(real, header, _frame(rows))
    firsts = {}
    for flag in ([], ["--no-wake"]):
        out = tmp_path / f"pred{len(flag)}"
        assert main(["predict", str(real), "--model", str(run), "--out", str(out), *flag]) == 0
        _, pred = read_trace(out)
        firsts[bool(flag)] = (pred["first_chunk_ns"] - pred["send_ns"]).tolist()
    printed = capsys.readouterr().out
    assert "wake: 1 s +50" in printed and "defaulted: wake=none (--no-wake)" in printed
    # the first request came at the trace's start; the others after ≈ 5 s idle: the last point's 50 ms
    assert firsts[False][0] == firsts[True][0]
    assert [a - b for a, b in zip(firsts[False][1:], firsts[True][1:], strict=True)] == [50 * MS, 50 * MS]
