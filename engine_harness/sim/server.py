"""HTTP surface of the simulated engine (aiohttp): vLLM's OpenAI routes, /metrics, faults, ground truth.

In-process use (tests, benchmarks)::

    async with SimServer(SimConfig(max_num_batched_tokens=512, time_scale=0)) as sim:
        ... sim.base_url ... sim.step_log ...

Routes: ``POST /v1/completions``, ``POST /v1/chat/completions`` (streaming SSE and plain JSON),
``GET /v1/models``, ``GET /health`` (503 during the slow-start fault), ``GET /version``, ``GET /metrics``,
``POST /reset_prefix_cache``, and the sim's own ``GET /sim/steps?since=N`` (the step log as JSON) and
``GET /sim/config`` (the settings, i.e. the true step-time parameters). A client that closes its
connection aborts its request (the handler is cancelled and the request's KV blocks are freed).
"""

from __future__ import annotations

import asyncio
import hmac
import os
import time
from types import TracebackType
from typing import Any

from aiohttp import web

from engine_harness.engines import API_LISTEN_BACKLOG, SIM_API_KEY_VAR
from engine_harness.sim.engine import EngineDead, RequestStream, SimEngine
from engine_harness.sim.faults import VLLM_DEATH_GRACE_S, VLLM_DEATH_MESSAGE, FaultInjector, vllm_death_events
from engine_harness.sim.kv_transfer import LinkMetrics, consumer_transfer, producer_params
from engine_harness.sim.openai_wire import (
    DONE_EVENT,
    CompletionParams,
    Kind,
    RequestError,
    StreamEncoder,
    completion_body,
    error_body,
    loads,
    new_request_id,
    parse_request,
    usage_dict,
)
from engine_harness.sim.params import SimConfig, merge_settings
from engine_harness.sim.step_record import StepRecord
from engine_harness.sim.tokenizer import decode_token
from engine_harness.sim.vllm_metrics import CONTENT_TYPE

__all__ = ["SIM_VERSION", "SimServer"]

SIM_VERSION = "sim-0.1.0"
# a /metrics render and its reply on the sim's loop: 1.9 + about 1 ms on the box of 2026-11-30, with room
_RENDER_NS = 5_000_000
_SSE_HEADERS = {"Content-Type": "text/event-stream; charset=utf-8", "Cache-Control": "no-cache"}


def _error(message: str, status: int, error_type: str, headers: dict[str, str] | None = None) -> web.Response:
    return web.json_response(error_body(message, status, error_type), status=status, headers=headers)


def _drop_connection(request: web.Request) -> None:
    """Close the client's connection: what it has received stays, nothing more comes (no [DONE])."""
    if request.transport is not None:
        request.transport.close()


