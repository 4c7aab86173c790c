"""Structured events of a load-generation session, delivered to hooks registered before it runs.

Session events (``SESSION_STARTED``, ``STAGE_STARTED``, ``ISSUE_STOPPED``, ``DRAINED``, ``SESSION_ENDED``)
mark the lifecycle; sample events follow each request (``ISSUED``, ``FIRST_CHUNK``, ``CHUNK``, ``COMPLETE``,
``ERROR``). Every event carries the ``perf_counter_ns`` stamp of the moment it describes. ``ISSUED``,
``COMPLETE`` and ``ERROR`` are delivered as they happen; chunk events are delivered when their request ends,
with each chunk's own arrival stamp (the SSE client has no per-chunk callback), so the ingest path stays
lean. With no hook registered, nothing is built. ``EventLog`` collects events; ``JsonlEventWriter`` writes
one JSON object per line.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import IO, Any

__all__ = ["Event", "EventBus", "EventHook", "EventKind", "EventLog", "JsonlEventWriter"]


class EventKind(StrEnum):
    SESSION_STARTED = "session_started"
    STAGE_STARTED = "stage_started"
    ISSUED = "issued"
    FIRST_CHUNK = "first_chunk"
    CHUNK = "chunk"
    COMPLETE = "complete"
    ERROR = "error"
    ISSUE_STOPPED = "issue_stopped"
    DRAINED = "drained"
    SESSION_ENDED = "session_ended"


@dataclass(frozen=True, slots=True)
class Event:
    """One state transition: ``t_ns`` is when it happened (``perf_counter_ns``)."""

    kind: EventKind
    t_ns: int
    stage: str = ""
    request_id: int | None = None
    data: dict[str, Any] = field(default_factory=dict)


EventHook = Callable[[Event], None]


class EventBus:
    """Delivers events to hooks in registration order; ``active`` is False when nobody listens."""

    def __init__(self, hooks: list[EventHook] | None = None) -> None:
        self._hooks: list[EventHook] = list(hooks or [])

    def add(self, hook: EventHook) -> None:
        self._hooks.append(hook)

    @property
    def active(self) -> bool:
        return bool(self._hooks)

    def emit(self, event: Event) -> None:
        for hook in self._hooks:
            hook(event)


class EventLog:
    """A hook that keeps every event in memory (tests, small runs)."""

    def __init__(self) -> None:
        self.events: list[Event] = []

    def __call__(self, event: Event) -> None:
        self.events.append(event)

    def of_kind(self, kind: EventKind) -> list[Event]:
        return [e for e in self.events if e.kind == kind]


class JsonlEventWriter:
    """A hook that appends each event as one JSON line to ``path``; ``close()`` when the session ends."""

    def __init__(self, path: Path) -> None:
        self._file: IO[str] = path.open("w", encoding="utf-8")

    def __call__(self, event: Event) -> None:
        self._file.write(json.dumps(asdict(event)) + "\n")

    def close(self) -> None:
        self._file.close()
