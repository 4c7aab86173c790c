"""5.2's batch utilization, 5.5's level sizes, 5.8's preemption figures, 5.9's throughput at length and its
Long Context prompts, on hand-built traces, levels and /metrics series."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from fixtures.latencies import latencies

from microbench.battery.requirement_table import scan
from microbench.battery.sections.capacity import level_requests
from microbench.battery.sections.long_context import max_throughput
from microbench.battery.sections.memory_pressure import preemption_figures
from microbench.battery.sections.throughput import batch_utilization
from microbench.loadgen.metrics_series import increments, series_frame, time_average
from microbench.measure.levels import level_row
from microbench.measure.runs import StageWindow
from microbench.workloads.prompts import BLOCK_TOKENS, QUESTION_TOKENS, PromptFactory

S = 1_000_000_000


def _series(*rows: tuple[float, str, float]) -> pd.DataFrame:
    return series_frame([(int(t * S) + 5 * S, q, v) for t, q, v in rows], 5 * S)


def test_a_gauge_is_averaged_over_time_each_sample_holding_until_the_next() -> None:
    series = _series((0, "requests_running", 2), (1, "requests_running", 6), (3, "requests_running", 4))
    assert time_average(series, "requests_running", 0, 4) == pytest.approx((2 * 1 + 6 * 2 + 4 * 1) / 4)
    assert time_average(series, "requests_running", 2, 4) == pytest.approx(5.0)  # opened by the sample at 1
    assert time_average(series, "requests_running", 3.5, 10) == pytest.approx(4.0)  # the last one holds
    assert time_average(series, "requests_waiting", 0, 4) is None  # never sampled
    assert time_average(series, "requests_running", 4, 4) is None


def test_counter_increments_are_located_between_scrapes() -> None:
    series = _series(
        (0, "preemptions", 0), (1, "preemptions", 0), (2, "preemptions", 3), (3, "preemptions", 4)
    )
    assert increments(series, "preemptions") == [(1.0, 2.0, 3.0), (2.0, 3.0, 1.0)]


def test_a_level_carries_the_engines_mean_batch_and_5_2_divides_it_by_max_num_seqs() -> None:
    send = np.arange(0, 10, 0.1)
    series = _series(*[(t, "requests_running", 8.0 if t < 5 else 12.0) for t in np.arange(0, 11, 0.5)])
    window = StageWindow("level", latencies(send, send + 0.2), 0.0, 10.0, 10.3, series)
    row = level_row(window, 5.0)
    begin = 10.0 - row.steady.window_s
    expected = (8.0 * (5 - begin) + 12.0 * 5) / (10 - begin)
    assert row.mean_running == pytest.approx(expected)
    util, cell = batch_utilization(row.mean_running, 16)
    assert util == pytest.approx(expected / 16)
    assert "of max_num_seqs 16" in cell
    assert batch_utilization(row.mean_running, None)[0] is None  # no maximum known: no ratio claimed
    assert batch_utilization(None, 16)[1].startswith("not measured")
    no_series = level_row(StageWindow("level", latencies(send, send + 0.2), 0.0, 10.0, 10.3), 5.0)
    assert no_series.mean_running is None


def _trace(chunks: list[list[float]], statuses: list[str], prompt: int = 100) -> pd.DataFrame:
    return pd.DataFrame(
        {
            "chunk_ns": [[int(t * S) for t in c] for c in chunks],
            "chunk_tokens": [[1] * len(c) for c in chunks],
            "input_tokens": pd.array([prompt] * len(chunks), dtype="Int64"),
            "prompt_tokens": [prompt] * len(chunks),
            "status": statuses,
        }
    )


def _steady(start: float, n: int = 20, gap: float = 0.01) -> list[float]:
    return [start + gap * i for i in range(n)]


def test_preemption_share_recovery_and_loss_from_stalls_during_counter_rises() -> None:
    stalled = _steady(0.0, 10) + _steady(2.0, 10)  # 10 tokens, then a 1.91 s stall from 0.09 s
    late = _steady(0.0, 5) + _steady(3.0, 15)  # 5 tokens, then a stall from 0.04 s to 3 s
    unexplained = _steady(5.0, 5) + _steady(7.0, 15)  # a stall at 5.04-7 s: the counter did not rise
    trace = _trace([stalled, late, unexplained, _steady(0.0)], ["ok", "cancelled", "ok", "ok"])
    series = _series((0.0, "preemptions", 0), (0.5, "preemptions", 2), (4.0, "preemptions", 2),
                     (8.0, "preemptions", 2))  # fmt: skip
    f = preemption_figures(trace, series)
    assert f.events == 2
    assert f.preempted == 2 and f.requests == 4 and f.share == pytest.approx(0.5)
    assert f.recovered == 1 and f.recovery_rate == pytest.approx(0.5)  # the cancelled one did not recover
    assert f.loss_tokens == pytest.approx(((100 + 10) + (100 + 5)) / 2)  # prompt + tokens before the stall


def test_more_qualifying_stalls_than_counted_preemptions_keep_the_longest() -> None:
    short = _steady(0.0, 10) + _steady(1.0, 10)
    long = _steady(0.0, 10) + _steady(2.5, 10)
    series = _series((0.0, "preemptions", 0), (0.5, "preemptions", 1), (3.0, "preemptions", 1))
    f = preemption_figures(_trace([short, long, _steady(0.0)], ["ok", "ok", "ok"]), series)
    assert f.preempted == 1 and f.loss_tokens == pytest.approx(110)


def test_no_counter_means_no_preemption_figures_and_no_rise_means_none_preempted() -> None:
    trace = _trace([_steady(0.0, 5) + _steady(2.0, 5)], ["ok"])
    none = preemption_figures(trace, _series((0, "requests_running", 1)))
    assert none.events is None and none.preempted is None and none.share is None
    flat = preemption_figures(trace, _series((0, "preemptions", 3), (3, "preemptions", 3)))
    assert flat.events == 0 and flat.preempted == 0 and flat.share == 0 and flat.recovery_rate is None


def _closed(concurrency: int, tps: float, ok: float = 1.0):  # type: ignore[no-untyped-def]
    send = np.arange(0, 4, 0.1)
    row = level_row(
        StageWindow("level", latencies(send, send + 0.1), 0.0, 4.0, 4.2), concurrency, loop="closed"
    )
    return row.model_copy(update={"output_tps": tps, "success_rate": ok})


def test_5_9_throughput_at_a_length_is_the_best_complete_level_of_a_ramp_that_levelled_off() -> None:
    levelled = max_throughput([_closed(1, 100), _closed(2, 190), _closed(4, 200), _closed(8, 205)], 64)
    assert levelled.max_output_tps == 205 and levelled.at_concurrency == 8 and levelled.levelled_off
    capped = max_throughput([_closed(1, 100), _closed(2, 190), _closed(4, 370), _closed(8, 700)], 8)
    assert capped.max_output_tps == 700 and not capped.levelled_off  # a lower bound: the ceiling stopped it
    failing = max_throughput([_closed(1, 100), _closed(2, 190), _closed(4, 400, ok=0.9)], 64)
    assert failing.max_output_tps == 190 and failing.at_concurrency == 2  # 90% completed: not counted
    assert max_throughput([], 64).max_output_tps is None


def test_long_context_prompts_are_a_cold_document_then_one_fixed_question() -> None:
    factory = PromptFactory(salt=7)
    a, b = factory.document_question(1024), factory.document_question(1024)
    assert len(a) == len(b) == 1024
    assert a[-QUESTION_TOKENS:] == b[-QUESTION_TOKENS:]  # the same question ends every prompt
    assert a[:BLOCK_TOKENS] != b[:BLOCK_TOKENS]  # cold documents: no shared prefix-cache block
    assert len(factory.document_question(150)) == 150  # a short prompt: the question is at most half
    assert factory.document_question(150)[-75:] == a[-QUESTION_TOKENS:][:75]
    rows = [r for r in scan() if r.ref == "4.3.2.5" and r.section == "5.9 long_context"]
    assert [r.text for r in rows] == [
        "Long Context prompts are a document followed by a fixed question (A.5.1)"
    ]


def test_5_5_levels_run_enough_requests_for_their_completions_per_slot_and_their_duration() -> None:
    assert level_requests(4, 100, 60.0, 0.2) == 4 * 300  # 60 s at 0.2 s per request and slot
    assert level_requests(4, 100, 60.0, 2.0) == 4 * 100  # 100 per slot already takes 200 s
    assert level_requests(1, 2, 3.0, 0.0) > 1_000  # no E2E measured yet: never a zero-length level
