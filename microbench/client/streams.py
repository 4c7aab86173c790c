"""OpenAI-compatible streaming client: one ``perf_counter_ns`` stamp per content chunk, usage kept.

``stream_request`` posts a streaming request and fills a ``StreamRecord`` *as chunks arrive*, so a caller
can watch a running stream (the interference protocol reads decode gaps live) and cancel it; closing the
connection makes vLLM and SGLang abort the request. Tokens are counted from the server's running
``usage.completion_tokens`` (``stream_options.continuous_usage_stats``) when it sends it, else one per
content chunk — never from text, which a byte-level tokenizer may leave empty for a real token.

A stream that breaks raises a typed ``StreamError`` whose ``record`` holds everything that arrived.
``parse_chunk`` is the pure, typed SSE parser the client uses (and the unit tests run on transcribed vLLM
and SGLang payloads); ``parse_sse_line`` gives the whole JSON object, for tools that inspect the wire.
"""

from __future__ import annotations

import datetime as dt
import email.utils
import json
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import msgspec
from msgspec import UNSET, UnsetType

__all__ = [
    "DONE",
    "ConnectFailed",
    "HTTPStatusError",
    "ServerStreamError",
    "StreamChunk",
    "StreamCut",
    "StreamError",
    "StreamRecord",
    "parse_chunk",
    "parse_sse_line",
    "retry_after_s",
    "stream_request",
]

DONE = object()  # sentinel for "data: [DONE]"


class StreamError(RuntimeError):
    """A streaming request failed; ``record`` keeps every chunk that arrived before the failure."""

    def __init__(self, message: str, record: StreamRecord) -> None:
        super().__init__(message)
        self.record = record


class HTTPStatusError(StreamError):
    """The server answered with a non-200 status (e.g. 429, 500); ``status`` and ``body`` say what, and
    ``retry_after`` the seconds its ``Retry-After`` header asked the client to wait (None: no header)."""

    def __init__(
        self, status: int, body: str, record: StreamRecord, retry_after: float | None = None
    ) -> None:
        super().__init__(f"HTTP {status}: {body[:300]}", record)
        self.status = status
        self.body = body
        self.retry_after = retry_after


class StreamCut(StreamError):
    """The connection ended before ``data: [DONE]``."""


class ConnectFailed(StreamCut):
    """No connection at all (refused, unreachable, reset before any response): nothing was sent."""


def retry_after_s(value: str | None) -> float | None:
    """A ``Retry-After`` header (delta-seconds or an HTTP date) in seconds from now; None if absent/bad."""
    if not value:
        return None
    value = value.strip()
    try:
        return max(float(value), 0.0)
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=dt.UTC)
    return max((when - dt.datetime.now(dt.UTC)).total_seconds(), 0.0)


class ServerStreamError(StreamError):
    """The server sent an error object inside the stream."""


@dataclass
class StreamRecord:
    """What one streaming request produced, filled in live."""

    t_send_ns: int = 0
    t_headers_ns: int | None = None
    chunk_t_ns: list[int] = field(default_factory=list)
    chunk_tokens: list[int] = field(default_factory=list)
    completion_tokens: int = field(init=False)  # Σ chunk_tokens, kept up to date by add_chunk (O(1))
    usage: dict[str, Any] | None = None
    finish_reason: str | None = None
    text: list[str] = field(default_factory=list)
    tokens_from_usage: bool = False
    t_done_ns: int | None = None
    status: int | None = None
    error: str | None = None

    @property
    def first_token_ns(self) -> int | None:
        return self.chunk_t_ns[0] if self.chunk_t_ns else None

    def __post_init__(self) -> None:
        self.completion_tokens = sum(self.chunk_tokens)

    def add_chunk(self, t_ns: int, tokens: int) -> None:
        """Record one content chunk that carried ``tokens`` tokens and arrived at ``t_ns``."""
        self.chunk_t_ns.append(t_ns)
        self.chunk_tokens.append(tokens)
        self.completion_tokens += tokens

    @property
    def prompt_tokens(self) -> int | None:
        return None if self.usage is None else self.usage.get("prompt_tokens")

    @property
    def cached_prompt_tokens(self) -> int | None:
        """Prompt tokens the server reports as served from its prefix cache (if it reports them)."""
        details = (self.usage or {}).get("prompt_tokens_details") or {}
        value = details.get("cached_tokens")
        return None if value is None else int(value)


def _sse_data(line: bytes) -> bytes | object | None:
    """The payload bytes of an SSE ``data:`` line, ``DONE`` for ``[DONE]``, ``None`` for any other line."""
    if not line.startswith(b"data:"):
        return None
    data = line[5:].strip()
    return DONE if data == b"[DONE]" else data


def parse_sse_line(line: bytes) -> Mapping[str, Any] | object | None:
    """One SSE line → its JSON payload, ``DONE``, or ``None`` (blank, comment or non-data field)."""
    data = _sse_data(line)
    if not isinstance(data, bytes):
        return data
    payload = json.loads(data.decode())  # str, not bytes: json skips its encoding detection
    if not isinstance(payload, dict):
        raise ValueError(f"SSE data is not a JSON object: {data[:200]!r}")
    return payload


class _Delta(msgspec.Struct):
    role: str | UnsetType | None = UNSET
    content: str | UnsetType | None = UNSET
    reasoning_content: str | UnsetType | None = UNSET


class _Choice(msgspec.Struct):
    text: str | UnsetType | None = UNSET
    delta: _Delta | None = None
    finish_reason: str | None = None


