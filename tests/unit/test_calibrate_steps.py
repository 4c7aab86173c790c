"""Step composition of the calibration: the engine's logged steps during a trace against the replay's."""

from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from analysis.calibrate.steps import engine_log_steps, step_bands, step_composition
from microbench.results.trace import TraceHeader

START_S = 1_700_000_000.0


def _line(t: float, index: int, ctx_tok: int, gen_tok: int, ms: float) -> str:
    return (
        f"(EngineCore pid=1) INFO 11-25 10:00:00 @{START_S + t:.6f} [core.py:1] Iteration({index}): "
        f"{1 if ctx_tok else 0} context requests, {ctx_tok} context tokens, {gen_tok} generation requests, "
        f"{gen_tok} generation tokens, iteration elapsed time: {ms} ms"
    )


def test_engine_steps_inside_the_trace_against_the_replay(tmp_path: Path) -> None:
    log = tmp_path / "engine.log"
    log.write_text(
        "\n".join(
            [
                _line(0.5, 1, 512, 0, 20.0),  # before the trace's first send (1 s): left out
                _line(1.2, 2, 1000, 0, 40.0),
                _line(1.3, 3, 600, 2, 30.0),
                _line(1.4, 4, 0, 2, 3.0),
                _line(1.5, 5, 0, 3, 5.0),
                _line(9.0, 6, 100, 0, 9.0),  # after the last chunk (2 s): left out
            ]
        )
        + "\n"
    )
    header = TraceHeader(created_at="x", session_start_unix_ns=int(START_S * 1e9), stages=[], saturated=False)
    frame = pd.DataFrame({"send_ns": [1_000_000_000], "last_chunk_ns": [2_000_000_000]})
    real = engine_log_steps(log, header, frame)
    assert real["prefill_tokens"].tolist() == [1000, 600, 0, 0]
    predicted = pd.DataFrame(
        {"prefill_tokens": [1000, 600, 0], "decode_tokens": [0, 2, 2], "duration_ns": [42e6, 28e6, 4e6]}
    )
    c = step_composition(real, predicted, str(log))
    assert (c.real.steps, c.real.prefill_tokens, c.real.decode_tokens) == (4, 1600, 7)
    assert c.real.mixed_share == pytest.approx(0.25)
    assert c.real.median_tokens == pytest.approx(302.5)  # tokens 1000, 602, 2, 3: (3 + 602) / 2
    assert c.real.median_prefill_step_ms == pytest.approx(35.0)  # (40 + 30) / 2
    assert c.real.median_decode_step_ms == pytest.approx(4.0)  # (3 + 5) / 2
    assert (c.predicted.steps, c.predicted.decode_tokens) == (3, 4)
    assert (
        c.predicted.median_prefill_step_ms == pytest.approx(35.0) and c.predicted.median_decode_step_ms == 4.0
    )
    assert 0 < c.tokens_ks_d < 1
    packed = tmp_path / "engine.log.gz"  # a committed run keeps its engine's log compressed
    packed.write_bytes(gzip.compress(log.read_bytes()))
    pd.testing.assert_frame_equal(engine_log_steps(packed, header, frame), real)


def test_a_log_without_steps_is_refused(tmp_path: Path) -> None:
    log = tmp_path / "engine.log"
    log.write_text("INFO nothing here\n")
    header = TraceHeader(created_at="x", session_start_unix_ns=0, stages=[], saturated=False)
    with pytest.raises(ValueError, match="no step lines"):
        engine_log_steps(log, header, pd.DataFrame({"send_ns": [0], "last_chunk_ns": [1]}))
    # a missing log, a .gz cut off in transfer, a file that is no gzip: one error naming the log
    cut = tmp_path / "cut.log.gz"
    cut.write_bytes(gzip.compress(b"Decode batch, #running-req: 1\n" * 100)[:40])
    (tmp_path / "plain.log.gz").write_text("not compressed")
    for bad in (tmp_path / "missing.log", cut, tmp_path / "plain.log.gz"):
        with pytest.raises(ValueError, match=f"the engine log {bad} cannot be read"):
            engine_log_steps(bad, header, pd.DataFrame({"send_ns": [0], "last_chunk_ns": [1]}))


def _sglang(t: float, kind: str, running: int, new: int = 0) -> str:
    stamp = f"[2026-11-25 10:00:00.000 @{START_S + t:.6f}] "
    if kind == "Prefill":
        return (
            f"{stamp}Prefill batch, #new-seq: 1, #new-token: {new}, #cached-token: 0, token usage: 0.01, "
            f"#running-req: {running}, #queue-req: 0, cpu graph: False"
        )
    return f"{stamp}Decode batch, #running-req: {running}, #token: 900, token usage: 0.01, cpu graph: False"


