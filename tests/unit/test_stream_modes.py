"""The three ways the SSE client parses (live with ``on_chunk``, at body end, lazily when first read) give
the same record for the same bytes: split lines, multi-token events, a usage-only last chunk, a 1 MiB
line, an error event and a stream that lacks ``[DONE]``."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable

import aiohttp
import pytest
from aiohttp import web

from engine_harness.launch import free_port
from microbench.client.streams import ServerStreamError, StreamCut, StreamRecord, stream_request

GAP_S = 0.03


def _event(text: str, running: int | None, finish: str | None = None) -> bytes:
    chunk: dict = {"choices": [{"index": 0, "text": text, "finish_reason": finish}]}
    if running is not None:
        chunk["usage"] = {"prompt_tokens": 4, "completion_tokens": running}
    return b"data: " + json.dumps(chunk).encode() + b"\n\n"


USAGE_ONLY = b'data: {"choices":[],"usage":{"prompt_tokens":4,"completion_tokens":6,"total_tokens":10}}\n\n'
LONG_TEXT = "x" * (1 << 20)
SCRIPTS: dict[str, list[bytes]] = {
    # one token, then an event cut in its JSON, then a 3-token event, then a usage-only chunk
    "split": [
        _event("a", 1),
        _event("bcd", 4)[:25],
        _event("bcd", 4)[25:] + _event("ef", 6, "length"),
        USAGE_ONLY + b"data: [DONE]\n\n",
    ],
    # no running usage: one token per content chunk; the usage comes once, in its own chunk at the end
    "end_usage": [
        _event("a", None),
        _event("b", None),
        _event("", None, "length") + USAGE_ONLY,
        b"data: [DONE]\n\n",
    ],
    # a 1 MiB line written in 64 KiB pieces
    "long_line": [
        *(lambda e: [e[i : i + 65536] for i in range(0, len(e), 65536)])(_event(LONG_TEXT, 1)),
        _event("z", 2, "length") + b"data: [DONE]\n\n",
    ],
    "error": [_event("a", 1), b'data: {"error":{"message":"boom","code":500}}\n\n', b"data: [DONE]\n\n"],
    "no_done": [_event("a", 1), _event("b", 2)],
}


async def _serve(request: web.Request) -> web.StreamResponse:
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
    for piece in SCRIPTS[request.match_info["name"]]:
        await resp.write(piece)
        await asyncio.sleep(GAP_S)
    return resp


@pytest.fixture
async def server() -> AsyncIterator[str]:
    app = web.Application()
    app.router.add_post("/{name}", _serve)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    yield f"http://127.0.0.1:{port}"
    await runner.cleanup()


async def _run(url: str, mode: str) -> tuple[StreamRecord, list[int]]:
    seen: list[int] = []
    on_chunk: Callable[[StreamRecord], None] | None = None
    if mode == "live":
        on_chunk = lambda r: seen.append(r.chunk_tokens[-1])  # noqa: E731
    rec = StreamRecord()
    async with aiohttp.ClientSession() as http:
        await stream_request(http, url, {"prompt": [1]}, rec, on_chunk=on_chunk, lazy=mode == "lazy")
    return rec, seen


MODES = ("live", "end", "lazy")


@pytest.mark.parametrize("mode", MODES)
async def test_split_reads_multi_token_events_and_a_usage_only_chunk(server: str, mode: str) -> None:
    rec, seen = await _run(server + "/split", mode)
    assert rec.chunk_tokens == [1, 3, 2] and rec.completion_tokens == 6 and rec.tokens_from_usage
    assert rec.text == ["a", "bcd", "ef"] and rec.finish_reason == "length"
    assert rec.usage == {"prompt_tokens": 4, "completion_tokens": 6, "total_tokens": 10}
    first, second, third = rec.chunk_t_ns
    # the cut event completes with the read that carries its second half, the same read as the third
    assert (second - first) / 1e9 > 1.5 * GAP_S and second == third
    assert rec.t_done_ns is not None and rec.t_done_ns > third and rec.failure is None
    assert seen == ([1, 3, 2] if mode == "live" else [])


@pytest.mark.parametrize("mode", MODES)
async def test_without_running_usage_each_content_chunk_is_one_token(server: str, mode: str) -> None:
    rec, _ = await _run(server + "/end_usage", mode)
    assert rec.chunk_tokens == [1, 1, 1] and not rec.tokens_from_usage and rec.usage["completion_tokens"] == 6


@pytest.mark.parametrize("mode", MODES)
async def test_a_1_mib_line_is_one_chunk(server: str, mode: str) -> None:
    rec, _ = await _run(server + "/long_line", mode)
    assert rec.chunk_tokens == [1, 1] and rec.text[0] == LONG_TEXT and rec.text[1] == "z"


@pytest.mark.parametrize("mode", ("live", "end"))
async def test_an_error_event_raises_with_what_arrived(server: str, mode: str) -> None:
    with pytest.raises(ServerStreamError, match="boom") as info:
        await _run(server + "/error", mode)
    assert info.value.record.chunk_tokens == [1]


async def test_a_lazy_stream_s_error_event_is_its_failure(server: str) -> None:
    rec, _ = await _run(server + "/error", "lazy")
    assert isinstance(rec.failure, ServerStreamError) and "boom" in (rec.error or "")
    assert rec.chunk_tokens == [1] and rec.t_done_ns is None


@pytest.mark.parametrize("mode", ("live", "end"))
async def test_a_stream_without_done_is_cut(server: str, mode: str) -> None:
    with pytest.raises(StreamCut, match="without \\[DONE\\] after 2 chunks"):
        await _run(server + "/no_done", mode)


async def test_a_lazy_stream_without_done_has_a_cut_as_its_failure(server: str) -> None:
    rec, _ = await _run(server + "/no_done", "lazy")
    assert isinstance(rec.failure, StreamCut) and "without [DONE] after 2 chunks" in (rec.error or "")
    assert rec.chunk_tokens == [1, 1]


def test_a_record_built_by_hand_keeps_its_fields() -> None:
    rec = StreamRecord(t_send_ns=5, chunk_t_ns=[7, 9], chunk_tokens=[1, 2], t_done_ns=9)
    rec.add_chunk(11, 3)
    assert rec.completion_tokens == 6 and rec.first_token_ns == 7 and rec.failure is None


async def test_the_send_stamp_precedes_opening_the_connection(server: str) -> None:
    opened: list[int] = []

    async def on_create(*_: object) -> None:
        opened.append(time.perf_counter_ns())

    trace = aiohttp.TraceConfig()
    trace.on_connection_create_start.append(on_create)
    rec = StreamRecord()
    async with aiohttp.ClientSession(trace_configs=[trace]) as http:
        await stream_request(http, server + "/split", {"prompt": [1]}, rec)
    assert len(opened) == 1 and 0 < rec.t_send_ns < opened[0] < rec.t_headers_ns < rec.chunk_t_ns[0]
