"""The load generator's round-trip probe asks an endpoint the API server answers alone."""

from __future__ import annotations

import asyncio

from aiohttp import web
from aiohttp.test_utils import TestServer

from microbench.loadgen.session import LoadSession
from microbench.loadgen.stages import SessionSettings


async def _probe() -> list[float]:
    async def health(_: web.Request) -> web.Response:
        await asyncio.sleep(0.5)  # SGLang's /health: a one-token generation, polled once a second
        return web.Response()

    async def models(_: web.Request) -> web.Response:
        return web.json_response({"data": [{"id": "m"}]})

    app = web.Application()
    app.router.add_get("/health", health)
    app.router.add_get("/v1/models", models)
    async with TestServer(app) as server:
        url = str(server.make_url("")).rstrip("/")
        settings = SessionSettings.model_validate({"base_url": url, "api": {"model": "m"}})
        async with LoadSession(settings) as session:
            return await session._round_trips(3)


def test_round_trips_do_not_wait_for_an_engine_health_check() -> None:
    times = asyncio.run(_probe())
    assert len(times) == 3 and max(times) < 400  # a 0.5 s /health would be in every one
