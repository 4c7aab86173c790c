"""When the sim's running step ends on the model's grid, for front-end work that must not make it late.

The sim's HTTP front end shares one event loop with its step loop. vLLM renders ``/metrics`` in its API
server process, apart from its engine core, so a scrape never delays a step; on the sim's loop a render
(1.9 ms for vLLM's metric set on the box of 2026-11-30, about 3 ms with its request) begun in a step's last
ms ended that step late: 7 of 16 steps over 1 ms late in two calibration traces ended within 2.5 ms of a
scrape's reply. ``StepClock`` says how long the running step has left, and lets such work wait for its end:
the sim's step metrics change when a step ends, so a page rendered right after that end holds all that one
rendered before it would have held (and the arrivals since).
"""

from __future__ import annotations

import asyncio
import contextlib
import time

__all__ = ["StepClock"]

_STALL_S = 0.05  # the longest a caller waits past the step's planned end (a step the host stalled)


class StepClock:
    """The running step's planned end (set by the step loop), and its end as an awaitable event."""

    def __init__(self) -> None:
        self._end_ns: int | None = None
        self._ended = asyncio.Event()

    def begin(self, end_ns: int) -> None:
        """A step (or its next part) runs until ``end_ns`` (perf_counter_ns) on the model's grid."""
        self._end_ns = end_ns

    def end(self) -> None:
        """The running step ended: release whoever waits for it."""
        self._end_ns = None
        self._ended.set()
        self._ended = asyncio.Event()

    def left_ns(self) -> int | None:
        """Time left of the running step (negative: it runs late); None while no step runs."""
        return None if self._end_ns is None else self._end_ns - time.perf_counter_ns()

    async def clear_of(self, work_ns: int) -> None:
        """Return when ``work_ns`` of work done now would not make the running step end late: at once when
        no step runs or it has more time left, else right after it ends (no later than its planned end plus
        ``_STALL_S``: a step the host stalled does not hold the caller)."""
        left = self.left_ns()
        if left is None or left > work_ns:
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._ended.wait(), max(left, 0) / 1e9 + _STALL_S)
