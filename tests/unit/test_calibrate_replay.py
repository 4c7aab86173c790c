"""Replay, per-request metrics, the report and the CLI of analysis.calibrate on hand-built traces."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pandas as pd
import pytest

from analysis.calibrate import config
from analysis.calibrate.__main__ import main
from analysis.calibrate.config import FitSummary, SimSettings, fit_to_sim
from analysis.calibrate.metrics import itl_values, request_metrics, split_requests
from analysis.calibrate.pages import markdown
from analysis.calibrate.predict import predict_trace, with_round_trip
from analysis.calibrate.replay import ReplayRequest, replay, replay_requests
from analysis.calibrate.report import calibration_report
from analysis.synthetic import synthesize_run
from engine_harness.sim.params import SimConfig
from engine_harness.step_model import StepModel, StepShape
from microbench.results.trace import INT_COLUMNS, TRACE_COLUMNS, TraceHeader, read_trace, write_trace_files

MS = 1_000_000
STEP = StepModel(alpha_ms=1.0, beta_d_ms=0.1, beta_c_ms=0.05, gamma_ns=0.0)


def _settings(**kw: Any) -> SimSettings:
    base: dict[str, Any] = dict(
        kind="sim", mode="vllm", max_num_batched_tokens=2048, max_num_seqs=8, block_size=16,
        num_kv_blocks=4096, enable_prefix_caching=True, max_model_len=16384, frontend_ns_per_token=0.0,
        frontend_fixed_ms=0.0, step=STEP,
        fit=FitSummary(run="hand-built", candidate="c·(ctx + c/2)", r2=1.0, loo_step_mape_pct=0.0, n_steps=1),
    )  # fmt: skip
    return SimSettings.model_validate(base | kw)


def _row(i: int, send_ms: float, chunks_ms: list[float], **kw: Any) -> dict[str, Any]:
    row: dict[str, Any] = {c: None for c in TRACE_COLUMNS}
    row.update(
        request_id=str(i), stage="s", warmup=False, client_id="c", tenant_id="", slo_class="", session_id="",
        round_index=0, prefix_group="", prefix_tokens=0, streaming=True, prompt_tokens=1000, max_tokens=3,
        input_tokens=1000, output_tokens=len(chunks_ms), intended_ns=int(send_ms * MS),
        send_ns=int(send_ms * MS),
        schedule_delay_ns=0, first_chunk_ns=int(chunks_ms[0] * MS) if chunks_ms else None,
        last_chunk_ns=int(chunks_ms[-1] * MS) if chunks_ms else None, num_chunks=len(chunks_ms),
        chunk_ns=[int(c * MS) for c in chunks_ms], chunk_tokens=[1] * len(chunks_ms), tokens_from_usage=True,
        status="ok", http_status=200,
    )  # fmt: skip
    return row | kw


def _frame(rows: list[dict[str, Any]]) -> pd.DataFrame:
    frame = pd.DataFrame(rows, columns=list(TRACE_COLUMNS))
    for c in INT_COLUMNS:
        frame[c] = frame[c].astype("Int64")
    return frame


def _write(path: Path, rows: list[dict[str, Any]], rtt_ms: float | None = None) -> Path:
    header = TraceHeader(
        created_at="2026-11-25T00:00:00+00:00", session_start_unix_ns=0, stages=[], saturated=False,
        network={"rtt_ms": {"min": rtt_ms, "median": 10 * rtt_ms}} if rtt_ms is not None else {},
    )  # fmt: skip
    write_trace_files(path, header, _frame(rows))
    return path


def test_request_metrics_and_itl() -> None:
    frame = _frame([_row(0, 0, [100, 300, 400, 500]), _row(1, 10, [20])])
    frame.at[0, "chunk_tokens"] = [1, 2, 1, 1]  # the second chunk carried two tokens
    frame.at[0, "output_tokens"] = 5
    m = request_metrics(frame)
    assert m.loc["0"].tolist() == pytest.approx([100.0, 500.0, 100.0])  # TTFT, E2E, (500-100)/(5-1)
    assert m.loc["1", "ttft_ms"] == pytest.approx(10.0) and pd.isna(m.loc["1", "tpot_ms"])  # one token
    assert itl_values(frame, ["0", "1"]).tolist() == pytest.approx([100.0, 100.0, 100.0])  # 200/2, 100, 100


def test_split_counts_what_it_leaves_out() -> None:
    real = _frame([_row(0, 0, [10], warmup=True), _row(1, 0, [], status="error"), _row(2, 0, [10]),
                   _row(3, 0, [10])])  # fmt: skip
    pred = _frame([_row(0, 0, [10]), _row(1, 0, []), _row(2, 0, [12]), _row(3, 0, [], status="error")])
    split = split_requests(real, pred)
    assert (split.compared, split.warmup, split.failed_real, split.not_predicted) == (["2"], 1, 1, 1)


def test_replay_one_request_in_virtual_time() -> None:
    req = ReplayRequest("a", 5 * MS, list(range(1000)), 3)
    result = replay([req], _settings())
    # prefill step 1 + 0.05 × 1000 = 51 ms, then two decode steps of 1 + 0.1 = 1.1 ms
    assert result.token_ns["a"] == [56 * MS, 57_100_000, 58_200_000]
    assert [(s["prefill_tokens"], s["decode_tokens"]) for s in result.steps] == [(1000, 0), (0, 1), (0, 1)]


def test_an_engine_at_twice_the_fits_time_takes_twice_as_long_per_step_and_says_so() -> None:
    req = ReplayRequest("a", 5 * MS, list(range(1000)), 3)
    slow = _settings(stream_fixed_ms=0.5, prefill_extra_ms=2.0, frontend_fixed_ms=3.0).at_speed(2.0)
    assert (slow.stream_fixed_ms, slow.prefill_extra_ms, slow.frontend_fixed_ms) == (1.0, 4.0, 3.0)
    assert slow.step.coefficients() == {k: 2 * v for k, v in STEP.coefficients().items()}
    assert any(m.startswith("engine_speed=2 ") for m in slow.matched)
    result = replay([req], slow.model_copy(update={"stream_fixed_ms": 0.0, "prefill_extra_ms": 0.0}))
    # prefill step 2 × 51 ms, then two decode steps of 2 × 1.1 ms: test_replay_one_request_in_virtual_time's
    # steps at twice their time (the API server's 3 ms per request, not a step's, stays 3: asserted above)
    assert result.token_ns["a"] == [(5 + 102) * MS, 109_200_000, 111_400_000]


def test_replay_chunks_and_mixes_like_vllm() -> None:
    a, b = ReplayRequest("a", 0, list(range(800)), 2), ReplayRequest("b", 0, list(range(5000, 5800)), 1)
    result = replay([a, b], _settings(max_num_batched_tokens=1024))
    # step 1: a's 800 + b's first 224; step 2: a's decode + b's last 576 (b's first token)
    assert [(s["prefill_tokens"], s["decode_tokens"]) for s in result.steps] == [(1024, 0), (576, 1)]
    step1, step2 = 1 + 0.05 * 1024, 1 + 0.05 * 576 + 0.1
    assert result.token_ns["a"] == [round(step1 * MS), round(step1 * MS) + round(step2 * MS)]
    assert result.token_ns["b"] == [result.token_ns["a"][1]]


def test_replay_shares_prefix_groups() -> None:
    rows = [_row(0, 0, [60], prefix_group="sys/0", prefix_tokens=512, output_tokens=1),
            _row(1, 500, [520], prefix_group="sys/0", prefix_tokens=512, output_tokens=1),
            _row(2, 1000, [1060], output_tokens=1)]  # fmt: skip
    result = replay(replay_requests(_frame(rows), _settings()), _settings())
    assert result.cached_tokens == {"0": 0, "1": 512, "2": 0}
    assert result.token_ns["1"] == [500 * MS + round((1 + 0.05 * 488) * MS)]  # only 488 tokens computed


def test_replay_refuses_what_cannot_fit() -> None:
    with pytest.raises(ValueError, match="request big"):
        replay([ReplayRequest("big", 0, list(range(2000)), 10)], _settings(max_model_len=1024))


def test_round_trip_time_floors_the_fixed_time() -> None:
    assert with_round_trip(_settings(frontend_fixed_ms=2.0), 1.0).frontend_fixed_ms == 2.0
    moved = with_round_trip(_settings(frontend_fixed_ms=0.5), 1.5)
    assert moved.frontend_fixed_ms == 1.5 and "round-trip" in moved.matched[-1]


def test_predicted_trace_round_trips_and_reports(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rows = [_row(i, 100 * i, [100 * i + 60, 100 * i + 61.1, 100 * i + 62.2]) for i in range(40)]
    rows[0]["warmup"] = True
    rows.append(_row(40, 4000, [], status="timeout"))
    real = _write(tmp_path / "real", rows)
    old = pd.read_parquet(real / "trace.parquet").drop(columns="worker")  # a trace from before the column
    old.to_parquet(real / "trace.parquet", index=False)
    predict_trace(real, _settings(), tmp_path / "pred")
    head, pred = read_trace(tmp_path / "pred")
    assert tuple(pred.columns) == TRACE_COLUMNS and head.engine["kind"] == "prediction"
    assert pred["worker"].isna().all()
    assert pred["first_chunk_ns"].tolist()[:2] == [51 * MS, 151 * MS]  # 1 + 0.05 × 1000 after the send
    assert pred.at[40, "status"] == "timeout" and pd.isna(pred.at[40, "first_chunk_ns"])
    report = calibration_report(real, tmp_path / "pred", n_boot=200)
    assert (report.n_compared, report.warmup_excluded, report.failed_excluded) == (39, 1, 1)
    ttft = report.metric("ttft")  # real 60 ms, predicted 51 ms every time
    assert ttft.mape_pct == pytest.approx(15.0) and ttft.bias_direction == "under-predict"
    assert ttft.pearson_r is None and ttft.rating == "Good"  # r undefined (constant): the MAPE's band
    assert report.metric("tpot").mape_pct == pytest.approx(0.0, abs=1e-4)  # 1.1 ms both (ns rounding)
    assert "| TTFT | 39 | 15.0" in markdown(report) and not report.warnings
    missing = tmp_path / "engine.log.gz"
    argv = [
        "report",
        str(real),
        str(tmp_path / "pred"),
        "--engine-log",
        str(missing),
        "--out",
        str(tmp_path / "r"),
    ]
    assert main(argv) == 2  # the flag named, not a traceback
    assert f"--engine-log: the engine log {missing} cannot be read" in capsys.readouterr().err
    empty = tmp_path / "engine.log"  # read, but no step in it: the flag named too, though the text
    empty.write_text("INFO the server started\n")  # of this error leads with the path, not the flag
    assert main([*argv[:4], str(empty), *argv[5:]]) == 2
    assert f"--engine-log: {empty} holds no step lines" in capsys.readouterr().err


def test_the_report_bands_the_errors_by_prompt_length(tmp_path: Path) -> None:
    # 40 requests, prompts 100…4000 tokens; the prediction's decode gap grows with the prompt (a missing cost
    # per context token), its TTFT is right: TPOT's and E2E's error climbs across the bands, TTFT's stays 0
    real_rows, pred_rows = [], []
    for i in range(40):
        prompt, send = 100 * (i + 1), 1000.0 * i
        gap = 2.0 * (1 + prompt / 4000)  # real: 2 ms per token; predicted: up to 4 ms at 4000 tokens
        real_rows.append(_row(i, send, [send + 50, send + 52, send + 54], prompt_tokens=prompt))
        pred = [send + 50, send + 50 + gap, send + 50 + 2 * gap]
        pred_rows.append(_row(i, send, pred, prompt_tokens=prompt))
    real, predicted = _write(tmp_path / "r", real_rows), _write(tmp_path / "p", pred_rows)
    report = calibration_report(real, predicted, n_boot=100)
    bands = report.by_prompt
    assert [b.prompt_tokens for b in bands] == [(100, 1000), (1100, 2000), (2100, 3000), (3100, 4000)]
    assert [b.n for b in bands] == [10] * 4
    assert all(b.median_error_pct["ttft"] == pytest.approx(0.0, abs=1e-6) for b in bands)
    # TPOT error = prompt / 4000, median of a band of 10: its middle pair's mean (550 → 13.75%, …)
    assert [b.median_error_pct["tpot"] for b in bands] == pytest.approx([13.75, 38.75, 63.75, 88.75])
    assert "## Error by prompt length" in markdown(report) and "| 3100–4000 | 10 |" in markdown(report)
    few = _write(tmp_path / "r5", real_rows[:5]), _write(tmp_path / "p5", pred_rows[:5])
    assert not calibration_report(*few, n_boot=100).by_prompt  # under 30 requests: no bands


def test_few_requests_are_warned(tmp_path: Path) -> None:
    real = _write(tmp_path / "real", [_row(i, 100 * i, [100 * i + 50, 100 * i + 52]) for i in range(5)])
    pred = _write(tmp_path / "pred", [_row(i, 100 * i, [100 * i + 55, 100 * i + 57]) for i in range(5)])
    report = calibration_report(real, pred, n_boot=100)
    assert any("N < 30" in w for w in report.warnings) and report.metric("ttft").mape_pct == pytest.approx(10)


def test_fit_to_sim_recovers_a_known_model(tmp_path: Path) -> None:
    truth = StepModel(alpha_ms=3.0, beta_d_ms=0.2, beta_c_ms=0.04, gamma_ns=12.0)
    run = synthesize_run(
        tmp_path / "run", chunks=(1024, 2048), decode_batches=(0, 2, 4), prefill_tokens=(512, 2048, 4096),
        repetitions=1, params=truth, noise=0.0,
    )  # fmt: skip
    with pytest.raises(ValueError, match=r"chunk sizes \[1024, 2048\]"):
        fit_to_sim(run)
    settings = fit_to_sim(run, 1024)
    assert settings.max_num_batched_tokens == 1024 and settings.mode == "vllm"
    for name in ("alpha_ms", "beta_d_ms", "beta_c_ms", "gamma_ns"):
        assert getattr(settings.step, name) == pytest.approx(getattr(truth, name), rel=1e-3), name
    assert any(d.startswith("num_kv_blocks") for d in settings.defaulted)
    assert SimConfig.model_validate(settings.sim_params()).step.gamma_ns == settings.step.gamma_ns


def test_two_sweeps_at_two_decode_contexts_pooled_recover_the_decodes_context_cost(tmp_path: Path) -> None:
    """SGLang-like (exclusive) steps whose decodes pay δ per token of context, swept at decode contexts 2048
    and 256 and pooled: the fit recovers δ and β_d and prices a lone decode at 200 tokens of context (the
    committed SGLang calibration's fit at one context of 1024 priced it 17% high)."""
    truth = StepModel(
        alpha_ms=5.0, prefill_fixed_ms=5.0, beta_d_ms=0.15, beta_c_ms=0.035, gamma_ns=3.5, lambda_ns=6600,
        delta_ns=1300,
    )  # fmt: skip
    grid = {"chunks": (2048,), "decode_batches": (0, 1, 2, 4), "prefill_tokens": (128, 512, 1024, 2176, 3072)}
    runs = [
        synthesize_run(tmp_path / f"ctx{ctx}", **grid, repetitions=2, params=truth, noise=0.01, seed=ctx,
                       decode_context=ctx, scheduling="exclusive")
        for ctx in (2048, 256)
    ]  # fmt: skip
    one, pooled = fit_to_sim(runs[0]), fit_to_sim(runs)
    assert one.fit.pooled == [] and pooled.fit.pooled == [str(runs[1])]
    assert pooled.fit.n_steps == one.fit.n_steps + fit_to_sim(runs[1]).fit.n_steps
    assert pooled.fit.candidate == "c·(ctx + c/2) + λ·ctx per chunk + D·ctx_dec"
    assert pooled.step.delta_ns == pytest.approx(1300, rel=0.1)
    assert pooled.step.beta_d_ms == pytest.approx(0.15, abs=0.05)
    lone = StepShape(1, (), 200.0)
    assert pooled.step.step_ms(lone) == pytest.approx(truth.step_ms(lone), rel=0.02)


def test_sweeps_of_two_engines_are_not_pooled(tmp_path: Path) -> None:
    grid = {"chunks": (2048,), "decode_batches": (0, 2), "prefill_tokens": (512, 1024, 2048)}
    a = synthesize_run(tmp_path / "a", **grid, repetitions=1, scheduling="exclusive")
    b = synthesize_run(tmp_path / "b", **grid, repetitions=1, scheduling="exclusive")
    manifest = json.loads((b / "manifest.json").read_text())
    manifest["engine_spec"]["max_num_seqs"] = 8
    (b / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ValueError, match=r"other settings than .*max_num_seqs"):
        fit_to_sim([a, b])


def test_a_manifest_that_predates_a_setting_pools_with_its_default_and_not_with_another_value(
    tmp_path: Path,
) -> None:
    grid = {"chunks": (2048,), "decode_batches": (0, 1, 2, 4), "prefill_tokens": (128, 512, 1024, 2176, 3072)}
    old, new, eager = (
        synthesize_run(tmp_path / name, **grid, repetitions=1, noise=0.01, seed=seed, scheduling="exclusive")
        for seed, name in enumerate(("old", "new", "eager"))
    )
    for run, value in ((old, None), (new, True), (eager, False)):
        manifest = json.loads((run / "manifest.json").read_text())
        manifest["engine_spec"].pop("torch_compile", None)
        if value is not None:
            manifest["engine_spec"]["torch_compile"] = value
        (run / "manifest.json").write_text(json.dumps(manifest))
    assert fit_to_sim([old, new]).fit.pooled == [str(new)]  # torch.compile on: the default it ran with
    with pytest.raises(ValueError, match=r"torch_compile: True vs False"):
        fit_to_sim([old, eager])


def test_a_fit_no_p_can_be_held_out_of_says_so_and_its_settings_read_back(tmp_path: Path) -> None:
    # three single-chunk P values beside decode-only rows: α + κ, β_c and γ need all three of them
    truth = StepModel(alpha_ms=1.5, prefill_fixed_ms=6.0, beta_d_ms=0.2, beta_c_ms=0.04, gamma_ns=12.0)
    run = synthesize_run(
        tmp_path / "run", chunks=(2048,), decode_batches=(0, 2, 4), prefill_tokens=(256, 512, 1024),
        repetitions=2, params=truth, noise=0.01,
    )  # fmt: skip
    settings = fit_to_sim(run)
    assert settings.fit.loo_step_mape_pct is None
    assert settings.step.prefill_fixed_ms == pytest.approx(6.0, rel=0.1)
    assert SimSettings.model_validate_json(settings.model_dump_json()) == settings


def test_cli_bad_input_is_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["predict", str(tmp_path), "--model", str(tmp_path), "--out", str(tmp_path / "o")]) == 2
    assert "not a trace folder" in capsys.readouterr().err
    real = _write(tmp_path / "real", [_row(0, 0, [10])])
    assert main(["predict", str(real), "--model", str(tmp_path), "--out", str(tmp_path / "o")]) == 2
    assert "--model" in capsys.readouterr().err
    assert main(["report", str(real), str(tmp_path), "--out", str(tmp_path / "r")]) == 2
    speed = ["--engine-speed", "0", "--out", str(tmp_path / "o")]
    assert main(["predict", str(real), "--model", str(tmp_path), *speed]) == 2
    assert "--engine-speed must be in (0, 100] (1: the fit's speed), got 0" in capsys.readouterr().err
    assert not (tmp_path / "o").exists() and not (tmp_path / "r").exists()  # nothing written on bad input


