"""The SSE client on real vLLM transcripts and on a server that breaks mid-stream."""

from pathlib import Path

import pytest
from aiohttp import web

from microbench.client.sse import DONE, StreamChunk, chunk_text, parse_chunk, parse_sse_line
from microbench.client.streams import HTTPStatusError, StreamCut, stream_request

FIXTURES = Path(__file__).parent.parent / "fixtures"


def test_parse_sse_lines() -> None:
    assert parse_sse_line(b"data: [DONE]\n") is DONE
    assert parse_sse_line(b": keep-alive\n") is None
    assert parse_sse_line(b"\n") is None
    assert parse_sse_line(b'data: {"a": 1}\n') == {"a": 1}
    with pytest.raises(ValueError):
        parse_sse_line(b"data: [1, 2]\n")


def test_parse_chunk_reads_only_the_fields_the_client_needs() -> None:
    line = (
        b'data: {"id":"cmpl-1","object":"text_completion","choices":[{"index":0,"text":"a",'
        b'"logprobs":null,"finish_reason":null}],"usage":{"prompt_tokens":5,"completion_tokens":3}}'
    )
    chunk = parse_chunk(line)
    assert isinstance(chunk, StreamChunk)
    assert chunk.choices is not None and chunk.choices[0].text == "a"
    assert chunk.usage == {"prompt_tokens": 5, "completion_tokens": 3}
    role = parse_chunk(b'data: {"choices":[{"delta":{"role":"assistant","content":""}}]}')
    assert isinstance(role, StreamChunk) and role.choices is not None
    assert chunk_text(role.choices[0]) is None  # the role announcement carries no token
    empty = parse_chunk(b'data: {"choices":[{"delta":{"content":""}}]}')
    assert isinstance(empty, StreamChunk) and empty.choices is not None
    assert chunk_text(empty.choices[0]) == ""  # a real token that decodes to no text
    assert parse_chunk(b"data: [DONE]") is DONE and parse_chunk(b": ping") is None
    for bad in (b"data: [1, 2]", b'data: {"usage": "many"}', b"data: {not json"):
        with pytest.raises(ValueError, match="not a completion chunk"):
            parse_chunk(bad)


def _app(body: bytes, status: int = 200, cut: bool = False) -> web.Application:
    async def handler(request: web.Request) -> web.StreamResponse:
        if status != 200:
            return web.json_response({"error": {"message": "slow down", "code": status}}, status=status)
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        data = body[: len(body) // 2] if cut else body
        for line in data.split(b"\n\n"):
            if line:
                await resp.write(line + b"\n\n")
        if cut:
            request.transport.close()  # type: ignore[union-attr]
            return resp
        await resp.write_eof()
        return resp

    app = web.Application()
    app.router.add_post("/v1/completions", handler)
    return app


async def test_vllm_completion_transcript_counts_tokens_from_usage(aiohttp_client_factory) -> None:
    body = (FIXTURES / "vllm_cpu_completions_stream.txt").read_bytes()
    client = await aiohttp_client_factory(_app(body))
    rec = await stream_request(client.session, str(client.make_url("/v1/completions")), {"model": "m"})
    assert rec.completion_tokens == 6 and rec.tokens_from_usage
    assert rec.prompt_tokens == 17
    assert len(rec.chunk_t_ns) == 6 and rec.finish_reason == "length"
    assert rec.t_done_ns is not None and rec.t_done_ns >= rec.chunk_t_ns[-1]


async def test_vllm_chat_transcript_counts_empty_text_chunks_as_tokens(aiohttp_client_factory) -> None:
    body = (FIXTURES / "vllm_cpu_chat_stream.txt").read_bytes()
    client = await aiohttp_client_factory(_app(body))
    rec = await stream_request(client.session, str(client.make_url("/v1/completions")), {"model": "m"})
    # role chunk (no token) + 4 content chunks (two with empty text: tokens that decode to nothing)
    assert rec.usage == {"prompt_tokens": 24, "total_tokens": 28, "completion_tokens": 4}
    assert rec.completion_tokens == 4 and not rec.tokens_from_usage  # no running usage in chat chunks
    assert rec.finish_reason == "length"


async def test_cut_stream_raises_with_what_arrived(aiohttp_client_factory) -> None:
    body = (FIXTURES / "vllm_cpu_completions_stream.txt").read_bytes()
    client = await aiohttp_client_factory(_app(body, cut=True))
    with pytest.raises(StreamCut) as err:
        await stream_request(client.session, str(client.make_url("/v1/completions")), {"model": "m"})
    rec = err.value.record
    assert 1 <= len(rec.chunk_t_ns) < 6 and rec.error


async def test_http_error_is_typed_with_status_and_body(aiohttp_client_factory) -> None:
    client = await aiohttp_client_factory(_app(b"", status=429))
    with pytest.raises(HTTPStatusError) as err:
        await stream_request(client.session, str(client.make_url("/v1/completions")), {"model": "m"})
    assert err.value.status == 429 and "slow down" in err.value.body
    assert err.value.record.chunk_t_ns == []


async def test_connection_refused_is_a_clear_error() -> None:
    import aiohttp

    from engine_harness.launch import free_port

    async with aiohttp.ClientSession() as session:
        with pytest.raises(StreamCut, match="before any response"):
            await stream_request(session, f"http://127.0.0.1:{free_port()}/v1/completions", {"model": "m"})
