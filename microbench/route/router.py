"""The offload router: an aiohttp server in front of a prefill worker and a decode worker.

It is the measurement floor's PD proxy (``microbench.measure.pd_proxy.PDProxy``: vLLM's two-step NIXL
protocol, every phase stamped with ``perf_counter_ns``, per-phase timeouts, 502 or an SSE error event
instead of a hang) with one step in front: per request a policy (``microbench.route.decide``) picks
**offload** (prefill on the prefill worker with ``max_tokens=1``, its ``kv_transfer_params`` into the
decode worker's request) or **local** (the request goes straight to the decode worker, which prefills
and decodes it). Its inputs are logged per request in ``decisions``: D = the requests the router has on
the decode worker right now (from the moment their decode-worker leg is sent to the end of its stream),
P = the prompt's tokens (a token-id prompt's length; the workload's prompts are cold, so every token is
uncached — the engines' prefix-cache counters verify it), chunk = the decode worker's token budget.

The request id is the client's ``X-Request-Id``, else the body's ``user`` field (the route workload tags
every request so), else a fresh uuid; both engines get it.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

from aiohttp import web

from analysis.policy import OffloadPolicy
from microbench.measure.pd_proxy import PDProxy, PhaseStamps
from microbench.route.decide import PolicyName, RouteDecision, decide

__all__ = ["OffloadRouter", "prompt_tokens"]


def prompt_tokens(body: dict[str, Any]) -> int:
    """P of a request body: the length of a token-id prompt (a text prompt has no exact count here: 0)."""
    prompt = body.get("prompt")
    if isinstance(prompt, list) and all(isinstance(t, int) for t in prompt):
        return len(prompt)
    return 0


class OffloadRouter(PDProxy):
    """``async with OffloadRouter(...) as router``: serves ``POST /v1/completions`` on a free port."""

    def __init__(
        self,
        prefill_url: str,
        decode_url: str,
        prefill_kv_params: dict[str, Any] | None,
        policy: PolicyName,
        chunk: int,
        table: OffloadPolicy | None = None,
        timeout_s: float = 600.0,
        host: str = "127.0.0.1",
    ) -> None:
        super().__init__(prefill_url, decode_url, prefill_kv_params, timeout_s, host)
        if policy == "table" and table is None:
            raise ValueError("the table policy needs an offload table")
        self.policy: PolicyName = policy
        self.table = table
        self.chunk = chunk
        self.decisions: dict[str, RouteDecision] = {}
        self.decide_ns: dict[str, int] = {}  # time spent deciding, per request
        self.decode_running = 0
        if table is not None:  # the table builds its lookup grids on first use: not on a request's time
            decide("table", table, 1, 1, chunk)

    def reset(self, policy: PolicyName) -> None:
        """Start a new replay under ``policy``: the logs of the last one are dropped."""
        if policy == "table" and self.table is None:
            raise ValueError("the table policy needs an offload table")
        self.policy = policy
        self.decisions.clear()
        self.decide_ns.clear()
        self.stamps.clear()

    async def _completions(self, request: web.Request) -> web.StreamResponse:
        t_recv = time.perf_counter_ns()
        body = await request.json()
        rid = request.headers.get("X-Request-Id") or str(body.get("user") or "") or uuid.uuid4().hex
        stamps = PhaseStamps(request_id=rid, t_recv_ns=t_recv)
        self.stamps[rid] = stamps
        t0 = time.perf_counter_ns()
        decision = decide(self.policy, self.table, self.decode_running, prompt_tokens(body), self.chunk)
        self.decide_ns[rid] = time.perf_counter_ns() - t0
        self.decisions[rid] = decision
        decode = {**body, "stream": True}
        if decision.offload:
            params, fail = await self._prefill(stamps, body)
            if fail is not None:
                return fail
            if params is not None:
                decode["kv_transfer_params"] = params
        self.decode_running += 1
        try:
            return await self._decode(request, stamps, decode)
        finally:
            self.decode_running -= 1
