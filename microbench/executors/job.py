"""A shard as an executor sees it, whatever the job measures (an interference shard, a characterization's
search or swept configuration): where its executions are recorded, how to run it in this process, and
what a Ray worker runs for it with the driver's writer of what the worker sends back.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol

from engine_harness.engines import EngineSpec
from microbench.results.layout import JobFolder

__all__ = ["JobRelay", "ShardJob"]


class JobRelay(Protocol):
    """The driver's side of one remote execution: writes each message into the run folder as it arrives."""

    engine_version: str | None

    def apply(self, message: object) -> None: ...


@dataclass(frozen=True)
class ShardJob:
    name: str  # in messages: "512", "512-D2_8", "found"
    chunk: int  # the shard's token budget (the manifest's ``ShardRun.chunk``)
    part: str | None  # what part of the run it is where a chunk size does not name it (``ShardRun.part``)
    spec: EngineSpec  # the engine it starts
    hardware: str  # the driver's hardware as records name it ("CPU: …", GPU names)
    folder: JobFolder  # whose manifest lists every execution
    local: Callable[[], Awaitable[None]]  # measure it in this process, into ``folder``
    task: Callable[..., Iterator[object]]  # on a worker: ``task(*args(), options)`` yields the messages
    args: Callable[[], tuple[Any, ...]]  # its arguments, as they are when it is submitted
    relay: Callable[[], JobRelay]  # a new driver-side writer for one remote execution
    done: Callable[[], int]  # units of the shard stored final in ``folder`` (points, levels)
    total: int  # units in all: a shard with ``done() == total`` is not run
    engine_version: Callable[[], str | None]  # the engine's, once a local execution started it
