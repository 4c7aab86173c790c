"""``StepClock``: front-end work waits out a step's last ms, never longer than the step's end (+ 50 ms)."""

from __future__ import annotations

import asyncio
import time

from engine_harness.sim.step_clock import StepClock

MS = 1_000_000


async def test_with_no_step_running_or_time_to_spare_the_work_goes_ahead_at_once() -> None:
    clock = StepClock()
    assert clock.left_ns() is None
    t = time.perf_counter_ns()
    await clock.clear_of(5 * MS)
    clock.begin(time.perf_counter_ns() + 200 * MS)
    left = clock.left_ns()
    assert left is not None and 150 * MS < left <= 200 * MS
    await clock.clear_of(5 * MS)
    assert time.perf_counter_ns() - t < 20 * MS


async def test_work_that_would_end_the_step_late_waits_for_its_end() -> None:
    clock = StepClock()
    clock.begin(time.perf_counter_ns() + 3 * MS)
    loop = asyncio.get_running_loop()
    t = time.perf_counter_ns()
    loop.call_later(0.03, clock.end)  # the step ends 30 ms on (late): the work waits for that, not for 3 ms
    await clock.clear_of(5 * MS)
    waited = time.perf_counter_ns() - t
    assert 25 * MS <= waited < 45 * MS, waited / MS
    assert clock.left_ns() is None


async def test_a_step_that_never_ends_holds_the_work_its_time_left_and_50_ms_only() -> None:
    clock = StepClock()
    clock.begin(time.perf_counter_ns() + 2 * MS)
    t = time.perf_counter_ns()
    await clock.clear_of(5 * MS)
    waited = time.perf_counter_ns() - t
    assert 45 * MS <= waited < 150 * MS, waited / MS
