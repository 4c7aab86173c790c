"""Which step a request joins is the model's to say, not the host's: the sim takes a request into the first
step whose start on the model's grid is at or after its arrival, also when the loop comes late to plan it
(a /metrics page rendered on the sim's one event loop, 2-3 ms, where vLLM renders it in another process
than its engine core). A virtual-time replay of the model (``analysis.calibrate.replay``) admits requests
the same way, so a request that arrives while a step runs late must not join the next step early."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import pytest

from engine_harness.sim import SimConfig, SimStepModel
from engine_harness.sim.engine import SimEngine
from engine_harness.sim.step_record import StepRecord

pytestmark = [pytest.mark.integration, pytest.mark.clock]  # reads the clock: the clock pass

ALPHA_MS = 20.0


def _grid_start(log: list[StepRecord], index: int) -> int:
    """Step ``index``'s start on the model's grid: the previous step's end less how late it ended."""
    before = log[index - 1]
    return before.t_start_ns + before.duration_ns - before.behind_ns


async def _until(predicate: Callable[[], bool], timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "the sim did not get there"
        await asyncio.sleep(0.001)


async def test_a_request_arriving_while_a_step_runs_late_joins_the_step_after_it() -> None:
    engine = SimEngine(SimConfig(model="sim", time_scale=1.0, step=SimStepModel(alpha_ms=ALPHA_MS)))
    await engine.start()
    try:
        engine.submit(list(range(1, 17)), max_tokens=200, ignore_eos=True)  # keeps the engine stepping
        await _until(lambda: engine.num_steps >= 3)
        seen = engine.num_steps
        await _until(lambda: engine.num_steps > seen)  # a step has just ended: the next one is ≈ 20 ms away
        last = engine.step_log[-1]
        # the step after ``last`` ends on the grid at this time: block the loop from 3 ms before it to 4 ms
        # after it (the step ends late), and let a request arrive inside the block, after the grid's end
        next_end = last.t_start_ns + last.duration_ns - last.behind_ns + int(ALPHA_MS * 1e6)
        await SimEngine.wait_until(next_end - 3_000_000, 0)
        time.sleep(max(0, next_end + 2_000_000 - time.perf_counter_ns()) / 1e9)  # noqa: ASYNC251 - the block
        late = engine.submit(list(range(100, 132)), max_tokens=4, ignore_eos=True)
        time.sleep(0.002)  # noqa: ASYNC251 - the loop is still blocked past the request's arrival
        assert late.t_arrival_ns > next_end
        await _until(lambda: any(late.request_id in s.request_ids for s in engine.step_log))
        await _until(lambda: engine.num_steps >= last.index + 6)
    finally:
        await engine.stop()
    log = list(engine.step_log)
    took = next(s.index for s in log if late.request_id in s.request_ids)
    blocked = log[last.index + 1]  # the step that ran when the block began
    assert blocked.behind_ns >= 1_000_000, blocked  # the step did end late: the block was inside it
    # the step planned right after the late one starts on the grid at its planned end, before the request
    # arrived: the request joins the one after it (before: it joined the first step the late loop planned)
    assert took == blocked.index + 2, (took, blocked)
    assert _grid_start(log, took - 1) < late.t_arrival_ns <= _grid_start(log, took)
    # and every request taken into a step of the busy period arrived by the step's start on the grid
    for s in log[1:]:
        assert all(arrived <= _grid_start(log, s.index) for _, arrived in s.arrivals), s
