"""The SSE client on reads as a real server delivers them: a line split across two reads, and one event
carrying two tokens (vLLM's API server bundles tokens of a slow client; usage counts them)."""

from __future__ import annotations

import asyncio
import time

import aiohttp
from aiohttp import web

from engine_harness.launch import free_port
from microbench.client.streams import stream_request

EVENT_1 = b'data: {"choices":[{"index":0,"text":"a"}],"usage":{"prompt_tokens":3,"completion_tokens":1}}\n\n'
EVENT_2 = b'data: {"choices":[{"index":0,"text":"bc"}],"usage":{"prompt_tokens":3,"completion_tokens":3}}\n\n'
GAP_S = 0.08


async def _handler(request: web.Request) -> web.StreamResponse:
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
    await resp.write(EVENT_1)
    await asyncio.sleep(GAP_S)
    await resp.write(EVENT_2[:40])  # the second event's line is cut in the middle of its JSON
    await asyncio.sleep(GAP_S)
    await resp.write(EVENT_2[40:] + b"data: [DONE]\n\n")
    return resp


async def test_a_split_line_is_stamped_when_it_completes_and_a_multi_token_event_counts_twice() -> None:
    app = web.Application()
    app.router.add_post("/v1/completions", _handler)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        async with aiohttp.ClientSession() as session:
            t0 = time.perf_counter_ns()
            rec = await stream_request(
                session, f"http://127.0.0.1:{port}/v1/completions", {"prompt": [1, 2, 3]}
            )
    finally:
        await runner.cleanup()
    assert rec.chunk_tokens == [1, 2] and rec.completion_tokens == 3 and rec.tokens_from_usage
    first, second = rec.chunk_t_ns
    # the second event is complete only after the second half arrived: ≈ 2 gaps after the first event
    assert (second - first) / 1e9 > 1.5 * GAP_S
    assert first > t0 and rec.t_done_ns is not None and rec.t_done_ns >= second
