"""OpenAI-compatible streaming client: one ``perf_counter_ns`` stamp per read, chunks parsed off the hot path.

``stream_request`` posts a streaming request; per read of the body it takes one stamp and keeps the bytes.
The ``StreamRecord`` parses them into chunks when a caller reads it — live for a caller that watches a
running stream (the interference protocol reads decode gaps live) and may cancel it, after the stream
otherwise — so the loop is back for the next read at once. Closing the connection makes vLLM and SGLang
abort the request. Tokens are counted from the server's running
``usage.completion_tokens`` (``stream_options.continuous_usage_stats``) when it sends it, else one per
content chunk — never from text, which a byte-level tokenizer may leave empty for a real token.

A stream that breaks raises a typed ``StreamError`` whose ``record`` holds everything that arrived. The
wire parsing itself (``parse_chunk``, ``parse_sse_line``) is ``microbench.client.sse``'s, named here too.
"""

from __future__ import annotations

import datetime as dt
import email.utils
import json
import time
from collections.abc import Callable, Mapping
from typing import Any

import aiohttp
import msgspec
from msgspec import UNSET

from microbench.client.sse import DONE, StreamChunk, chunk_text, parse_chunk, parse_sse_line

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

_JSON = msgspec.json.Encoder()
_END = b""  # kept after the last read: the body ended here (a read is never empty)


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


class _Parsed:
    """A ``StreamRecord`` field built from its kept reads: reading it parses the reads not parsed yet."""

    def __set_name__(self, owner: type, name: str) -> None:
        self.slot = "_" + name

    def __get__(self, record: StreamRecord | None, owner: type | None = None) -> Any:
        if record is None:
            return self
        if record._reads:
            record.settle()
        return record.__dict__[self.slot]

    def __set__(self, record: StreamRecord, value: Any) -> None:
        record.__dict__[self.slot] = value


