"""What a load session runs and returns: its settings, stages (plan + limits) and per-request records.

A plan is an iterator of ``(offset_ns, RequestSpec)``. One that can also ``skip()`` (pass its next item by
without making the request, returning the item's offset: ``Workload.plan``, and a ``Stage.scheduled``
plan whose requests can ``skip()``, as ``Workload.requests`` can) lets a worker among N pass the items the
others send for the price of their draws: ``share_of`` is how a worker takes its share.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from pydantic import Field

from benchcore.schema import StrictModel
from microbench.client.aio import GcPass
from microbench.client.requests import ApiSettings, RequestSpec
from microbench.client.streams import StreamRecord
from microbench.workloads.schedulers import Scheduler

__all__ = [
    "Plan",
    "RequestRecord",
    "SessionResult",
    "SessionSettings",
    "Stage",
    "StageOutcome",
    "share_of",
    "sweep_stages",
]

Plan = Iterator[tuple[int, RequestSpec]]


class SessionSettings(StrictModel):
    """Where to send and how the session behaves around its stages."""

    base_url: str = Field(..., description="engine base URL, e.g. http://127.0.0.1:8000")
    api: ApiSettings
    drain_timeout_s: float = Field(default=60.0, gt=0, description="how long in-flight requests may finish")
    request_timeout_s: float | None = Field(default=None, gt=0, description="total time one request may take")
    api_key_env: str | None = Field(default=None, description="environment variable holding a bearer token")
    warm_connections: int = Field(
        default=0,
        ge=0,
        le=10_000,
        description="before each stage, open this many connections (concurrent GET /v1/models) so its first "
        "bursts reuse them instead of connecting; per worker process",
    )
    spin_us: int = Field(
        default=1000,
        ge=0,
        description="before a target, stop sleeping this early and yield to the loop instead",
    )


@dataclass
class Stage:
    """One phase of a session: a plan and the limits that end its issuing."""

    name: str
    plan: Plan
    max_requests: int | None = None
    duration_s: float | None = None
    warmup: bool = False
    requested_rate: float | None = None
    in_flight_limit: int | None = None
    description: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.max_requests is not None and self.max_requests < 1:
            raise ValueError(f"stage {self.name!r}: max_requests must be at least 1")
        if self.duration_s is not None and not self.duration_s > 0:
            raise ValueError(f"stage {self.name!r}: duration_s must be positive")
        if self.in_flight_limit is not None and self.in_flight_limit < 1:
            raise ValueError(f"stage {self.name!r}: in_flight_limit must be at least 1")

    @classmethod
    def scheduled(
        cls,
        name: str,
        scheduler: Scheduler,
        requests: Iterable[RequestSpec],
        *,
        max_requests: int | None = None,
        duration_s: float | None = None,
        warmup: bool = False,
    ) -> Stage:
        """A stage whose times come from ``scheduler`` and whose requests come from ``requests``."""
        if max_requests is None and duration_s is None and scheduler.kind != "trace":
            raise ValueError(f"stage {name!r}: give max_requests, duration_s or both")
        return cls(
            name=name,
            plan=_Scheduled(scheduler.offsets_ns(), iter(requests)),
            max_requests=max_requests,
            duration_s=duration_s,
            warmup=warmup,
            requested_rate=scheduler.requested_rate,
            in_flight_limit=scheduler.in_flight_limit,
            description=scheduler.model_dump(),
        )


class _Scheduled:
    """A scheduler's offsets paired with a stream of requests; ``skip()`` where the requests can."""

    def __init__(self, offsets: Iterator[int], requests: Iterator[RequestSpec]) -> None:
        self._offsets, self._requests = offsets, requests
        self._skip_request = getattr(requests, "skip", None)

    def skip(self) -> int:
        offset_ns = next(self._offsets)
        if self._skip_request is None:
            next(self._requests)
        else:
            self._skip_request()
        return offset_ns

    def __iter__(self) -> _Scheduled:
        return self

    def __next__(self) -> tuple[int, RequestSpec]:
        offset_ns = next(self._offsets)
        return offset_ns, next(self._requests)


def share_of(
    plan: Iterable[tuple[int, RequestSpec]], k: int, n: int, first: int = 0, limit: int | None = None
) -> Iterator[tuple[int, RequestSpec | None]]:
    """The items of ``plan`` as worker ``k`` of ``n`` takes them: every item's offset, with its request
    where the item is this worker's (counted from ``first``, the items pulled before: item ``first + i`` is
    worker ``(first + i) mod n``'s), else None; at most ``limit`` items (none pulled past it). The others'
    items are ``skip()``ped where the plan can, so their requests are never made."""
    items = iter(plan)
    skip = getattr(items, "skip", None) if n > 1 else None
    i = 0
    while limit is None or i < limit:
        mine = (first + i) % n == k
        try:
            if mine or skip is None:
                offset_ns, spec = next(items)
            else:
                offset_ns, spec = skip(), None
        except StopIteration:
            return
        i += 1
        yield offset_ns, spec if mine else None


def sweep_stages(
    scheduler: Scheduler,
    values: Iterable[float],
    requests: Iterable[RequestSpec],
    *,
    max_requests: int | None = None,
    duration_s: float | None = None,
) -> list[Stage]:
    """One stage per rate (or concurrency) in ``values``, all drawing from the same request stream."""
    source = iter(requests)
    stages = []
    for value in values:
        point = scheduler.with_load(value)
        name = f"{point.kind}-{point.sweep_axis}-{value:g}"
        stages.append(Stage.scheduled(name, point, source, max_requests=max_requests, duration_s=duration_s))
    return stages


@dataclass
class RequestRecord:
    """Everything known about one request; ``stream`` holds the send stamp, chunks and usage."""

    request_id: int
    stage: str
    warmup: bool
    spec: RequestSpec
    intended_ns: int
    stream: StreamRecord
    status: str = "pending"
    worker: int = 0  # the load-generation process that sent it (``microbench.loadgen.workers``)


@dataclass
class StageOutcome:
    """How a stage ran: its limits and what the dispatcher did (health is computed from the records)."""

    name: str
    warmup: bool
    description: dict[str, Any]
    requested_rate: float | None
    in_flight_limit: int | None
    max_requests: int | None
    duration_s: float | None
    start_ns: int = 0
    issue_end_ns: int = 0
    end_ns: int = 0
    issued: int = 0
    max_in_flight: int = 0
    issue_cpu_s: float = 0.0  # this process's CPU from the start to the issue end (the spin before sends too)
    drain_cancelled: int = 0
    stopped: bool = False
    gc_passes: list[GcPass] = field(default_factory=list)  # this process's, from start to end of drain
    # this host's handshakes dropped on a full accept queue from start to end of drain (``handshakes``);
    # None: the engine is not on this host, or the kernel does not say
    listen_overflows: int | None = None


@dataclass
class SessionResult:
    """The session's raw output: every request record and every stage outcome."""

    settings: SessionSettings
    t0_ns: int
    started_unix_ns: int
    records: list[RequestRecord]
    stages: list[StageOutcome]
    rtt_ms: list[float] = field(default_factory=list)  # round trips of GET /v1/models before the stages
