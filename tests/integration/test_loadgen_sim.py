"""The load generator against the in-process sim engine: complete traces, loop discipline, faults."""

from __future__ import annotations

import asyncio
import gc
import itertools
import os
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from engine_harness.sim import SimConfig, SimServer
from microbench.client.requests import RequestSpec
from microbench.loadgen.events import EventKind, EventLog
from microbench.loadgen.session import LoadSession
from microbench.loadgen.stages import SessionResult, SessionSettings, Stage, sweep_stages
from microbench.loadgen.trace import TRACE_COLUMNS, read_trace, trace_frame, write_trace
from microbench.workloads.generator import Workload
from microbench.workloads.prompts import PromptFactory
from microbench.workloads.schedulers import parse_scheduler
from microbench.workloads.spec import WorkloadSpec

pytestmark = [pytest.mark.integration, pytest.mark.clock]  # reads the clock: the clock pass


def _workload(output: int = 8, **client: Any) -> Workload:
    spec = WorkloadSpec.model_validate(
        {
            "name": "small",
            "seed": 5,
            "aggregate_rate": 40,
            "clients": [
                {
                    "id": "c",
                    "input_length": {"type": "uniform", "min": 16, "max": 64},
                    "output_length": {"type": "fixed", "value": output},
                    **client,
                }
            ],
        }
    )
    return Workload(spec, PromptFactory(salt=9))


def _settings(sim: SimServer, **kw: Any) -> SessionSettings:
    return SessionSettings.model_validate({"base_url": sim.base_url, "api": {"model": "sim"}, **kw})


async def _run(
    sim: SimServer, stages: list[Stage], hooks: list[Any] | None = None, **kw: Any
) -> SessionResult:
    async with LoadSession(_settings(sim, **kw), hooks=hooks or []) as session:
        return await session.run(stages)


def _stage(kind: dict[str, Any], requests: Any, **kw: Any) -> Stage:
    return Stage.scheduled(str(kind["kind"]), parse_scheduler(kind), requests, **kw)


async def test_run_writes_a_complete_trace(tmp_path: Path) -> None:
    work = _workload()
    events = EventLog()
    async with SimServer(SimConfig(time_scale=0)) as sim:
        stages = [
            _stage({"kind": "concurrency", "concurrency": 2}, work.requests(), max_requests=4, warmup=True),
            _stage({"kind": "poisson", "rate": 200, "seed": 1}, work.requests(), max_requests=40),
        ]
        result = await _run(sim, stages, hooks=[events])
        arrived = [t for step in sim.step_log for _, t in step.arrivals]  # the sim's clock: perf_counter_ns
    header = write_trace(tmp_path, result, workload={"name": "small"}, seed=5)
    head, rows = read_trace(tmp_path)
    assert head == header and tuple(rows.columns) == TRACE_COLUMNS
    rtt = head.network["rtt_ms"]
    assert head.network["probes"] == 5 and 0 < rtt["min"] <= rtt["median"] <= rtt["max"] < 1000
    assert head.hardware["cpu_cores"] and isinstance(head.hardware["gpus"], list)  # the generator's host
    assert len(rows) == 44 and rows["warmup"].sum() == 4
    assert (rows["status"] == "ok").all()
    assert (rows["output_tokens"] == rows["max_tokens"]).all()
    assert (rows["input_tokens"] == rows["prompt_tokens"]).all()
    assert all(sum(t) == o for t, o in zip(rows["chunk_tokens"], rows["output_tokens"], strict=True))
    assert (rows["num_chunks"] == rows["chunk_ns"].map(len)).all()
    assert (rows["send_ns"] >= rows["intended_ns"]).all()
    assert (rows["first_chunk_ns"] > rows["send_ns"]).all() and (
        rows["done_ns"] >= rows["last_chunk_ns"]
    ).all()
    assert rows["tokens_from_usage"].all()
    # the header's monotonic origin puts an engine's own stamps on the trace's clock: each request reached
    # the sim after some request of the trace was sent and before that request's first chunk came back
    assert head.session_start_perf_ns is not None and len(arrived) == 44
    on_trace = pd.Series(arrived) - head.session_start_perf_ns
    for t in on_trace:
        assert ((rows["send_ns"] < t) & (t < rows["first_chunk_ns"])).any(), t
    measured = header.stages[1]
    assert (measured.requested_rate, measured.issued, measured.status_counts) == (200.0, 40, {"ok": 40})
    assert measured.schedule_delay_p50_ms is not None and measured.schedule_delay_p99_ms is not None
    assert len(pd.read_csv(tmp_path / "trace.csv")) == 44
    assert len(events.of_kind(EventKind.ISSUED)) == 44 and len(events.of_kind(EventKind.COMPLETE)) == 44
    assert (
        len(events.of_kind(EventKind.FIRST_CHUNK)) + len(events.of_kind(EventKind.CHUNK))
        == rows["num_chunks"].sum()
    )
    assert [e.kind for e in events.events if e.request_id is None] == [
        EventKind.SESSION_STARTED, EventKind.STAGE_STARTED, EventKind.ISSUE_STOPPED, EventKind.DRAINED,
        EventKind.STAGE_STARTED, EventKind.ISSUE_STOPPED, EventKind.DRAINED, EventKind.SESSION_ENDED,
    ]  # fmt: skip


