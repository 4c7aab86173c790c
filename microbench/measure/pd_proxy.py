"""The PD-disaggregation proxy: producer (prefill, ``max_tokens=1``) → KV hand-off → consumer (decode).

Part of the shared measurement floor: the transfer benchmark puts it between its engine pair, and a
router job can put it in front of any producer/consumer pair. A small aiohttp server with vLLM's
two-step protocol (the one of vLLM's NIXL toy proxy): each ``POST /v1/completions`` goes first to the
producer as a non-streaming request with ``max_tokens=1`` and the connector's ``kv_transfer_params``
(e.g. ``do_remote_decode``); the producer's response ``kv_transfer_params`` go unchanged into the
original request, which is then streamed from the consumer back to the client. Every phase is stamped
with ``time.perf_counter_ns()`` into a ``PhaseStamps`` kept under the request's ``X-Request-Id``
(``proxy.stamps`` in-process, or ``GET /stamps/<id>``); both engines get that id as their
``X-Request-Id``, as vLLM's toy proxy does (NIXL's push mode pairs the consumer's block registration
with the producer's finished request by request id). Every upstream await has a timeout; a producer or
consumer that fails, dies or stalls makes the proxy answer HTTP 502 (before the stream started) or an
SSE error event (after), with ``failed_phase`` and the error in the stamps — never a hang.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

import aiohttp
from aiohttp import web

from engine_harness.engines import API_LISTEN_BACKLOG
from microbench.client.session import engine_session
from microbench.client.streams import parse_sse_line

__all__ = ["PDProxy", "PhaseStamps"]

Phase = Literal["producer", "consumer"]


@dataclass
class PhaseStamps:
    """What the proxy saw of one request, in ``perf_counter_ns`` of this process."""

    request_id: str
    t_recv_ns: int
    t_producer_send_ns: int | None = None
    t_producer_done_ns: int | None = None
    t_consumer_send_ns: int | None = None
    t_consumer_headers_ns: int | None = None
    t_consumer_first_token_ns: int | None = None
    t_consumer_done_ns: int | None = None
    producer_status: int | None = None
    consumer_status: int | None = None
    producer_usage: dict[str, Any] | None = None
    kv_transfer_params_keys: list[str] = field(default_factory=list)
    failed_phase: Phase | None = None
    error: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


class PDProxy:
    """Proxy between a producer and a consumer engine; ``async with`` starts it on a free port."""

    def __init__(
        self,
        producer_url: str,
        consumer_url: str,
        prefill_kv_params: dict[str, Any] | None,
        timeout_s: float = 600.0,
        host: str = "127.0.0.1",
    ) -> None:
        self.producer_url = producer_url.rstrip("/")
        self.consumer_url = consumer_url.rstrip("/")
        self.prefill_kv_params = prefill_kv_params
        self.timeout_s = timeout_s
        self.host = host
        self.stamps: dict[str, PhaseStamps] = {}
        self.port: int | None = None
        self._runner: web.AppRunner | None = None
        self._session: aiohttp.ClientSession | None = None

    @property
    def base_url(self) -> str:
        if self.port is None:
            raise RuntimeError("the proxy is not running")
        return f"http://{self.host}:{self.port}"

    async def __aenter__(self) -> PDProxy:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def start(self) -> None:
        app = web.Application()
        app.router.add_post("/v1/completions", self._completions)
        app.router.add_get("/stamps/{rid}", self._get_stamps)
        app.router.add_get("/health", self._health)
        self._session = engine_session(timeout=aiohttp.ClientTimeout(total=None, sock_connect=10))
        self._runner = web.AppRunner(app, handler_cancellation=True, access_log=None, shutdown_timeout=2.0)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, 0, backlog=API_LISTEN_BACKLOG)  # as the engines listen
        await site.start()
        self.port = int(self._runner.addresses[0][1])

    async def stop(self) -> None:
        if self._runner is not None:
            await asyncio.wait_for(self._runner.cleanup(), timeout=10)
            self._runner = None
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def _health(self, request: web.Request) -> web.Response:
        return web.json_response({"producer": self.producer_url, "consumer": self.consumer_url})

    async def _get_stamps(self, request: web.Request) -> web.Response:
        stamps = self.stamps.get(request.match_info["rid"])
        if stamps is None:
            return web.json_response({"error": "unknown request id"}, status=404)
        return web.json_response(stamps.as_dict())

    @staticmethod
    def _fail(stamps: PhaseStamps, phase: Phase, error: str) -> web.Response:
        stamps.failed_phase, stamps.error = phase, error
        body = {"error": {"message": f"{phase} failed: {error}", "type": "ProxyError", "code": 502}}
        return web.json_response(body, status=502)

    async def _completions(self, request: web.Request) -> web.StreamResponse:
        t_recv = time.perf_counter_ns()
        rid = request.headers.get("X-Request-Id") or uuid.uuid4().hex
        stamps = PhaseStamps(request_id=rid, t_recv_ns=t_recv)
        self.stamps[rid] = stamps
        body = await request.json()
        assert self._session is not None
        params, fail = await self._prefill(stamps, body)
        if fail is not None:
            return fail
        decode = {**body, "stream": True}
        if params is not None:
            decode["kv_transfer_params"] = params
        return await self._decode(request, stamps, decode)

    async def _prefill(
        self, stamps: PhaseStamps, body: dict[str, Any]
    ) -> tuple[dict[str, Any] | None, web.Response | None]:
        """The producer's step: its returned ``kv_transfer_params``, or the proxy's error answer."""
        assert self._session is not None
        prefill = {k: v for k, v in body.items() if k not in ("stream_options", "min_tokens")}
        prefill |= {"max_tokens": 1, "stream": False}
        if self.prefill_kv_params is not None:
            prefill["kv_transfer_params"] = dict(self.prefill_kv_params)
        stamps.t_producer_send_ns = time.perf_counter_ns()
        try:
            async with self._session.post(
                f"{self.producer_url}/v1/completions",
                json=prefill,
                headers={"X-Request-Id": stamps.request_id},
                timeout=aiohttp.ClientTimeout(total=self.timeout_s, sock_connect=10),
            ) as resp:
                stamps.producer_status = resp.status
                text = await resp.text()
        except (aiohttp.ClientError, TimeoutError) as exc:
            return None, self._fail(stamps, "producer", f"{type(exc).__name__}: {exc}")
        stamps.t_producer_done_ns = time.perf_counter_ns()
        if resp.status != 200:
            return None, self._fail(stamps, "producer", f"HTTP {resp.status}: {text[:300]}")
        try:
            answer = json.loads(text)
        except ValueError:
            return None, self._fail(stamps, "producer", f"not JSON: {text[:200]!r}")
        stamps.producer_usage = answer.get("usage")
        params = answer.get("kv_transfer_params")
        if isinstance(params, dict):
            stamps.kv_transfer_params_keys = sorted(params)
            return params, None
        return None, None

    async def _decode(
        self, request: web.Request, stamps: PhaseStamps, body: dict[str, Any]
    ) -> web.StreamResponse:
        """The consumer's step, streamed through; the first content chunk is stamped."""
        assert self._session is not None
        stamps.t_consumer_send_ns = time.perf_counter_ns()
        out: web.StreamResponse | None = None
        try:
            async with self._session.post(
                f"{self.consumer_url}/v1/completions",
                json=body,
                headers={"X-Request-Id": stamps.request_id},
                timeout=aiohttp.ClientTimeout(total=None, sock_connect=10, sock_read=self.timeout_s),
            ) as resp:
                stamps.t_consumer_headers_ns = time.perf_counter_ns()
                stamps.consumer_status = resp.status
                if resp.status != 200:
                    text = await asyncio.wait_for(resp.text(), self.timeout_s)
                    return self._fail(stamps, "consumer", f"HTTP {resp.status}: {text[:300]}")
                out = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
                await out.prepare(request)
                pending = b""
                async for data in resp.content.iter_any():
                    t_ns = time.perf_counter_ns()
                    if stamps.t_consumer_first_token_ns is None:
                        *lines, pending = (pending + data).split(b"\n")
                        if any(_has_token(line) for line in lines):
                            stamps.t_consumer_first_token_ns = t_ns
                    await out.write(data)
                stamps.t_consumer_done_ns = time.perf_counter_ns()
        except (aiohttp.ClientError, TimeoutError) as exc:
            error = f"{type(exc).__name__}: {exc}"
            if out is None:
                return self._fail(stamps, "consumer", error)
            stamps.failed_phase, stamps.error = "consumer", error
            event = {"error": {"message": f"consumer failed mid-stream: {error}", "code": 502}}
            await out.write(f"data: {json.dumps(event)}\n\n".encode())
        await out.write_eof()
        return out


def _has_token(line: bytes) -> bool:
    """True for an SSE data line whose choices carry text (a generated token)."""
    try:
        event = parse_sse_line(line)
    except ValueError:
        return False
    if not isinstance(event, dict):
        return False
    return any("text" in c or "delta" in c for c in event.get("choices") or [])
