"""A hung engine, detected: the engine whose phase is running made no progress for ``stall_s`` seconds.

Progress of an engine is any of: its ``/metrics`` answered with a different step/token counter than
before, or the client received a byte of the stream. An engine that is busy computing a long prefill
advances its step counter every chunk; one that is stopped (``SIGSTOP``), deadlocked or wedged in a
transfer does not, and its ``/metrics`` may not even answer. The watchdog blames the engine of the
phase in progress (the proxy's stamps say which) and says what it saw, including a stopped process.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass

import aiohttp

from engine_harness.metrics import MetricsError, scrape
from engine_harness.process_group import stopped_pids

__all__ = ["EngineWatch", "Hung", "progress_key", "watch_request"]

# counters that move with every engine step or token (vLLM names; the sim uses the same)
_PROGRESS = (
    "vllm:iteration_tokens_total_count",
    "vllm:prompt_tokens_total",
    "vllm:generation_tokens_total",
    "vllm:nixl_xfer_time_seconds_count",
)


@dataclass(frozen=True)
class EngineWatch:
    """One engine the watchdog may probe: its role, base URL and process group."""

    role: str
    url: str
    pgid: int | None


@dataclass(frozen=True)
class Hung:
    """What the watchdog concluded: which engine, for how long, and what it saw."""

    role: str
    stalled_s: float
    detail: str

    def reason(self) -> str:
        return f"the {self.role} engine made no progress for {self.stalled_s:.0f} s ({self.detail})"


def progress_key(samples: dict[tuple[str, frozenset[tuple[str, str]]], float]) -> tuple[float, ...]:
    """The sums of the progress counters in one scrape (pure; a missing counter counts 0)."""
    return tuple(sum(v for (name, _), v in samples.items() if name == counter) for counter in _PROGRESS)


async def _probe(
    session: aiohttp.ClientSession, engine: EngineWatch, timeout_s: float
) -> tuple[float, ...] | None:
    try:
        snap = await scrape(session, engine.url, timeout_s=timeout_s)
    except (MetricsError, aiohttp.ClientError, TimeoutError):
        return None
    return progress_key(snap.samples)


def _detail(engine: EngineWatch, answered: bool) -> str:
    stopped = stopped_pids(engine.pgid)
    parts = [f"process(es) {stopped} are stopped (SIGSTOP?)"] if stopped else []
    parts.append(
        "its /metrics still answers but no counter moved" if answered else "its /metrics did not answer"
    )
    return "; ".join(parts)


async def watch_request(
    session: aiohttp.ClientSession,
    active: Callable[[], EngineWatch],
    streamed: Callable[[], int],
    stall_s: float,
) -> Hung:
    """Return once the engine of the active phase (``active()``) has made no progress for ``stall_s``;
    ``streamed()`` counts the bytes/chunks the client has received. Run it beside the request and
    cancel it when the request ends."""
    poll_s = min(1.0, stall_s / 4)
    engine = active()
    last_key: tuple[float, ...] | None = None
    last_streamed = streamed()
    t_progress = time.perf_counter()
    answered = True
    while True:
        await asyncio.sleep(poll_s)
        now_engine = active()
        key = await _probe(session, now_engine, timeout_s=max(poll_s, min(5.0, stall_s / 2)))
        answered = key is not None
        if now_engine != engine or (key is not None and key != last_key) or streamed() != last_streamed:
            engine, last_key, last_streamed = now_engine, key, streamed()
            t_progress = time.perf_counter()
            continue
        stalled = time.perf_counter() - t_progress
        if stalled >= stall_s:
            return Hung(engine.role, stalled, _detail(engine, answered))
