"""A request's tokens as the simulated engine produces them, read by its HTTP handler (``await next()``)."""

from __future__ import annotations

import asyncio
import random
import time

from engine_harness.scheduler_model import EOS_TOKEN_ID, SimRequest
from engine_harness.sim.tokenizer import sample_token

__all__ = ["EngineDead", "RequestStream"]


class EngineDead(RuntimeError):
    """The engine died (fault injection) while the request was in flight."""


class RequestStream:
    """Tokens of one request as the engine produces them; read with ``await next()``."""

    __slots__ = (
        "_rng",
        "_waiter",
        "eos_probability",
        "error",
        "finish_reason",
        "finished",
        "num_emitted",
        "pending",
        "request",
        "t_arrival_ns",
        "t_first_token_ns",
        "t_last_token_ns",
        "t_scheduled_ns",
    )

    def __init__(self, request: SimRequest, rng: random.Random, eos_probability: float) -> None:
        self.request = request
        self.pending: list[int] = []
        self.finished = False
        self.finish_reason: str | None = None
        self.error: str | None = None
        self.num_emitted = 0
        self.t_arrival_ns = time.perf_counter_ns()
        self.t_scheduled_ns: int | None = None
        self.t_first_token_ns: int | None = None
        self.t_last_token_ns: int | None = None
        self.eos_probability = eos_probability
        self._rng = rng
        self._waiter: asyncio.Future[None] | None = None  # the reader's, while it waits (no Event: per token)

    @property
    def request_id(self) -> str:
        return self.request.request_id

    def draw(self) -> int:
        """The next generated token id (EOS with probability ``eos_probability``)."""
        if self.eos_probability and self._rng.random() < self.eos_probability:
            return EOS_TOKEN_ID
        return sample_token(self._rng)

    def _push(self, token: int, finish_reason: str | None) -> None:
        self.pending.append(token)
        self.num_emitted += 1
        if finish_reason is not None:
            self.finished, self.finish_reason = True, finish_reason
        self._wake()

    def _end(self, finish_reason: str | None, error: str | None = None) -> None:
        self.finished, self.finish_reason, self.error = True, finish_reason, error
        self._wake()

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    async def next(self) -> list[int]:
        """Wait for new tokens and take them; ``[]`` once the request has finished and all are taken.

        Raises ``EngineDead`` if the engine died while the request was in flight.
        """
        while not self.pending and not self.finished:
            self._waiter = asyncio.get_running_loop().create_future()
            await self._waiter
        if self.error is not None:
            raise EngineDead(self.error)
        tokens, self.pending = self.pending, []
        return tokens