class StreamChunk(msgspec.Struct):
    """The fields of one streamed completion chunk the client reads; all others are skipped unparsed."""

    choices: list[_Choice] | None = None
    usage: dict[str, Any] | None = None
    error: Any = UNSET


# A typed decoder builds only these fields and skips the rest of each chunk unparsed, instead of a dict
# per chunk walked in Python: the client's one core has to keep up with hundreds of streams at once
# (scripts/bench_loadgen.py measures the chunks it ingests per CPU second).
_CHUNK = msgspec.json.Decoder(StreamChunk)


def parse_chunk(line: bytes) -> StreamChunk | object | None:
    """One SSE line → a ``StreamChunk``, ``DONE`` or ``None``; ``ValueError`` if it is not a JSON object."""
    data = _sse_data(line)
    if not isinstance(data, bytes):
        return data
    try:
        return _CHUNK.decode(data)
    except msgspec.MsgspecError as exc:
        raise ValueError(f"SSE data is not a completion chunk ({exc}): {data[:200]!r}") from exc


def _chunk_text(choice: _Choice) -> str | None:
    """The text a choice carries (completions: ``text``; chat: ``delta.content``), or None if none."""
    if choice.text is not UNSET:
        return choice.text or ""
    delta = choice.delta
    if delta is None or delta.role is not UNSET:
        return None  # the chat role announcement precedes the first token and carries none
    if delta.content is not UNSET or delta.reasoning_content is not UNSET:
        return delta.content or delta.reasoning_content or ""
    return None


def _ingest(record: StreamRecord, chunk: StreamChunk, t_ns: int) -> None:
    choices = chunk.choices
    usage = chunk.usage
    if not choices:
        if chunk.error is not UNSET:
            raise ServerStreamError(f"server error in stream: {json.dumps(chunk.error)[:300]}", record)
    else:
        texts = []
        for choice in choices:
            text = _chunk_text(choice)
            if text is not None:
                texts.append(text)
            if choice.finish_reason:
                record.finish_reason = choice.finish_reason
        if texts:
            running = usage.get("completion_tokens") if usage else None
            if running is not None:
                record.tokens_from_usage = True
                n = int(running) - record.completion_tokens
            else:
                n = 1
            if n > 0:
                record.add_chunk(t_ns, n)
            record.text.append(texts[0] if len(texts) == 1 else "".join(texts))
    if usage:
        record.usage = usage  # each chunk's payload is a fresh dict: no copy needed


async def stream_request(
    session: aiohttp.ClientSession,
    url: str,
    payload: Mapping[str, Any],
    record: StreamRecord | None = None,
    headers: Mapping[str, str] | None = None,
    on_chunk: Callable[[StreamRecord], None] | None = None,
) -> StreamRecord:
    """POST a streaming request to ``url`` and return its completed ``StreamRecord``.

    The body is read as it arrives (``iter_any``); every event of one read is stamped with the same
    ``perf_counter_ns`` taken when the read returned — the moment those bytes reached the client.
    ``on_chunk(record)`` runs after each content chunk is recorded. Cancelling the awaiting task
    closes the connection (the server aborts the request) and leaves the chunks stamped so far in
    ``record``.
    """
    record = StreamRecord() if record is None else record
    body = {**payload, "stream": True}
    record.t_send_ns = time.perf_counter_ns()
    try:
        async with session.post(url, json=body, headers=headers) as resp:
            record.t_headers_ns = time.perf_counter_ns()
            record.status = resp.status
            if resp.status != 200:
                text = await resp.text()
                record.error = f"HTTP {resp.status}: {text[:300]}"
                wait = retry_after_s(resp.headers.get("Retry-After"))
                raise HTTPStatusError(resp.status, text, record, wait)
            pending = b""
            async for data in resp.content.iter_any():
                t_ns = time.perf_counter_ns()
                *lines, pending = (pending + data).split(b"\n")
                for line in lines:
                    if len(line) > 1 and _handle_line(record, line, t_ns, on_chunk):  # skip blank lines
                        return record
            if pending and _handle_line(record, pending, time.perf_counter_ns(), on_chunk):
                return record
    except StreamError as exc:
        record.error = record.error or str(exc)
        raise
    except (aiohttp.ClientError, TimeoutError) as exc:
        where = "before any response" if record.status is None else f"after {len(record.chunk_t_ns)} chunks"
        record.error = f"connection to {url} failed {where}: {exc!r}"
        if record.status is None and isinstance(exc, aiohttp.ClientConnectorError):
            raise ConnectFailed(record.error, record) from exc  # refused or unreachable: nothing was sent
        raise StreamCut(record.error, record) from exc
    record.error = f"stream ended without [DONE] after {len(record.chunk_t_ns)} chunks"
    raise StreamCut(record.error, record)


def _handle_line(
    record: StreamRecord, line: bytes, t_ns: int, on_chunk: Callable[[StreamRecord], None] | None
) -> bool:
    """Record one SSE line; True once ``[DONE]`` arrived."""
    try:
        event = parse_chunk(line)
    except ValueError as exc:
        record.error = f"malformed SSE: {exc}"
        raise StreamCut(record.error, record) from exc
    if event is None:
        return False
    if event is DONE:
        record.t_done_ns = t_ns
        return True
    assert isinstance(event, StreamChunk)
    n_before = len(record.chunk_t_ns)
    _ingest(record, event, t_ns)
    if on_chunk is not None and len(record.chunk_t_ns) > n_before:
        on_chunk(record)
    return False