class StreamRecord:
    """What one streaming request produced: the stamped reads as they arrived, parsed when first read.

    The stream keeps each read as ``(perf_counter_ns, bytes)`` and nothing more (``keep_read``); the
    chunk stamps, token counts, text and usage below are parsed from those reads the first time one of
    them is read (``settle``), during the stream when a caller watches it, else after. A stamp is the
    moment the read that completed the event's line returned, whenever the parse runs.
    """

    chunk_t_ns = _Parsed()
    chunk_tokens = _Parsed()
    completion_tokens = _Parsed()  # Σ chunk_tokens, kept up to date as chunks are parsed (O(1))
    usage = _Parsed()
    finish_reason = _Parsed()
    text = _Parsed()
    tokens_from_usage = _Parsed()
    t_done_ns = _Parsed()

    def __init__(
        self,
        t_send_ns: int = 0,
        t_headers_ns: int | None = None,
        chunk_t_ns: list[int] | None = None,
        chunk_tokens: list[int] | None = None,
        usage: dict[str, Any] | None = None,
        finish_reason: str | None = None,
        text: list[str] | None = None,
        tokens_from_usage: bool = False,
        t_done_ns: int | None = None,
        status: int | None = None,
        error: str | None = None,
    ) -> None:
        self.t_send_ns = t_send_ns
        self.t_headers_ns = t_headers_ns
        self.status = status
        self.error = error
        self._reads: list[tuple[int, bytes]] = []  # stamped reads not parsed yet
        self._parts: list[bytes] = []  # the unfinished line the parsed reads ended with
        self._failure: StreamError | None = None  # what parsing found wrong (malformed, server error)
        self._chunk_t_ns = list(chunk_t_ns or [])
        self._chunk_tokens = list(chunk_tokens or [])
        self._completion_tokens = sum(self._chunk_tokens)
        self._usage = usage
        self._finish_reason = finish_reason
        self._text = list(text or [])
        self._tokens_from_usage = tokens_from_usage
        self._t_done_ns = t_done_ns

    def __repr__(self) -> str:
        return (
            f"StreamRecord(status={self.status}, chunks={len(self.chunk_t_ns)}, "
            f"tokens={self.completion_tokens}, done={self.t_done_ns is not None}, error={self.error!r})"
        )

    def __getstate__(self) -> dict[str, Any]:  # parsed before it crosses a process boundary
        self.settle()
        return self.__dict__

    @property
    def first_token_ns(self) -> int | None:
        return self.chunk_t_ns[0] if self.chunk_t_ns else None

    def add_chunk(self, t_ns: int, tokens: int) -> None:
        """Record one content chunk that carried ``tokens`` tokens and arrived at ``t_ns``."""
        self._chunk_t_ns.append(t_ns)
        self._chunk_tokens.append(tokens)
        self._completion_tokens += tokens

    def keep_read(self, t_ns: int, data: bytes) -> None:
        """Keep one read of the body, stamped ``t_ns`` (the hot path: no parsing here)."""
        self._reads.append((t_ns, data))

    @property
    def failure(self) -> StreamError | None:
        """What the parsed stream says went wrong (a malformed line, an error event), or None."""
        self.settle()
        return self._failure

    def settle(self, on_chunk: Callable[[StreamRecord], None] | None = None) -> None:
        """Parse the reads kept so far into chunks (``on_chunk(record)`` after each content chunk)."""
        if not self._reads:
            return
        reads = self._reads[:]
        self._reads.clear()  # the same list: the stream keeps appending to it
        parts = self._parts
        for t_ns, data in reads:
            if self._t_done_ns is not None or self._failure is not None:
                return  # nothing after [DONE] or a failure is part of the stream
            if not data:  # the body ended (``_END``): its last line may lack a newline
                self._at_end(t_ns)
                return
            if b"\n" not in data:
                parts.append(data)  # a piece of a long line: joined once, when the line ends
                continue
            if parts:
                parts.append(data)
                data = b"".join(parts)
                parts.clear()
            *lines, tail = data.split(b"\n")
            if tail:
                parts.append(tail)
            for line in lines:
                if len(line) > 1 and self._parse_line(line, t_ns, on_chunk):  # skip blank lines
                    return

    def _at_end(self, t_ns: int) -> None:
        line = b"".join(self._parts)
        self._parts.clear()
        if line and self._parse_line(line, t_ns, None):
            return
        self.error = self.error or f"stream ended without [DONE] after {len(self._chunk_t_ns)} chunks"
        self._failure = StreamCut(self.error, self)

    def _parse_line(self, line: bytes, t_ns: int, on_chunk: Callable[[StreamRecord], None] | None) -> bool:
        """Record one SSE line; True once ``[DONE]`` arrived or the stream failed."""
        try:
            event = parse_chunk(line)
        except ValueError as exc:
            self.error = self.error or f"malformed SSE: {exc}"
            self._failure = StreamCut(self.error, self)
            return True
        if event is None:
            return False
        if event is DONE:
            self._t_done_ns = t_ns
            return True
        assert isinstance(event, StreamChunk)
        n_before = len(self._chunk_t_ns)
        try:
            _ingest(self, event, t_ns)
        except ServerStreamError as exc:
            self.error = self.error or str(exc)
            self._failure = exc
            return True
        if on_chunk is not None and len(self._chunk_t_ns) > n_before:
            on_chunk(self)
        return False

    @property
    def prompt_tokens(self) -> int | None:
        return None if self.usage is None else self.usage.get("prompt_tokens")

    @property
    def cached_prompt_tokens(self) -> int | None:
        """Prompt tokens the server reports as served from its prefix cache (if it reports them)."""
        details = (self.usage or {}).get("prompt_tokens_details") or {}
        value = details.get("cached_tokens")
        return None if value is None else int(value)


