"""The event loop every client of the suite runs on: uvloop where it is installed, asyncio's otherwise.

uvloop's loop spends less CPU per socket read and timer than asyncio's pure-Python one, which matters
twice here: a load generator's schedule delay and a sweep's token stamps both depend on the client
getting back to its loop quickly.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import gc
import time
from collections.abc import Coroutine, Iterator
from typing import Any, TypeVar

__all__ = ["GcPass", "GcPasses", "LagMonitor", "loop_name", "no_full_collections", "run"]

T = TypeVar("T")


def loop_name() -> str:
    """Which loop ``run`` uses here: ``uvloop`` or ``asyncio``."""
    try:
        import uvloop  # noqa: F401
    except ImportError:
        return "asyncio"
    return "uvloop"


def run(main: Coroutine[Any, Any, T]) -> T:
    """``asyncio.run(main)`` on a uvloop loop when uvloop is importable.

    The main task returns nothing and ``main``'s result is handed back beside it: Python 3.11's runner
    formats the finished main task's repr on its way out (``signal.getsignal`` of its SIGINT handler),
    result included — 0.4 s for a session of 20,000 records, more with long prompts.
    """
    box: list[T] = []

    async def keep() -> None:
        box.append(await main)

    try:
        import uvloop
    except ImportError:
        asyncio.run(keep())
        return box[0]
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(keep())
    return box[0]


@contextlib.contextmanager
def no_full_collections() -> Iterator[None]:
    """Inside the block the collector only walks the youngest objects: no generation-1 or full pass.

    A full pass walks every object the process holds (pandas, pydantic, the stamps so far) with the
    event loop stopped: measured 55–110 ms on the CPU engine's client, long enough to deliver a dozen
    decode tokens in one read or to send a scheduled request late. A generation-1 pass walks what
    survived the last ten young ones (the records and streams in flight): 1.5–4 ms every ~0.1 s for a
    load generator at 4000 req/s. Inside the block the objects alive at its start are frozen out of
    collection and only generation 0 is collected automatically (a pass walks the few hundred objects
    made since the last one: ~0.05 ms); what survives one young pass waits for an explicit collection
    where nothing is being timed (``gc.collect()`` between sweep points and load-generator stages).
    Entering costs nothing (no collection first: garbage frozen with the rest is freed after the block).
    """
    gc.freeze()
    thresholds = gc.get_threshold()
    gc.set_threshold(thresholds[0], _NEVER, _NEVER)
    try:
        yield
    finally:
        gc.set_threshold(*thresholds)
        gc.unfreeze()


_NEVER = 1_000_000  # a threshold of collections of the younger generation that no session reaches


@dataclasses.dataclass(frozen=True)
class GcPass:
    """One garbage-collector pass in this process, stamped with ``perf_counter_ns`` at its start and end:
    the event loop stood still in between."""

    start_ns: int
    end_ns: int
    generation: int
    collected: int


class GcPasses:
    """``with GcPasses() as passes:`` every collector pass of this process inside the block, in
    ``passes.passes`` (a ``gc.callbacks`` entry: two stamps per pass)."""

    def __init__(self) -> None:
        self.passes: list[GcPass] = []
        self._start_ns = 0

    def __enter__(self) -> GcPasses:
        gc.callbacks.append(self._stamp)
        return self

    def __exit__(self, *exc: object) -> None:
        gc.callbacks.remove(self._stamp)

    def _stamp(self, phase: str, info: dict[str, int]) -> None:
        now = time.perf_counter_ns()
        if phase == "start":
            self._start_ns = now
        else:
            self.passes.append(GcPass(self._start_ns, now, info["generation"], info["collected"]))

    def between(self, t0_ns: int, t1_ns: int) -> list[GcPass]:
        """The passes that began in [t0, t1]."""
        return [p for p in self.passes if t0_ns <= p.start_ns <= t1_ns]


class LagMonitor:
    """The client's own event-loop lag: how late a short timer fires, sampled while it runs.

    A decode gap the client stamped late because its own loop was busy (a GC pass, a slow callback) looks
    like a server stall in the stamps; the lag recorded beside each window tells the two apart.
    """

    # 5 ms: a stall that matters to a decode gap (≥ 10 ms) is seen, at 200 wake-ups a second, not 1000
    def __init__(self, period_s: float = 0.005, keep: int = 50_000) -> None:
        self.period_s = period_s
        self.samples: collections.deque[tuple[int, float]] = collections.deque(maxlen=keep)
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        period_ns = int(self.period_s * 1e9)
        while True:
            t = time.perf_counter_ns()
            await asyncio.sleep(self.period_s)
            now = time.perf_counter_ns()
            self.samples.append((now, max(now - t - period_ns, 0) / 1e6))

    def max_ms(self, t0_ns: int, t1_ns: int) -> float | None:
        """The worst lag of the samples taken in [t0, t1] (None: no sample there)."""
        worst: float | None = None
        for t, lag in reversed(self.samples):  # the window is recent: walk back from the newest sample
            if t < t0_ns:
                break
            if t <= t1_ns:
                worst = lag if worst is None else max(worst, lag)
        return worst

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