async def test_closed_loop_never_exceeds_its_concurrency() -> None:
    async with SimServer(SimConfig(time_scale=1.0, max_num_batched_tokens=256)) as sim:
        stage = _stage({"kind": "concurrency", "concurrency": 3}, _workload(20).requests(), max_requests=24)
        result = await _run(sim, [stage])
    rows = trace_frame(result)
    assert len(rows) == 24 and (rows["status"] == "ok").all()
    assert result.stages[0].max_in_flight == 3
    sends, ends = rows["send_ns"].to_numpy(), rows["done_ns"].to_numpy()
    in_flight = [int(((sends <= t) & (ends > t)).sum()) for t in sends]
    assert max(in_flight) == 3
    # the 4th request on waits for a slot: its intended time is the completion that freed one
    for intended in rows["intended_ns"].to_numpy()[3:]:
        assert np.abs(ends - intended).min() < 2_000_000


async def test_a_stage_counts_its_cpu_while_issuing_the_spin_included() -> None:
    """``issue_cpu_s``: the process's CPU from the stage's start to its last send. The spin before each
    send (the last ``spin_us``, yielding to the loop) burns CPU while it waits: here 5 ms of every 20, less
    the ≤ 1 ms the timer before it wakes late (the sim runs in this process, alike in both runs)."""
    cpu = {}
    async with SimServer(SimConfig(time_scale=0)) as sim:
        for spin_us in (0, 5000):
            stage = _stage({"kind": "uniform", "rate": 50}, _workload(4).requests(), max_requests=25)
            outcome = (await _run(sim, [stage], spin_us=spin_us)).stages[0]
            assert outcome.issued == 25
            assert 0 < outcome.issue_cpu_s <= (outcome.issue_end_ns - outcome.start_ns) / 1e9 * os.cpu_count()
            cpu[spin_us] = outcome.issue_cpu_s
    assert cpu[5000] - cpu[0] >= 0.3 * 25 * 4e-3, cpu  # 25 spins of ≥ 4 ms; a loaded box runs them less


async def test_open_loop_issues_on_time_while_the_server_stalls() -> None:
    faults = {"stall_step": 3, "stall_s": 1.0}
    async with SimServer(SimConfig(time_scale=1.0, faults=faults)) as sim:
        stage = _stage({"kind": "uniform", "rate": 100}, _workload(4).requests(), max_requests=50)
        result = await _run(sim, [stage])
    rows = trace_frame(result)
    assert (rows["status"] == "ok").all()
    slow = rows[rows["done_ns"] - rows["send_ns"] > 900_000_000]
    assert len(slow) >= 10  # the server held requests for the whole stall
    sends = rows["send_ns"].to_numpy()
    assert sends.max() < slow["done_ns"].min()  # every issue happened before the stalled ones returned
    assert (sends.max() - sends.min()) / 1e6 == pytest.approx(490, abs=25)  # 10 ms apart, undisturbed
    assert rows["schedule_delay_ns"].quantile(0.9) < 5_000_000


async def test_stream_cuts_500_and_429_are_recorded_not_lost() -> None:
    faults = {
        "error_500_fraction": 0.15,
        "error_429_fraction": 0.15,
        "cut_after_chunks": 2,
        "cut_fraction": 0.3,
    }
    async with SimServer(SimConfig(time_scale=0, seed=3, faults=faults)) as sim:
        stage = _stage({"kind": "poisson", "rate": 300, "seed": 2}, _workload(6).requests(), max_requests=80)
        result = await _run(sim, [stage])
        injected = dict(sim.faults.injected_errors)
        cut = sim.faults.cut_streams
    rows = trace_frame(result)
    assert len(rows) == 80
    errors = rows[rows["status"] == "http_error"]
    assert errors["http_status"].value_counts().to_dict() == {k: v for k, v in injected.items() if v}
    assert injected[500] > 0 and injected[429] > 0
    cuts = rows[rows["status"] == "cut"]
    assert len(cuts) == cut > 0
    assert (cuts["num_chunks"] == 2).all() and cuts["error"].str.contains(
        "without \\[DONE\\]|connection"
    ).all()
    assert (errors["error"].str.startswith("HTTP ")).all()
    assert (rows["status"] == "ok").sum() == 80 - len(errors) - len(cuts)


async def test_drain_timeout_cancels_and_records_what_arrived() -> None:
    async with SimServer(SimConfig(time_scale=1.0)) as sim:
        stage = _stage({"kind": "max_throughput"}, _workload(5000).requests(), max_requests=3)
        result = await _run(sim, [stage], drain_timeout_s=0.3)
    rows = trace_frame(result)
    assert (rows["status"] == "cancelled").all() and result.stages[0].drain_cancelled == 3
    assert rows["error"].str.contains("drain timeout").all()
    assert (rows["num_chunks"] > 0).all()


