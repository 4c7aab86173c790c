"""``StepClock``: front-end work waits out a step's last ms, never longer than the step's end (+ 50 ms).

Judged by what the waiting returned on, not by how long it took: these run in the unit tier, beside real
engines at nice 19 in CI, where a 30 ms timer fired at 61 ms (local CI 57)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Coroutine
from typing import Any

from engine_harness.sim.step_clock import StepClock

MS = 1_000_000


def _at_once(work: Coroutine[Any, Any, None]) -> bool:
    """Whether ``work`` completes without suspending (it never gives the loop a turn)."""
    try:
        work.send(None)
    except StopIteration:
        return True
    work.close()
    return False


async def test_with_no_step_running_or_time_to_spare_the_work_goes_ahead_at_once() -> None:
    clock = StepClock()
    assert clock.left_ns() is None and _at_once(clock.clear_of(5 * MS))
    clock.begin(time.perf_counter_ns() + 10_000 * MS)
    left = clock.left_ns()
    assert left is not None and 9_000 * MS < left <= 10_000 * MS
    assert _at_once(clock.clear_of(5 * MS))
    assert not _at_once(clock.clear_of(20_000 * MS))  # more work than the step has left: it waits


async def test_work_that_would_end_the_step_late_waits_for_its_end() -> None:
    clock = StepClock()
    clock.begin(time.perf_counter_ns() + 3 * MS)
    loop = asyncio.get_running_loop()
    t = time.perf_counter_ns()
    loop.call_later(0.03, clock.end)  # the step ends 30 ms on (late): the work waits for that, not for 3 ms
    await clock.clear_of(5 * MS)
    # it returned on the end (timers fire in deadline order, so the end's comes before the 53 ms give-up)
    assert clock.left_ns() is None
    assert time.perf_counter_ns() - t >= 25 * MS


async def test_a_step_that_never_ends_holds_the_work_its_time_left_and_50_ms_only() -> None:
    clock = StepClock()
    clock.begin(time.perf_counter_ns() + 2 * MS)
    t = time.perf_counter_ns()
    await asyncio.wait_for(clock.clear_of(5 * MS), timeout=10)  # it gives up by itself
    left = clock.left_ns()
    assert left is not None and left < 0  # the step never ended: the work went ahead anyway
    assert time.perf_counter_ns() - t >= 45 * MS