class SimServer:
    """One simulated engine with its HTTP server, on ``config.host``/``config.port`` (0: a free port)."""

    def __init__(self, config: SimConfig | None = None, **overrides: Any) -> None:
        config = config or SimConfig()
        if overrides:
            config = SimConfig.model_validate(merge_settings(config.model_dump(), overrides))
        self.config = config
        self.engine = SimEngine(config)
        self.engine.on_die = self._on_die
        self.faults = FaultInjector(config.faults, config.seed)
        self.link_metrics = (
            LinkMetrics(self.engine.metrics.registry, config.model)
            if config.kv_transfer is not None
            else None
        )
        self.port: int | None = None
        self.died = asyncio.Event()
        self._runner: web.AppRunner | None = None
        self._site: web.TCPSite | None = None
        self._ready_ns = 0
        self._die_timer: asyncio.TimerHandle | None = None
        self.app = self._build_app()

    # -- life cycle -------------------------------------------------------------------------------

    async def __aenter__(self) -> SimServer:
        await self.start()
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.stop()

    async def start(self) -> None:
        if (problem := self.config.memory_problem()) is not None:  # a subprocess sim exits 1 with it
            raise RuntimeError(f"engine start-up failed: {problem}")
        await self.engine.start()
        self._runner = web.AppRunner(
            self.app, handler_cancellation=True, access_log=None, shutdown_timeout=2.0
        )
        await self._runner.setup()
        self._site = web.TCPSite(
            self._runner,
            self.config.host,
            self.config.port,
            reuse_port=self.config.reuse_port or None,
            backlog=API_LISTEN_BACKLOG,
        )
        await self._site.start()
        self.port = int(self._runner.addresses[0][1])
        self._ready_ns = time.perf_counter_ns() + int(self.config.faults.slow_start_s * 1e9)
        if self.config.faults.die_at_s is not None:
            self._die_timer = asyncio.get_running_loop().call_later(
                self.config.faults.die_at_s, self.engine.kill, f"die_at_s={self.config.faults.die_at_s}"
            )

    async def stop(self) -> None:
        if self._die_timer is not None:
            self._die_timer.cancel()
        await self.engine.stop()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    def _on_die(self, reason: str) -> None:
        if self.config.faults.death == "vllm":  # its API server outlives the engine core for a moment
            asyncio.get_running_loop().call_later(VLLM_DEATH_GRACE_S, self._close)
        else:
            self._close()

    def _close(self) -> None:
        self.died.set()
        if self._site is not None:  # stop listening; connections in flight are dropped by their handlers
            site, self._site = self._site, None
            asyncio.get_running_loop().create_task(site.stop())

    @property
    def base_url(self) -> str:
        if self.port is None:
            raise RuntimeError("the sim server is not running")
        return f"http://{self.config.host}:{self.port}"

    @property
    def step_log(self) -> list[StepRecord]:
        """Every step so far (the ground truth), oldest first."""
        return list(self.engine.step_log)

    @property
    def ready(self) -> bool:
        return time.perf_counter_ns() >= self._ready_ns

    def metrics_text(self) -> str:
        return self.engine.metrics.render().decode()

    # -- routes -----------------------------------------------------------------------------------

    def _build_app(self) -> web.Application:
        middlewares = [_bearer_guard(key)] if (key := os.environ.get(SIM_API_KEY_VAR)) else []
        app = web.Application(client_max_size=64 * 1024 * 1024, middlewares=middlewares)
        app.router.add_post("/v1/completions", self._completions)
        app.router.add_post("/v1/chat/completions", self._chat_completions)
        app.router.add_get("/v1/models", self._models)
        app.router.add_get("/health", self._health)
        app.router.add_get("/version", self._version)
        app.router.add_get("/metrics", self._metrics)
        app.router.add_post("/reset_prefix_cache", self._reset_prefix_cache)
        app.router.add_get("/sim/steps", self._steps)
        app.router.add_get("/sim/config", self._config)
        return app

    async def _health(self, request: web.Request) -> web.Response:
        if self.engine.dead is not None and self.config.faults.death == "vllm":
            return _error(VLLM_DEATH_MESSAGE, 500, "EngineDeadError")
        if self.engine.dead is not None:
            _drop_connection(request)
        return web.Response(status=200 if self.ready else 503)

    async def _version(self, request: web.Request) -> web.Response:
        return web.json_response({"version": SIM_VERSION})

    async def _models(self, request: web.Request) -> web.Response:
        model = self.config.model
        card = {
            "id": model,
            "object": "model",
            "created": int(time.time()),
            "owned_by": "vllm",
            "root": model,
            "parent": None,
            "max_model_len": self.config.context_limit,
            "permission": [],
        }
        return web.json_response({"object": "list", "data": [card]})

    async def _metrics(self, request: web.Request) -> web.Response:
        await self.engine.clock.clear_of(_RENDER_NS)  # not in a step's last ms: it would end late
        return web.Response(body=self.engine.metrics.render(), headers={"Content-Type": CONTENT_TYPE})

    async def _reset_prefix_cache(self, request: web.Request) -> web.Response:
        self.engine.scheduler.pool.reset_cache()
        return web.Response(status=200)

    async def _steps(self, request: web.Request) -> web.Response:
        try:
            since = int(request.query.get("since", "0"))
        except ValueError:
            return _error("'since' must be an integer step index", 400, "BadRequestError")
        steps = self.engine.steps_since(since)
        body = {"steps": [s.to_dict() for s in steps], "next": self.engine.num_steps}
        return web.json_response(body | {"cuda_graph_max_tokens": self.config.step.cuda_graph_max_tokens})

    async def _config(self, request: web.Request) -> web.Response:
        return web.json_response(self.config.model_dump(mode="json"))

    async def _completions(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, "completion")

    async def _chat_completions(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, "chat")

    async def _generate(self, request: web.Request, kind: Kind) -> web.StreamResponse:
        t_in = time.perf_counter_ns()  # the modelled front-end time counts from here (see below)
        if self.engine.dead is not None and self.config.faults.death == "vllm":
            return _error(VLLM_DEATH_MESSAGE, 500, "EngineDeadError")
        if self.engine.dead is not None:
            _drop_connection(request)
            return web.Response(status=503)
        if not self.ready:
            return _error("the engine is starting (sim slow_start fault)", 503, "ServiceUnavailableError")
        try:
            body = await request.json(loads=loads)
        except ValueError:
            return _error("request body is not valid JSON", 400, "BadRequestError")
        try:
            params = parse_request(kind, body, self.config.model, self.config.context_limit)
        except RequestError as exc:
            return _error(str(exc), exc.status, exc.error_type)
        fault = self.faults.http_error()
        self.faults.log_request(params.prompt_token_ids, fault[0] if fault else None)
        if fault is not None:
            return _error(fault[2], fault[0], fault[1], self.faults.retry_after(fault[0]))
        rid = new_request_id(kind)
        if self.config.frontend_ns_per_token:  # the API server's per-token work before the engine sees it
            # as precisely as a step's end (a loop timer alone ends up to 1 ms late: which step the request
            # joins would turn on the timer's rounding, not on the modelled time). It counts from the
            # handler's start: the sim's own reading and parsing of the body is that work too, and on a
            # slow host it added 12-18% per token to the 20 µs modelled (fits of 22.4-23.5 µs, 2026-11-29);
            # only a body whose parse outlasts the modelled time makes the request later than modelled
            deadline = t_in + int(self.config.frontend_ns_per_token * len(params.prompt_token_ids))
            await SimEngine.wait_until(deadline, int(self.config.busy_wait_ms * 1e6))
        external = await self._load_remote_kv(body, len(params.prompt_token_ids))
        stream = self.engine.submit(
            params.prompt_token_ids,
            params.max_tokens,
            params.min_tokens,
            params.ignore_eos,
            request_id=rid,
            external_tokens=external,
        )
        kv_params = producer_params(body, len(params.prompt_token_ids)) if self.link_metrics else None
        try:
            if params.stream:
                return await self._write_stream(request, params, stream, rid)
            return await self._respond(params, stream, rid, kv_params)
        except EngineDead:
            _drop_connection(request)
            return web.Response(status=500)
        finally:
            if not stream.finished:
                self.engine.abort(stream)

    async def _load_remote_kv(self, body: dict[str, Any], prompt_tokens: int) -> int:
        """The simulated KV pull of a consumer request (tokens loaded; 0: none asked or no link)."""
        link = self.config.kv_transfer
        if link is None or self.link_metrics is None or not consumer_transfer(body):
            return 0
        seconds = link.transfer_s(prompt_tokens) * self.config.time_scale
        await SimEngine.wait_until(time.perf_counter_ns() + int(seconds * 1e9), 0)  # a timer, never early
        # the modelled time, as the step log keeps model durations: a loaded host's late wake-up is the
        # host's, not the link's (the consumer leg the client sees still includes it)
        self.link_metrics.observe(seconds, prompt_tokens * link.bytes_per_token, prompt_tokens - 1)
        return prompt_tokens - 1

    def _cached(self, stream: RequestStream) -> int | None:
        if not self.config.enable_prompt_tokens_details:
            return None
        return stream.request.num_cached_tokens or 0

    async def _respond(
        self,
        params: CompletionParams,
        stream: RequestStream,
        rid: str,
        kv_params: dict[str, Any] | None = None,
    ) -> web.Response:
        tokens: list[int] = []
        while chunk := await stream.next():
            tokens.extend(chunk)
        text = "".join(decode_token(t) for t in tokens)
        usage = usage_dict(len(params.prompt_token_ids), len(tokens), self._cached(stream))
        if not self.config.enable_prompt_tokens_details:
            usage["prompt_tokens_details"] = None
        body = completion_body(
            params.kind, rid, int(time.time()), params.model, text, stream.finish_reason, usage
        )
        if kv_params is not None:
            body["kv_transfer_params"] = kv_params
        return web.json_response(body)

    async def _write_stream(
        self, request: web.Request, params: CompletionParams, stream: RequestStream, rid: str
    ) -> web.StreamResponse:
        resp = web.StreamResponse(headers=_SSE_HEADERS)
        await resp.prepare(request)
        try:
            await self._write_events(request, resp, params, stream, rid)
        except EngineDead:
            if self.config.faults.death == "vllm":
                await resp.write(vllm_death_events())
                return resp
            _drop_connection(request)  # like a crash: the stream just ends
        except ConnectionResetError:
            pass  # the client went away while we wrote; the caller aborts the request
        return resp

    async def _write_events(
        self,
        request: web.Request,
        resp: web.StreamResponse,
        params: CompletionParams,
        stream: RequestStream,
        rid: str,
    ) -> None:
        enc = StreamEncoder(
            params.kind,
            rid,
            int(time.time()),
            params.model,
            len(params.prompt_token_ids),
            params.include_usage,
            params.continuous_usage,
            SIM_VERSION,
        )
        cut = self.faults.cut_after()
        if params.kind == "chat":
            await resp.write(enc.role_event(self._cached(stream)))
        n, events = 0, b""
        while True:
            if cut is not None and n >= cut:
                self.faults.cut_streams += 1
                self.engine.abort(stream)
                _drop_connection(request)
                return
            tokens = await stream.next()
            if not tokens:
                break
            cached = self._cached(stream)
            last = len(tokens) - 1 if stream.finished else -1
            if cut is not None:
                tokens = tokens[: cut - n]
            parts = []
            for i, tok in enumerate(tokens):
                n += 1
                reason = stream.finish_reason if i == last else None
                parts.append(enc.token_event(decode_token(tok), n, reason, cached))
            events = b"".join(parts)
            if stream.finished and (cut is None or n < cut):
                break  # the last tokens leave with the usage event and [DONE], in one write
            await resp.write(events)
            events = b""
        if params.include_usage:
            events += enc.usage_event(n, self._cached(stream))
        await resp.write_eof(events + DONE_EVENT)


def _bearer_guard(key: str) -> Any:
    """vLLM's rule: every ``/v1/`` route needs ``Authorization: Bearer <key>``; health and metrics do not."""
    expected = f"Bearer {key}".encode()

    @web.middleware
    async def guard(request: web.Request, handler: Any) -> web.StreamResponse:
        given = request.headers.get("Authorization", "").encode()
        if request.path.startswith("/v1/") and not hmac.compare_digest(given, expected):
            return web.json_response({"error": "Unauthorized"}, status=401)
        return await handler(request)

    return guard
