"""Retries of requests an engine turned away for a moment (HTTP 429, HTTP 5xx, no connection), with tenacity.

Only requests whose timing is not a measurement are retried this way (warm-up, priming the shared
prefix); a measured request is never silently re-sent. A 429 (or 503) carrying ``Retry-After`` waits
exactly as long as the server asked (capped by ``max_wait_s``); every other transient failure backs off
exponentially with jitter. Anything else (HTTP 400, a malformed stream) is not retried: it would fail
the same way again.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TypeVar

import aiohttp
import tenacity

from microbench.client.streams import ConnectFailed, HTTPStatusError, StreamCut

__all__ = ["RetryAfterWait", "is_transient", "retrying", "with_retry"]

T = TypeVar("T")


def is_transient(exc: BaseException) -> bool:
    """True for a failure that says "not now" rather than "never": HTTP 429 or 5xx, no connection."""
    if isinstance(exc, HTTPStatusError):
        return exc.status == 429 or exc.status >= 500
    if isinstance(exc, ConnectFailed):
        return True
    if isinstance(exc, StreamCut):
        return not exc.record.chunk_t_ns  # cut before any token: nothing of it was used
    return isinstance(exc, aiohttp.ClientConnectionError | TimeoutError)


class RetryAfterWait(tenacity.wait.wait_base):
    """Wait what the server's ``Retry-After`` asked for, else exponential backoff with jitter."""

    def __init__(self, initial_s: float = 0.1, max_wait_s: float = 30.0) -> None:
        self.max_wait_s = max_wait_s
        self.backoff = tenacity.wait_exponential(multiplier=initial_s, max=max_wait_s) + tenacity.wait_random(
            0, initial_s
        )

    def __call__(self, retry_state: tenacity.RetryCallState) -> float:
        outcome = retry_state.outcome
        exc = outcome.exception() if outcome is not None else None
        asked = getattr(exc, "retry_after", None)
        if asked is not None:
            return float(min(asked, self.max_wait_s))
        return float(self.backoff(retry_state))


def retrying(attempts: int = 6, max_wait_s: float = 30.0) -> tenacity.AsyncRetrying:
    """A tenacity controller: up to ``attempts`` tries of transient failures; the last error re-raised."""
    return tenacity.AsyncRetrying(
        stop=tenacity.stop_after_attempt(attempts),
        wait=RetryAfterWait(max_wait_s=max_wait_s),
        retry=tenacity.retry_if_exception(is_transient),
        reraise=True,
    )


async def with_retry(call: Callable[[], Awaitable[T]], attempts: int = 6, max_wait_s: float = 30.0) -> T:
    """``await call()``, retried on transient failures (see ``retrying``)."""
    async for attempt in retrying(attempts, max_wait_s):
        with attempt:
            return await call()
    raise AssertionError("unreachable: tenacity re-raises the last error")  # pragma: no cover
