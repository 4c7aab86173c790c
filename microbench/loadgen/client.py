"""Send one ``RequestSpec`` to an OpenAI-compatible engine and fill a ``StreamRecord``.

Streaming requests go through the suite's SSE client (``microbench.client.streams.stream_request``). A
non-streaming request is one POST whose JSON answer is stamped as a single chunk carrying all completion
tokens, so both kinds land in the same record and raise the same typed errors. ``classify`` names the
outcome of a request for its trace row.
"""

from __future__ import annotations

import time
from collections.abc import Mapping

import aiohttp

from microbench.client.requests import ApiSettings, RequestSpec, build_payload
from microbench.client.streams import (
    ConnectFailed,
    HTTPStatusError,
    ServerStreamError,
    StreamCut,
    StreamRecord,
    retry_after_s,
    stream_request,
)

__all__ = ["classify", "post_request", "send_request"]


async def post_request(
    session: aiohttp.ClientSession,
    url: str,
    payload: Mapping[str, object],
    record: StreamRecord,
    headers: Mapping[str, str] | None = None,
) -> StreamRecord:
    """A non-streaming POST; the whole answer is one chunk stamped when its body has arrived."""
    record.t_send_ns = time.perf_counter_ns()
    try:
        async with session.post(url, json={**payload, "stream": False}, headers=headers) as resp:
            record.t_headers_ns = time.perf_counter_ns()
            record.status = resp.status
            if resp.status != 200:
                text = await resp.text()
                record.error = f"HTTP {resp.status}: {text[:300]}"
                raise HTTPStatusError(
                    resp.status, text, record, retry_after_s(resp.headers.get("Retry-After"))
                )
            body = await resp.json(content_type=None)
    except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
        record.error = f"request failed: {exc!r}"
        if record.status is None and isinstance(exc, aiohttp.ClientConnectorError):
            raise ConnectFailed(record.error, record) from exc
        raise StreamCut(record.error, record) from exc
    t_ns = time.perf_counter_ns()
    if isinstance(body, dict) and "error" in body and not body.get("choices"):
        record.error = f"server error: {str(body['error'])[:300]}"
        raise ServerStreamError(record.error, record)
    usage = body.get("usage") or {}
    record.usage = dict(usage)
    choices = body.get("choices") or [{}]
    record.finish_reason = choices[0].get("finish_reason")
    record.tokens_from_usage = usage.get("completion_tokens") is not None
    record.add_chunk(t_ns, int(usage.get("completion_tokens", 1)))
    record.t_done_ns = t_ns
    return record


async def send_request(
    session: aiohttp.ClientSession,
    base_url: str,
    spec: RequestSpec,
    api: ApiSettings,
    record: StreamRecord,
    headers: Mapping[str, str] | None = None,
    *,
    lazy: bool = False,
) -> StreamRecord:
    """Send ``spec`` (streaming or not, as it says) and return its filled record; errors are typed.

    ``lazy``: a stream's chunks are parsed when the record is first read, and an error found then is
    ``record.failure`` rather than raised (``stream_request``'s hot path).
    """
    url = base_url.rstrip("/") + api.path
    payload = build_payload(spec, api)
    if spec.streaming:
        return await stream_request(session, url, payload, record=record, headers=headers, lazy=lazy)
    return await post_request(session, url, payload, record, headers=headers)


def classify(exc: BaseException) -> str:
    """The trace ``status`` for a request that raised ``exc`` (``timeout``: its own time limit ran out)."""
    if isinstance(exc, StreamCut) and isinstance(exc.__cause__, TimeoutError):
        return "timeout"
    if isinstance(exc, HTTPStatusError):
        return "http_error"
    if isinstance(exc, ServerStreamError):
        return "server_error"
    if isinstance(exc, ConnectFailed):
        return "refused"  # no connection: the engine is not there (a cut is a stream that broke mid-way)
    if isinstance(exc, StreamCut):
        return "cut"
    return "client_error"
