"""The report's consistency gate: contradictions are found, named, and shown loudly, never swapped."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from microbench.battery.gate import check_report, distribution_order
from microbench.battery.render import html_report, markdown_minimum
from microbench.battery.report import BatteryReport, SystemInfo, TestResult, WarmupResult
from microbench.battery.sections.tradeoff import TradeoffData
from microbench.measure.levels import ledger_entry, level_row
from microbench.measure.runs import StageWindow
from microbench.measure.saturation import SATURATION_RULE
from microbench.measure.stats import Distribution
from microbench.measure.sustainable import capacity_from


def _row(rate: float, tokens: float = 10.0):  # type: ignore[no-untyped-def]
    send = np.arange(0, 10, 1 / rate)
    return level_row(StageWindow("level", _frame(send, send + 0.2, tokens), 0.0, 10.0, 10.3), rate)


def _frame(send: np.ndarray, done: np.ndarray, tokens: float = 10.0) -> pd.DataFrame:
    return pd.DataFrame(
        {
            "ok": True, "slo_class": "", "client_id": "a", "input_tokens": 100.0, "output_tokens": tokens,
            "send_s": send, "done_s": done, "ttft_s": np.linspace(0.01, 0.05, send.size), "tpot_s": 0.01,
            "e2e_s": done - send, "error": None,
        }
    )  # fmt: skip


def _report(levels, ledger) -> BatteryReport:  # type: ignore[no-untyped-def]
    data = TradeoffData(
        workload="w",
        capacity_rps=10.0,
        fractions=[0.5, 1.0],
        levels=levels,
        ttft_slo_ms=500.0,
        knee_rps=None,
        saturation_rps=None,
        optimal_rps=levels[-1].offered,
    )
    return BatteryReport(
        created_at="2026-01-01T00:00:00.000+00:00",
        command="x",
        profile="quick",
        seed=0,
        workload="w",
        system=SystemInfo(
            model="m", engine_kind="sim", base_url="u", hardware="cpu", accelerators=0, cpu_count=2
        ),
        warmup=WarmupResult(cold_start=True),
        tests=[TestResult(name="tradeoff", section="5.3", title="Trade-off", status="ran", data=data)],
        capacity=capacity_from(ledger, SATURATION_RULE),
    )


def test_a_consistent_report_passes_the_gate() -> None:
    rows = [_row(5.0), _row(10.0)]
    report = _report(rows, [ledger_entry("5.3", f"{r.offered}", r) for r in rows])
    assert check_report(report) == []
    assert "CONSISTENCY GATE FAILED" not in markdown_minimum(report)


def test_a_max_below_a_sustainable_level_fails_loudly_and_is_not_swapped() -> None:
    rows = [_row(5.0), _row(10.0)]
    report = _report(rows, [ledger_entry("5.3", "5.0", rows[0])])  # the 10 req/s level escaped the ledger
    problems = check_report(report)
    assert any("above the Max" in p for p in problems)
    minimum = markdown_minimum(report)
    assert minimum.startswith("CONSISTENCY GATE FAILED")
    assert f"Max Throughput: {rows[0].output_tps:.1f}" in minimum  # shown as measured, not replaced
    assert 'class="gate"' in html_report(report, None)


def test_a_rate_above_the_offered_one_and_disordered_percentiles_fail() -> None:
    row = _row(10.0)
    inflated = row.model_copy(update={"sent_rps": 14.0})  # e.g. a window that lost its empty tail
    inflated.ttft = Distribution(
        count=3, min=0.01, p50=0.03, p90=0.02, p95=0.04, p99=0.05, p999=0.05, max=0.05
    )
    report = _report([inflated], [ledger_entry("5.3", "x", inflated)])
    problems = check_report(report)
    assert any("requests sent" in p and "offered" in p for p in problems)
    assert any("percentiles out of order (p50 0.03 > p90 0.02)" in p for p in problems)
    assert distribution_order(Distribution(count=0)) is None


def _stalled_level(stall_s: float):  # type: ignore[no-untyped-def]
    """10 req/s for 10 s; the engine answers nothing until ``stall_s``, then drains 100 req/s until
    caught up, then 0.2 s after each send."""
    send = np.arange(0, 10, 0.1)
    done = np.empty_like(send)
    free = stall_s
    for i, t in enumerate(send):
        free = max(free + 0.01, t + 0.2)
        done[i] = free
    return level_row(StageWindow("level", _frame(send, done), 0.0, 10.0, 10.3), 10.0)


def test_a_backlog_draining_in_the_window_is_consistent() -> None:
    # the false positive: a stall before the window, its backlog finishes inside it, so the window
    # completes more than its own arrivals (and more than 3σ above the offered count); nothing is wrong
    row = _stalled_level(stall_s=6.0)
    window = row.window_s
    assert window is not None
    done = round(row.request_rps * window)
    assert done > row.offered * window + 3 * np.sqrt(row.offered * window) + 1  # what the old rule flagged
    assert row.backlog is not None and row.backlog > 0
    assert done <= row.backlog + round(row.sent_rps * window)  # type: ignore[operator]
    assert check_report(_report([row], [ledger_entry("5.3", "x", row)])) == []


def test_more_completions_than_could_finish_in_the_window_fail() -> None:
    # hand-built counts: 20 waiting at the window's start, 30 sent in it, 60 finished in it: 10 too many
    row = _row(10.0)
    window = row.window_s
    assert window is not None
    bad = row.model_copy(update={"backlog": 20, "sent_rps": 30 / window, "request_rps": 60 / window})
    problems = check_report(_report([bad], [ledger_entry("5.3", "x", bad)]))
    assert any("60 completions" in p and "(20 waiting at its start + 30 sent in it)" in p for p in problems)
    exact = row.model_copy(update={"backlog": 20, "sent_rps": 30 / window, "request_rps": 50 / window})
    assert not any("completions" in p for p in check_report(_report([exact], [])))


def test_the_committed_conformant_run_is_conformant_and_consistent() -> None:
    # results/battery-cpu-conformant-ttft-itl: 5.1 and 5.4 with the draft's counts on the CPU vLLM engine
    from pathlib import Path

    from microbench.battery.sections.ttft import TtftData

    folder = Path(__file__).resolve().parents[2] / "results" / "battery-cpu-conformant-ttft-itl"
    report = BatteryReport.model_validate_json((folder / "report.json").read_text())
    assert check_report(report) == []
    ttft = report.result("ttft")
    assert ttft is not None and isinstance(ttft.data, TtftData)
    assert ttft.data.ttft.count == len(ttft.data.samples_s) == 10_000  # P99.9 needs 10,000 (5.1.2.1)
    assert all(r.met for r in ttft.requirements if r.level == "MUST")
    # one capacity: the Max is the best sustainable level of the ledger, and 5.1 ran at half the rate
    cap = report.capacity
    assert cap is not None and cap.max_output_tps is not None and cap.sustainable_rate_rps is not None
    assert cap.max_output_tps == max(e.output_tps for e in cap.entries if e.sustainable)
    assert ttft.data.rate == pytest.approx(cap.sustainable_rate_rps * 0.5)
    # the samples are the distribution the table prints
    assert np.percentile(ttft.data.samples_s, 50) == pytest.approx(ttft.data.ttft.p50)


def test_c1_says_which_sustainable_rate_set_the_loads_when_a_later_level_went_higher() -> None:
    from microbench.battery.render import _scaled_by
    from microbench.measure.sustainable import LedgerEntry

    def entry(test: str, offered: float, ok: bool) -> LedgerEntry:
        return LedgerEntry(
            test=test, label="x", loop="open", offered=offered, achieved_rps=offered, output_tps=offered * 50,
            sustainable=ok,
        )  # fmt: skip

    # the quick CPU run: 5.2's search stopped at 30.40 req/s, 5.3's 120% level (36.49) was sustainable too
    ledger = [entry("5.2", 30.40, True), entry("5.2", 34.0, False), entry("5.3", 36.49, True)]
    cap = capacity_from(ledger, "r")
    assert cap.sustainable_rate_rps == 36.49
    assert _scaled_by(cap).startswith("; above 5.2's search result 30.40 req/s, which set the loads")
    assert _scaled_by(capacity_from([entry("5.2", 30.40, True), entry("5.3", 12.0, True)], "r")) == ""