async def test_stop_ends_issuing_and_drains() -> None:
    async with SimServer(SimConfig(time_scale=0)) as sim:
        session = LoadSession(_settings(sim))
        async with session:
            stage = _stage({"kind": "uniform", "rate": 50}, _workload().requests(), duration_s=30)
            asyncio.get_running_loop().call_later(0.3, session.stop)
            result = await session.run([stage, stage])
    assert len(result.stages) == 1 and result.stages[0].stopped
    assert 10 <= result.stages[0].issued <= 20
    assert all(r.status == "ok" for r in result.records)


async def test_rate_sweep_and_duration_limit() -> None:
    async with SimServer(SimConfig(time_scale=0)) as sim:
        base = parse_scheduler({"kind": "poisson", "rate": 1, "seed": 4})
        stages = sweep_stages(base, [50, 200], _workload().requests(), duration_s=0.5)
        result = await _run(sim, stages)
    rows = trace_frame(result)
    counts = rows.groupby("stage").size()
    assert list(result.stages[i].requested_rate for i in range(2)) == [50.0, 200.0]
    assert counts["poisson-rate-50"] == pytest.approx(25, abs=15)
    assert counts["poisson-rate-200"] == pytest.approx(100, abs=35)
    assert (
        rows.groupby("stage")["intended_ns"].max() - rows.groupby("stage")["intended_ns"].min() < 5e8
    ).all()


async def test_multi_turn_sessions_grow_their_context() -> None:
    work = _workload(6, multi_turn={"max_rounds": 3, "think_time_s": 0.05})
    async with SimServer(SimConfig(time_scale=0)) as sim:
        result = await _run(
            sim, [_stage({"kind": "concurrency", "concurrency": 2}, work.requests(), max_requests=4)]
        )
    rows = trace_frame(result)
    assert len(rows) == 12 and (rows["status"] == "ok").all()
    for _, conv in rows.groupby("session_id"):
        conv = conv.sort_values("round_index")
        assert list(conv["round_index"]) == [0, 1, 2]
        inputs = conv["input_tokens"].to_numpy()
        assert np.all(np.diff(inputs) > 6)  # previous prompt + 6 answer tokens + a new question
        gaps = conv["send_ns"].to_numpy()[1:] - conv["done_ns"].to_numpy()[:-1]
        assert (gaps >= 50_000_000).all()  # think time respected


async def test_self_timed_workload_plan() -> None:
    work = _workload(streaming=False)
    async with SimServer(SimConfig(time_scale=0)) as sim:
        stage = Stage("plan", work.plan(duration_s=0.5), duration_s=0.5, requested_rate=40)
        result = await _run(sim, [stage])
    rows = trace_frame(result)
    assert len(rows) == pytest.approx(20, abs=12)
    assert (rows["status"] == "ok").all() and (rows["num_chunks"] == 1).all()
    assert (rows["output_tokens"] == rows["max_tokens"]).all()


def test_plan_items_are_request_specs() -> None:
    first = next(itertools.islice(_workload().plan(1.0), 1))
    assert isinstance(first[1], RequestSpec)


async def test_a_request_past_its_time_limit_is_a_timeout() -> None:
    work = _workload(output=400)
    async with SimServer(SimConfig(time_scale=1.0)) as sim:
        stage = _stage({"kind": "concurrency", "concurrency": 2}, work.requests(), max_requests=2)
        result = await _run(sim, [stage], request_timeout_s=0.2)
    assert [r.status for r in result.records] == ["timeout", "timeout"]
    assert all(0 < r.stream.completion_tokens < 400 for r in result.records)  # cut by the client's clock


async def test_only_young_collector_passes_while_a_stage_sends_and_the_collector_is_restored() -> None:
    # a generation-1 pass stops the loop for ms and the sends due behind it go late: at 4000 req/s the
    # interpreter's thresholds ran one every ~0.1 s for 1.5-4 ms (issue #38)
    gc.collect()
    before = (gc.get_threshold(), gc.get_freeze_count(), gc.isenabled())
    requests = _workload(output=2).requests()
    stage = _stage({"kind": "uniform", "rate": 4000}, requests, max_requests=1000)
    async with SimServer(SimConfig(time_scale=0)) as sim:
        result = await _run(sim, [stage])
    assert [r.status for r in result.records] == ["ok"] * 1000
    # 1000 requests keep ~9 tracked objects each (their records) and the sim allocates in this process
    # too: dozens of young passes, enough for several generation-1 passes under the interpreter's rule
    passes = result.stages[0].gc_passes
    assert len(passes) >= 20 and {p.generation for p in passes} == {0}
    assert (gc.get_threshold(), gc.get_freeze_count(), gc.isenabled()) == before