@pytest.mark.parametrize("mixed", [False, True])
def test_sglang_steps_read_the_mixed_flag_and_drop_idle_intervals(tmp_path: Path, mixed: bool) -> None:
    log = tmp_path / "engine.log"
    server_args = f"[2026-11-25 09:59:00.000 @{START_S - 60:.6f}] server_args={{'model_path': 'm', "
    server_args += f"'enable_mixed_chunk': {mixed}, 'disable_overlap_schedule': True}}"
    lines = [
        server_args,
        _sglang(1.00, "Prefill", 0, 500),  # request a (sent at 0.99 s): the first line, no interval
        _sglang(1.01, "Decode", 1),
        _sglang(1.02, "Decode", 1),  # a's last token; idle until b is sent at 1.50 s
        _sglang(1.55, "Prefill", 0, 800),  # b: the interval 1.02 → 1.55 s is idle + step
        _sglang(1.60, "Prefill", 1, 300),  # c (sent at 1.52 s, while b ran): a whole step, 50 ms
        _sglang(1.61, "Decode", 2),
    ]
    log.write_text("\n".join(lines) + "\n")
    header = TraceHeader(created_at="x", session_start_unix_ns=int(START_S * 1e9), stages=[], saturated=False)
    ms = 1_000_000
    frame = pd.DataFrame(
        {"send_ns": [990 * ms, 1500 * ms, 1520 * ms], "last_chunk_ns": [1021 * ms, 1612 * ms, 1612 * ms]}
    )
    real = engine_log_steps(log, header, frame)
    assert real["prefill_tokens"].tolist() == [500, 0, 0, 800, 300, 0]
    # a prefill line counts the running batch before mixing: its decodes ride along only with the flag
    assert real["decode_tokens"].tolist() == [0, 1, 1, 0, 1 if mixed else 0, 2]
    elapsed = real["elapsed_ms"].tolist()
    assert pd.isna(elapsed[0]) and pd.isna(elapsed[3])  # no interval; an interval that began idle
    assert elapsed[1:3] == pytest.approx([10.0, 10.0], abs=1e-3)
    assert elapsed[4:] == pytest.approx([50.0, 10.0], abs=1e-3)
    # the replay's steps: a's prefill (began idle), two decodes, b's prefill 0.45 s later (idle again), c's
    ms_ = 1e6
    predicted = pd.DataFrame(
        {
            "t_start_ns": [990 * ms_, 1011 * ms_, 1021 * ms_, 1500 * ms_, 1525 * ms_],
            "duration_ns": [20 * ms_, 9 * ms_, 11 * ms_, 24 * ms_, 40 * ms_],
            "stream_ns": [1 * ms_] * 5,
            "prefill_tokens": [500, 0, 0, 800, 300],
            "decode_tokens": [0, 1, 1, 0, 0],
        }
    )
    c = step_composition(real, predicted, str(log))
    # like with like: only c's prefill step began on a busy engine, on both sides (50 ms real, 40 replayed;
    # all three replayed: 24)
    assert c.real.median_prefill_step_ms == pytest.approx(50.0, abs=1e-3)
    assert c.predicted.median_prefill_step_ms == pytest.approx(40.0)
    assert c.predicted.median_decode_step_ms == pytest.approx(10.0)


def test_step_time_by_shape_bands_each_side_and_leaves_untimed_steps_out() -> None:
    nan = float("nan")
    real = (
        np.array([0, 0, 0, 300, 300, 3000, 0.0]),  # prompt tokens
        np.array([1, 3, 4, 2, 0, 5, 2.0]),  # decode requests
        np.array([10, 20, 30, 100, 80, 400, nan]),  # ms; the last began idle: untimed
    )
    predicted = (np.array([0, 300, 0.0]), np.array([1, 6, 0.0]), np.array([12, 90, 5.0]))
    bands = {(b.kind, b.band): b for b in step_bands(real, predicted)}
    # the untimed 2-decode step has no band; a step of no tokens is neither kind
    assert list(bands) == [
        ("decode-only", "1"), ("decode-only", "3–4"), ("prefill-carrying", "257–1024"),
        ("prefill-carrying", "2049+"),
    ]  # fmt: skip
    one = bands["decode-only", "1"]
    assert (one.real_steps, one.real_median_ms) == (1, 10)
    assert (one.predicted_steps, one.predicted_median_ms) == (1, 12)
    three = bands["decode-only", "3–4"]
    assert (three.real_steps, three.real_median_ms, three.real_median_decodes) == (2, 25, 3.5)
    assert (three.predicted_steps, three.predicted_median_ms) == (0, None)
    mid = bands["prefill-carrying", "257–1024"]
    assert (mid.real_steps, mid.real_median_ms, mid.real_median_decodes) == (2, 90, 1)  # decodes 2 and 0
    assert (mid.predicted_steps, mid.predicted_median_ms, mid.predicted_median_decodes) == (1, 90, 6)
    assert bands["prefill-carrying", "2049+"].real_median_ms == 400
