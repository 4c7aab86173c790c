"""``engine_session``: the suite's long-lived HTTP sessions drop an idle connection before an engine's API
server (uvicorn: 5 s) would close it under them, and pool a connection within that time."""

from __future__ import annotations

import asyncio

from aiohttp import web

from microbench.client.session import IDLE_KEEPALIVE_S, engine_session

SERVER_KEEPALIVE_S = 5.0  # vLLM's VLLM_HTTP_TIMEOUT_KEEP_ALIVE and SGLang's default


async def test_an_idle_connection_is_dropped_by_the_client_before_the_server_closes_it() -> None:
    ports: list[int] = []

    async def handle(request: web.Request) -> web.Response:
        ports.append(request.transport.get_extra_info("peername")[1])  # type: ignore[union-attr]
        return web.Response(text="ok")

    app = web.Application()
    app.router.add_post("/v1/completions", handle)
    runner = web.AppRunner(app, keepalive_timeout=SERVER_KEEPALIVE_S)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    url = f"http://127.0.0.1:{runner.addresses[0][1]}/v1/completions"
    try:
        async with engine_session() as session:
            for wait_s in (0.0, 0.2, IDLE_KEEPALIVE_S + 0.5):
                await asyncio.sleep(wait_s)
                async with session.post(url, json={}) as resp:
                    assert await resp.text() == "ok"
    finally:
        await runner.cleanup()
    assert IDLE_KEEPALIVE_S < SERVER_KEEPALIVE_S / 2  # a margin for a loaded box's late timers
    # pooled within the client's keep-alive; after it (still inside the server's) a new connection, where
    # aiohttp's default (15 s) would have sent it on the old one, and past 5 s into the server's close
    assert ports[0] == ports[1] and ports[2] != ports[1], ports
