"""Trace rows and header health computed from hand-made session results."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from microbench.client.requests import ApiSettings, RequestSpec, build_payload, completion_body
from microbench.client.streams import StreamRecord
from microbench.loadgen.stages import RequestRecord, SessionResult, SessionSettings, StageOutcome
from microbench.loadgen.trace import TRACE_COLUMNS, read_trace, write_trace

T0 = 1_000_000_000


def _result(delays_ms: list[float], gap_ms: float = 10.0, warmup: bool = False) -> SessionResult:
    records = []
    for i, delay in enumerate(delays_ms):
        intended = T0 + int(i * gap_ms * 1e6)
        send = intended + int(delay * 1e6)
        stream = StreamRecord(
            t_send_ns=send, chunk_t_ns=[send + 5_000_000, send + 6_000_000], chunk_tokens=[1, 2],
            usage={"prompt_tokens": 10, "completion_tokens": 3}, t_done_ns=send + 7_000_000, status=200,
        )  # fmt: skip
        records.append(RequestRecord(i, "s", warmup, RequestSpec([1] * 10, 10, 3), intended, stream, "ok"))
    settings = SessionSettings.model_validate({"base_url": "http://x", "api": {"model": "m"}})
    outcome = StageOutcome("s", warmup, {"kind": "uniform", "rate": 100.0}, 100.0, None, None, None)
    outcome.end_ns = T0 + 2_000_000_000
    return SessionResult(settings, T0, 0, records, [outcome])


def test_rows_columns_and_csv(tmp_path: Path) -> None:
    header = write_trace(tmp_path, _result([1.0] * 30))
    _, rows = read_trace(tmp_path)
    assert tuple(rows.columns) == TRACE_COLUMNS and set(rows["worker"]) == {0}
    row = rows.iloc[1]
    assert (row["intended_ns"], row["send_ns"], row["schedule_delay_ns"]) == (
        10_000_000,
        11_000_000,
        1_000_000,
    )
    assert list(row["chunk_ns"]) == [16_000_000, 17_000_000] and row["output_tokens"] == 3
    assert pd.read_csv(tmp_path / "trace.csv")["chunk_ns"].iloc[1] == "16000000 17000000"
    health = header.stages[0]
    assert health.schedule_delay_p50_ms == pytest.approx(1.0)
    assert health.achieved_rate == pytest.approx(100.0) and health.scheduled_rate == pytest.approx(100.0)
    assert not header.saturated and header.warnings == []


def test_a_trace_from_before_the_worker_column_reads_with_it_empty(tmp_path: Path) -> None:
    write_trace(tmp_path, _result([1.0] * 5))
    old = pd.read_parquet(tmp_path / "trace.parquet").drop(columns="worker")
    old.to_parquet(tmp_path / "trace.parquet", index=False)
    _, rows = read_trace(tmp_path)
    assert tuple(rows.columns) == TRACE_COLUMNS and rows["worker"].isna().all() and len(rows) == 5
    assert read_trace(tmp_path)[1]["send_ns"].tolist() == rows["send_ns"].tolist()


def test_generator_falling_behind_is_flagged(tmp_path: Path) -> None:
    growing = [i * 1.5 for i in range(40)]  # each send later than the last: 11.5 ms apart, not 10
    header = write_trace(tmp_path, _result(growing))
    assert header.saturated
    assert (
        header.warnings
        and "fell behind" in header.warnings[0]
        and "median schedule delay" in header.warnings[0]
    )


def test_a_late_warm_up_stage_keeps_its_health_but_does_not_saturate_the_run(tmp_path: Path) -> None:
    # a CPU engine's first requests ran slowly after its start: the warm-up's median delay 22.8 ms made the
    # whole observation "saturated" and the load generator exit 1, which stopped the calibration script
    growing = [i * 1.5 for i in range(40)]
    header = write_trace(tmp_path, _result(growing, warmup=True))
    (warm,) = header.stages
    assert warm.warmup and warm.saturated and "fell behind" in (warm.warning or "")
    assert not header.saturated and header.warnings == []


def test_payload_asks_for_exact_lengths_and_running_usage() -> None:
    api = ApiSettings.model_validate({"model": "m"})
    body = build_payload(RequestSpec([5, 6], 2, 7, sampling={"temperature": 0.0}), api)
    assert body == {
        "model": "m", "max_tokens": 7, "temperature": 0.0, "prompt": [5, 6], "ignore_eos": True,
        "min_tokens": 7, "stream_options": {"include_usage": True, "continuous_usage_stats": True},
    }  # fmt: skip
    chat = ApiSettings.model_validate({"model": "m", "api": "chat"})
    with pytest.raises(ValueError, match="chat API needs text"):
        build_payload(RequestSpec([5], 1, 1), chat)
    assert build_payload(RequestSpec("hi", 1, 1, streaming=False), chat)["messages"][0]["content"] == "hi"


def test_completion_body_options() -> None:
    """The one request body: exact lengths and running usage by default; each option drops its keys."""
    assert completion_body("m", [1], 4, temperature=0) == {
        "model": "m", "prompt": [1], "max_tokens": 4, "ignore_eos": True, "min_tokens": 4,
        "stream_options": {"include_usage": True, "continuous_usage_stats": True}, "temperature": 0,
    }  # fmt: skip
    bare = completion_body("m", "hi", 1, exact_output_length=False, stream_usage=None)
    assert bare == {"model": "m", "prompt": "hi", "max_tokens": 1}
    assert (
        completion_body("m", [1], 2, stream_usage=False)["stream_options"]["continuous_usage_stats"] is False
    )
    off = ApiSettings.model_validate({"model": "m", "exact_output_length": False, "extra_body": {"top_k": 1}})
    body = build_payload(RequestSpec([5], 1, 3, streaming=False), off)
    assert body == {"model": "m", "prompt": [5], "max_tokens": 3, "top_k": 1}
