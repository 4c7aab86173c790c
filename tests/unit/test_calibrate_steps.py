"""Step composition of the calibration: the engine's logged steps during a trace against the replay's."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from analysis.calibrate.steps import engine_log_steps, step_composition
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


def test_a_log_without_steps_is_refused(tmp_path: Path) -> None:
    log = tmp_path / "engine.log"
    log.write_text("INFO nothing here\n")
    header = TraceHeader(created_at="x", session_start_unix_ns=0, stages=[], saturated=False)
    with pytest.raises(ValueError, match="no step lines"):
        engine_log_steps(log, header, pd.DataFrame({"send_ns": [0], "last_chunk_ns": [1]}))
