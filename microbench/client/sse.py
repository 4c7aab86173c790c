"""The wire format of an OpenAI-compatible stream: one SSE line → its event, parsed only as far as needed.

``parse_chunk`` is the pure, typed parser the client uses (the unit tests run it on transcribed vLLM and
SGLang payloads): a ``msgspec`` decoder that builds only the fields the client reads and skips the rest of
each chunk unparsed. ``parse_sse_line`` gives the whole JSON object, for tools that inspect the wire.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import msgspec
from msgspec import UNSET, UnsetType

__all__ = ["DONE", "StreamChunk", "chunk_text", "parse_chunk", "parse_sse_line"]

DONE = object()  # sentinel for "data: [DONE]"


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
# (scripts/bench_client.py measures the chunks it ingests per CPU second).
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


def chunk_text(choice: _Choice) -> str | None:
    """The text a choice carries (completions: ``text``; chat: ``delta.content``), or None if none."""
    if choice.text is not UNSET:
        return choice.text or ""
    delta = choice.delta
    if delta is None or delta.role is not UNSET:
        return None  # the chat role announcement precedes the first token and carries none
    if delta.content is not UNSET or delta.reasoning_content is not UNSET:
        return delta.content or delta.reasoning_content or ""
    return None