def test_replay_runs_sglang_exclusive_steps() -> None:
    a, b = ReplayRequest("a", 0, list(range(100)), 4), ReplayRequest("b", 3 * MS, list(range(900, 1900)), 1)
    result = replay([a, b], _settings(mode="sglang", max_num_batched_tokens=512))
    # a prefills (6 ms) and decodes; b's 1000 tokens take two prefill steps in which a gets no token
    shapes = [(s["prefill_tokens"], s["decode_tokens"]) for s in result.steps]
    assert shapes == [(100, 0), (512, 0), (488, 0), (0, 1), (0, 1), (0, 1)]
    assert result.token_ns["b"] == [result.steps[2]["t_start_ns"] + result.steps[2]["duration_ns"]]


def test_replay_prices_the_decodes_riding_in_a_sglang_mixed_step_with_lambda() -> None:
    step = StepModel(alpha_ms=1.0, beta_d_ms=0.1, beta_c_ms=0.05, gamma_ns=0.0, lambda_ns=10_000.0)
    a, b = ReplayRequest("a", 0, list(range(100)), 4), ReplayRequest("b", 3 * MS, list(range(900, 1900)), 1)
    result = replay([a, b], _settings(mode="sglang-mixed", max_num_batched_tokens=512, step=step))
    shapes = [(s["prefill_tokens"], s["decode_tokens"]) for s in result.steps]
    assert shapes == [(100, 0), (511, 1), (489, 1), (0, 1)]
    # a's decode rides in b's chunks as an extend request: λ on its context (100, then 101) beside the
    # chunk's (0, then 511); 1 + 0.1 + 0.05 · 511 + 0.01 · 100 = 27.65, 1 + 0.1 + 0.05 · 489 + 0.01 · 612 =
    # 31.67; alone, a's decode step pays no λ (1.1)
    assert [s["duration_ns"] for s in result.steps] == [6 * MS, 27_650_000, 31_670_000, 1_100_000]


def test_a_candidate_the_grid_cannot_check_is_not_the_physical_fallback(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # the first SGLang calibration sweep of 2026-11-25 (three prompt lengths, since replaced) before κ: its
    # choice had γ < 0, and the one candidate with every term ≥ 0 (a fixed cost per prefill chunk) had no
    # leave-one-P-out error (two lengths could not determine it) and fitted the three exactly (γ 25 ns): the
    # choice stays, its γ clipped to 0
    selection = pd.DataFrame({"model": ["a", "b", "c"], "loo_p_median_ape_pct": [5.0, 6.0, float("nan")]})
    params = {"a": {"gamma_ns": -0.09}, "b": {"delta_ns": -2.0}, "c": {"gamma_ns": 25.0}}
    fits = {name: SimpleNamespace(model=name, params=p, selection=selection) for name, p in params.items()}
    monkeypatch.setattr(config, "fit_step_model", lambda records, name: fits[name or "a"])
    assert config._physical_fit([], None).model == "a"
    params["b"]["delta_ns"] = 2.0  # a checked candidate with every term ≥ 0 is taken
    assert config._physical_fit([], None).model == "b"
