"""What a load session runs and returns: its settings, stages (plan + limits) and per-request records."""

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
            plan=zip(scheduler.offsets_ns(), requests, strict=False),
            max_requests=max_requests,
            duration_s=duration_s,
            warmup=warmup,
            requested_rate=scheduler.requested_rate,
            in_flight_limit=scheduler.in_flight_limit,
            description=scheduler.model_dump(),
        )


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


@dataclass
class SessionResult:
    """The session's raw output: every request record and every stage outcome."""

    settings: SessionSettings
    t0_ns: int
    started_unix_ns: int
    records: list[RequestRecord]
    stages: list[StageOutcome]
    rtt_ms: list[float] = field(default_factory=list)  # round trips of GET /v1/models before the stages
