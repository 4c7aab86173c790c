"""The proxy in-process between a simulated producer and a consumer that stalls or is gone: it answers
with an error naming the failed phase within its timeout, and forwards kv_transfer_params unchanged."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from engine_harness.launch import free_port
from engine_harness.sim.server import SimServer
from microbench.client.streams import HTTPStatusError, StreamRecord, stream_request
from microbench.measure.pd_proxy import PDProxy

pytestmark = pytest.mark.integration


async def _serve(app: web.Application) -> tuple[web.AppRunner, str]:
    runner = web.AppRunner(app, handler_cancellation=True, shutdown_timeout=0.5)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    return runner, f"http://127.0.0.1:{runner.addresses[0][1]}"


@pytest.fixture
async def producer() -> AsyncIterator[SimServer]:
    async with SimServer(max_num_batched_tokens=512) as sim:
        yield sim


def _body(sim: SimServer) -> dict[str, Any]:
    return {"model": sim.config.model, "prompt": list(range(10, 200)), "max_tokens": 3}


async def test_a_stalled_consumer_gets_a_502_after_the_proxy_timeout(producer: SimServer) -> None:
    seen: list[dict[str, Any]] = []
    ids: list[str | None] = []

    async def stall(request: web.Request) -> web.Response:
        seen.append(await request.json())
        ids.append(request.headers.get("X-Request-Id"))
        await asyncio.sleep(3600)
        return web.Response()

    app = web.Application()
    app.router.add_post("/v1/completions", stall)
    runner, url = await _serve(app)
    params = {"do_remote_decode": True, "remote_block_ids": None}
    try:
        async with PDProxy(producer.base_url, url, params, timeout_s=1.0) as proxy:
            async with aiohttp.ClientSession() as session:
                t0 = time.perf_counter()
                with pytest.raises(HTTPStatusError) as err:
                    await stream_request(
                        session, f"{proxy.base_url}/v1/completions", _body(producer), StreamRecord(),
                        headers={"X-Request-Id": "r1"},
                    )  # fmt: skip
                # after the proxy's 1 s, not the consumer's hour: a bound far from both (this pass runs at
                # nice 19 beside a real engine, where it once took 5.4 s)
                assert time.perf_counter() - t0 < 60
            stamps = proxy.stamps["r1"]
    finally:
        await runner.cleanup()
    assert err.value.status == 502 and "consumer failed" in err.value.body
    assert stamps.failed_phase == "consumer" and stamps.t_producer_done_ns is not None
    assert stamps.t_consumer_first_token_ns is None
    # the consumer got the original request, streaming, with max_tokens intact
    assert seen and seen[0]["stream"] is True and seen[0]["max_tokens"] == 3
    # the engines see the client's request id (NIXL push pairs producer and consumer requests by it)
    assert ids == ["r1"]


async def test_a_consumer_that_is_gone_fails_fast_and_the_producer_got_max_tokens_1(
    producer: SimServer,
) -> None:
    gone = f"http://127.0.0.1:{free_port()}"
    async with PDProxy(producer.base_url, gone, None, timeout_s=30.0) as proxy:
        async with aiohttp.ClientSession() as session:
            t0 = time.perf_counter()
            with pytest.raises(HTTPStatusError):
                await stream_request(
                    session,
                    f"{proxy.base_url}/v1/completions",
                    _body(producer),
                    headers={"X-Request-Id": "r2"},
                )
            assert time.perf_counter() - t0 < 5
        stamps = proxy.stamps["r2"]
    assert stamps.failed_phase == "consumer" and stamps.producer_status == 200
    assert stamps.producer_usage is not None and stamps.producer_usage["completion_tokens"] == 1


async def test_the_proxy_takes_a_burst_of_new_connections_as_the_engines_do(
    producer: SimServer, handshakes_waited: Callable[[int, int], int]
) -> None:
    """It listens with the engines' backlog (2048): 300 connections made while its loop is blocked all wait
    in its accept queue, none for a retransmit of a dropped handshake."""
    async with PDProxy(producer.base_url, producer.base_url, None) as proxy:
        assert proxy.port is not None and handshakes_waited(proxy.port, 300) == 0
