"""Fault injection of the simulated engine: seeded per-request decisions (HTTP errors, cut streams).

Engine-level faults (die after N requests or at a time, stall a step) are applied by ``SimEngine`` and
``SimServer``; this module draws the per-request ones from ``random.Random`` seeded by the server's seed,
so a run with the same seed and the same arrival order injects the same faults.

How vLLM dies (``death: vllm``): when its engine core dies, the API server catches ``EngineDeadError``
inside each open stream and sends it as an error event (type ``BadRequestError``, code 400: the default of
its streaming error response), then ``[DONE]``; ``/health`` answers 500 and ``/metrics`` still answers
until the server has shut down, a moment later (``VLLM_DEATH_GRACE_S``), after which the port is closed.
"""

from __future__ import annotations

import hashlib
import json
import random
import time
from collections.abc import Sequence

from engine_harness.sim.openai_wire import error_body
from engine_harness.sim.params import FaultConfig

__all__ = ["VLLM_DEATH_GRACE_S", "VLLM_DEATH_MESSAGE", "FaultInjector", "vllm_death_events"]

VLLM_DEATH_MESSAGE = "EngineCore encountered an issue. See stack trace (above) for the root cause."
VLLM_DEATH_GRACE_S = 3.0


def vllm_death_events() -> bytes:
    """What an open stream receives from vLLM when its engine core dies: the error event, then [DONE]."""
    event = json.dumps(error_body(VLLM_DEATH_MESSAGE, 400, "BadRequestError"))
    return f"data: {event}\n\ndata: [DONE]\n\n".encode()


_ERROR_TYPES = {500: "InternalServerError", 429: "TooManyRequestsError"}


class FaultInjector:
    """Draws, request by request, whether to answer with an error and where to cut the stream."""

    def __init__(self, faults: FaultConfig, seed: int) -> None:
        self.faults = faults
        self._rng = random.Random(f"faults:{seed}")
        self.injected_errors = {500: 0, 429: 0}
        self.cut_streams = 0

    def retry_after(self, status: int) -> dict[str, str]:
        """The headers of an injected error: ``Retry-After`` on a 429 when the faults ask for one."""
        if status != 429 or self.faults.retry_after_s is None:
            return {}
        return {"Retry-After": f"{self.faults.retry_after_s:g}"}

    def http_error(self) -> tuple[int, str, str] | None:
        """``(status, error type, message)`` for a request to fail, or ``None`` (one draw per request)."""
        f = self.faults
        if not (f.error_500_fraction or f.error_429_fraction):
            return None
        u = self._rng.random()
        if u < f.error_500_fraction:
            status = 500
        elif u < f.error_500_fraction + f.error_429_fraction:
            status = 429
        else:
            return None
        self.injected_errors[status] += 1
        return status, _ERROR_TYPES[status], f"sim fault injection: HTTP {status}"

    def log_request(self, prompt: Sequence[int], status: int | None) -> None:
        """With HTTP faults on, one line per request on the engine's log: the prompt's length and a key of
        its ids, the error injected (or ``ok``), the wall time. The fault tier reads from it where each
        fault landed and when the client sent the same prompt again (``Retry-After`` honoured)."""
        if not (self.faults.error_500_fraction or self.faults.error_429_fraction):
            return
        key = hashlib.blake2b(repr(list(prompt)).encode(), digest_size=4).hexdigest()
        line = f"sim request: {len(prompt)}-token prompt {key} -> {status or 'ok'} @{time.time():.6f}"
        print(line, flush=True)

    def cut_after(self) -> int | None:
        """Content chunks a new stream may send before its connection is closed (``None``: not cut)."""
        f = self.faults
        if f.cut_after_chunks is None:
            return None
        if f.cut_fraction < 1 and self._rng.random() >= f.cut_fraction:
            return None
        return f.cut_after_chunks
