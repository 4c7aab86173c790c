"""What the interference protocol talks to: one engine's URL, model name, metric names, step source and
the client's loop-lag monitor (``EngineClient``), and the protocol's own errors.

``ProtocolError``: the engine answered but could not be brought into the state a measurement needs (e.g.
never idle); ``NotSteady``: the decode batch did not reach (or hold) steady state before an injection.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from engine_harness.metric_names import MetricNames
from engine_harness.metrics import Snapshot, scrape
from engine_harness.steps import StepSource
from microbench.client.aio import LagMonitor
from microbench.client.streams import StreamRecord, stream_request
from microbench.results.derive import METRICS_READ

__all__ = ["EngineClient", "NotSteady", "ProtocolError", "wait_idle"]


class ProtocolError(RuntimeError):
    """The engine could not be brought into the state a measurement needs (e.g. never steady)."""


class NotSteady(ProtocolError):
    """The decode batch did not reach (or hold) steady state before an injection; nothing was injected."""


@dataclass
class EngineClient:
    """Everything the protocol needs to reach one engine."""

    session: aiohttp.ClientSession
    base_url: str
    model: str
    metrics: MetricNames
    steps: StepSource | None = None
    headers: dict[str, str] = field(default_factory=dict)
    lag: LagMonitor | None = None

    @property
    def completions_url(self) -> str:
        return f"{self.base_url}/v1/completions"

    async def scrape(self) -> Snapshot:
        """/metrics, parsed for what a measurement reads (``derive.METRICS_READ``) only: a whole vLLM page
        costs the client 15 ms of CPU on a 2-core box (SGLang's 30), twice a point and every 50 ms of
        ``wait_idle``, on the cores the engine it measures runs on; the filtered page about 3 ms."""
        families = [name for quantity in METRICS_READ for name in getattr(self.metrics, quantity)]
        return await scrape(self.session, self.base_url, families=families)

    def payload(self, prompt: list[int], max_tokens: int, **extra: Any) -> dict[str, Any]:
        return {
            "model": self.model,
            "prompt": prompt,
            "max_tokens": max_tokens,
            "temperature": 0,
            "stream_options": {"include_usage": True, "continuous_usage_stats": True},
            **extra,
        }

    async def alive(self, timeout_s: float = 5.0) -> bool:
        """Whether the engine still answers ``/health`` with 200: after an error inside a stream, it tells
        an engine that died (vLLM: its engine core; then 500, then a closed port) from one that answered
        this very request with an error."""
        try:
            timeout = aiohttp.ClientTimeout(total=timeout_s)
            async with self.session.get(
                f"{self.base_url}/health", headers=self.headers, timeout=timeout
            ) as r:
                return r.status == 200
        except (aiohttp.ClientError, TimeoutError):
            return False

    async def complete(self, prompt: list[int], max_tokens: int = 1) -> StreamRecord:
        return await stream_request(
            self.session, self.completions_url, self.payload(prompt, max_tokens), headers=self.headers
        )


async def wait_idle(client: EngineClient, timeout_s: float) -> None:
    """Until the engine has no running and no waiting requests (as its /metrics say)."""
    deadline = time.monotonic() + timeout_s
    while True:
        snap = await client.scrape()
        running = snap.total(client.metrics.requests_running)
        waiting = snap.total(client.metrics.requests_waiting)
        if running is None or waiting is None:
            raise ProtocolError(f"/metrics of {client.base_url} lacks running/waiting request gauges")
        if running == 0 and waiting == 0:
            return
        if time.monotonic() > deadline:
            raise ProtocolError(
                f"engine not idle after {timeout_s:.0f} s ({running} running, {waiting} waiting)"
            )
        await asyncio.sleep(0.05)
