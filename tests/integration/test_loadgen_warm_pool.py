"""``SessionSettings.warm_connections``: the connections opened before a stage are the ones it sends on."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient

from engine_harness.sim.openai_wire import DONE_EVENT, StreamEncoder
from microbench.client.requests import RequestSpec
from microbench.loadgen.session import LoadSession
from microbench.loadgen.stages import SessionSettings, Stage
from microbench.workloads.schedulers import parse_scheduler

pytestmark = pytest.mark.integration


def _app(seen: dict[str, list[int]]) -> web.Application:
    """A server that notes which connection (its transport) carried each GET and each POST."""
    encoder = StreamEncoder("completion", "cmpl-1", 0, "m", 8, True, True, "fp")
    body = encoder.token_event("a", 1, None) + encoder.token_event("b", 2, "length")
    body += encoder.usage_event(2) + DONE_EVENT

    async def models(request: web.Request) -> web.Response:
        seen["get"].append(id(request.transport))
        return web.json_response({"object": "list", "data": [{"id": "m", "object": "model"}]})

    async def complete(request: web.Request) -> web.Response:
        await request.read()
        seen["post"].append(id(request.transport))
        return web.Response(body=body, content_type="text/event-stream")

    app = web.Application()
    app.router.add_get("/v1/models", models)
    app.router.add_post("/v1/completions", complete)
    return app


@pytest.mark.parametrize("warm", [0, 12])
async def test_a_stage_sends_on_the_connections_opened_before_it(
    aiohttp_client_factory: Callable[[web.Application], Awaitable[TestClient]], warm: int
) -> None:
    seen: dict[str, list[int]] = {"get": [], "post": []}
    client = await aiohttp_client_factory(_app(seen))
    url = str(client.make_url("")).rstrip("/")
    settings = SessionSettings.model_validate(
        {"base_url": url, "api": {"model": "m"}, "warm_connections": warm}
    )
    specs: Any = [RequestSpec(list(range(8)), 8, 2) for _ in range(24)]
    stage = Stage.scheduled(
        "c", parse_scheduler({"kind": "concurrency", "concurrency": 8}), specs, max_requests=24
    )
    async with LoadSession(settings) as session:
        result = await session.run([stage])
    assert [r.status for r in result.records] == ["ok"] * 24
    probes, warmed = seen["get"][:5], set(seen["get"][5:])  # the round-trip probes: one connection, in turn
    assert len(warmed) == warm
    if warm:
        assert set(seen["post"]) <= warmed | set(probes)  # no connection opened for the stage
    else:
        assert (
            len(set(seen["post"]) - set(probes)) >= 7
        )  # 8 at once: the pool's one idle connection, then new


async def test_a_server_that_never_answers_does_not_hold_the_stage_at_its_warm_up() -> None:
    """A frozen engine accepts connections and answers nothing: the warm-up gives up after its 2 s and
    the stage's request is recorded as cancelled at the drain timeout, not waited on for ever."""
    held: list[asyncio.StreamWriter] = []

    async def accept(_: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        held.append(writer)  # read nothing, answer nothing

    server = await asyncio.start_server(accept, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    settings = SessionSettings.model_validate(
        {"base_url": f"http://127.0.0.1:{port}", "api": {"model": "m"}, "warm_connections": 4,
         "drain_timeout_s": 0.5}
    )  # fmt: skip
    specs: Any = [RequestSpec(list(range(8)), 8, 2)]
    stage = Stage.scheduled(
        "c", parse_scheduler({"kind": "concurrency", "concurrency": 1}), specs, max_requests=1
    )
    t0 = time.perf_counter()
    try:
        async with LoadSession(settings) as session:
            result = await asyncio.wait_for(session.run([stage]), 30)
    finally:
        for writer in held:
            writer.close()
        server.close()
    assert [r.status for r in result.records] == ["cancelled"]
    assert time.perf_counter() - t0 < 15  # round-trip probe 2 s, warm-up 2 s, drain 0.5 s