def _ingest(record: StreamRecord, chunk: StreamChunk, t_ns: int) -> None:
    """Add one parsed chunk to ``record`` (a content chunk, a usage-only chunk or an error event)."""
    choices = chunk.choices
    usage = chunk.usage
    if not choices:
        if chunk.error is not UNSET:
            raise ServerStreamError(f"server error in stream: {json.dumps(chunk.error)[:300]}", record)
    else:
        texts = []
        for choice in choices:
            text = chunk_text(choice)
            if text is not None:
                texts.append(text)
            if choice.finish_reason:
                record._finish_reason = choice.finish_reason
        if texts:
            running = usage.get("completion_tokens") if usage else None
            if running is not None:
                record._tokens_from_usage = True
                n = int(running) - record._completion_tokens
            else:
                n = 1
            if n > 0:
                record.add_chunk(t_ns, n)
            record._text.append(texts[0] if len(texts) == 1 else "".join(texts))
    if usage:
        record._usage = usage  # each chunk's payload is a fresh dict: no copy needed


async def stream_request(
    session: aiohttp.ClientSession,
    url: str,
    payload: Mapping[str, Any],
    record: StreamRecord | None = None,
    headers: Mapping[str, str] | None = None,
    on_chunk: Callable[[StreamRecord], None] | None = None,
    *,
    lazy: bool = False,
) -> StreamRecord:
    """POST a streaming request to ``url`` and return its completed ``StreamRecord``.

    The body is read as it arrives (``iter_any``: no line-length limit); each read is stamped with one
    ``perf_counter_ns`` taken when it returned — the moment those bytes reached the client — and kept;
    every event the read completes carries that stamp. What is parsed when:

    - ``on_chunk`` given: each read is parsed as it arrives and ``on_chunk(record)`` runs after each
      content chunk (a protocol that watches the stream: steady state, injection timing);
    - default: the reads are parsed when the body ends, and a malformed line or an error event raises;
    - ``lazy``: nothing is parsed; the record is parsed when first read, and the caller checks
      ``record.failure`` (the load generator, whose loop must stamp the next read and keep its schedule).

    ``t_send_ns`` is stamped once the body is serialised, before the connection is opened (or taken
    from the pool). Cancelling the awaiting task closes the connection (the server aborts the request) and
    leaves the reads stamped so far in ``record``.
    """
    record = StreamRecord() if record is None else record
    body = _JSON.encode({**payload, "stream": True})  # msgspec: 0.4 ms for a 100K-token prompt, json 6.7
    headers = {**(headers or {}), "Content-Type": "application/json"}
    stamp = time.perf_counter_ns
    reads = record._reads
    record.t_send_ns = stamp()
    try:
        async with session.post(url, data=body, headers=headers) as resp:
            record.t_headers_ns = stamp()
            record.status = resp.status
            if resp.status != 200:
                text = await resp.text()
                record.error = f"HTTP {resp.status}: {text[:300]}"
                wait = retry_after_s(resp.headers.get("Retry-After"))
                raise HTTPStatusError(resp.status, text, record, wait)
            if on_chunk is not None:
                async for data in resp.content.iter_any():
                    reads.append((stamp(), data))
                    record.settle(on_chunk)
                    if record._t_done_ns is not None or record._failure is not None:
                        break
            else:
                # the hot path: a stamp and the bytes, to the body's end (a connection read to its end
                # goes back to the pool; one left at [DONE] is closed)
                async for data in resp.content.iter_any():
                    reads.append((stamp(), data))
            reads.append((stamp(), _END))
            if lazy:
                return record
            record.settle(on_chunk)
            if record._failure is not None:
                raise record._failure
    except StreamError as exc:
        record.error = record.error or str(exc)
        raise
    except (aiohttp.ClientError, TimeoutError) as exc:
        where = "before any response" if record.status is None else f"after {len(record.chunk_t_ns)} chunks"
        record.error = f"connection to {url} failed {where}: {exc!r}"
        if record.status is None and isinstance(exc, aiohttp.ClientConnectorError):
            raise ConnectFailed(record.error, record) from exc  # refused or unreachable: nothing was sent
        raise StreamCut(record.error, record) from exc
    return record
