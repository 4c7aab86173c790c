"""The sweep's infrastructure faults: which errors are the engine's absence (not a measurement), and
how many in a row the sweep rides out before it stops with a clear message.

An infrastructure fault (``microbench.results.faults``: the engine died, refused or dropped a
connection, answered HTTP 429/5xx, its /metrics failed) spends none of a point's attempts: the runner
notes it in the manifest, waits (the server's ``Retry-After`` when it sent one), brings the engine back
when it is gone, warms it up again after a restart, and measures the point again. Faults in a row
without a point finishing are bounded by ``FaultBudget``; the sweep then stops (exit 1, resumable).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp

from engine_harness.launch import EngineError
from engine_harness.metrics import MetricsError
from microbench.client.retry import is_transient
from microbench.client.streams import HTTPStatusError, ServerStreamError, StreamError
from microbench.results.faults import INFRASTRUCTURE

__all__ = ["MAX_FAULTS_IN_A_ROW", "FaultBudget", "InfrastructureFault", "batch_fault", "infrastructure_error"]

MAX_FAULTS_IN_A_ROW = 20


class InfrastructureFault(RuntimeError):
    """An attempt spoiled by the infrastructure (raised by the runner to its chunk loop)."""

    def __init__(self, why: str, retry_after: float | None = None) -> None:
        super().__init__(why)
        self.retry_after = retry_after


def infrastructure_error(exc: BaseException) -> InfrastructureFault | None:
    """``exc`` as an infrastructure fault, or None when it is a verdict on the measurement."""
    if isinstance(exc, InfrastructureFault):
        return exc
    if isinstance(exc, HTTPStatusError | ServerStreamError) and not is_transient(exc):
        return None  # HTTP 4xx, an error inside the stream: the engine's answer to this very request
    if not isinstance(exc, StreamError | MetricsError | EngineError | aiohttp.ClientError | TimeoutError):
        return None  # e.g. ProtocolError: the engine was there and did not behave as the protocol needs
    why = f"{INFRASTRUCTURE}{type(exc).__name__}: {exc}"
    return InfrastructureFault(why, getattr(exc, "retry_after", None))


def batch_fault(tasks: Sequence[asyncio.Task[Any]]) -> InfrastructureFault | None:
    """The infrastructure fault that ended a decode batch's stream (e.g. HTTP 500 at its start), if any."""
    errors = [t.exception() for t in tasks if t.done() and not t.cancelled()]
    faults = [infrastructure_error(exc) for exc in errors if exc is not None]
    return next((f for f in faults if f is not None), None)


@dataclass
class FaultBudget:
    """Infrastructure faults since the last point finished; too many in a row stop the sweep."""

    limit: int = MAX_FAULTS_IN_A_ROW
    in_a_row: int = 0
    total: int = 0

    def spend(self) -> bool:
        """Count one fault; False once the budget is exhausted."""
        self.in_a_row += 1
        self.total += 1
        return self.in_a_row <= self.limit

    def progress(self) -> None:
        self.in_a_row = 0

    async def back_off(self, fault: InfrastructureFault) -> None:
        """Wait before trying again: what the server asked for (at most 60 s), else 0.1 s doubling to 2 s
        (an engine that answers every request with a 5xx is given up on after about two minutes)."""
        if fault.retry_after is not None:
            await asyncio.sleep(min(fault.retry_after, 60.0))
        else:
            await asyncio.sleep(min(0.1 * 2 ** (self.in_a_row - 1), 2.0))
