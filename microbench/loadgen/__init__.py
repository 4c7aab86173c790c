"""Open- and closed-loop load generator that records every token (seed 004's architecture).

``LoadSession`` runs ``Stage``s (warm-up, then measured stages or a rate/concurrency sweep) against an
OpenAI-compatible engine; schedulers (``SCHEDULERS``) give seeded target times; ``write_trace`` stores the
per-request trace and its header. ``python -m microbench.loadgen run ...`` is the command line.
"""

from microbench.client.requests import ApiSettings, RequestSpec
from microbench.loadgen.events import Event, EventKind, EventLog, JsonlEventWriter
from microbench.loadgen.session import LoadSession
from microbench.loadgen.stages import RequestRecord, SessionResult, SessionSettings, Stage, sweep_stages
from microbench.loadgen.trace import TraceHeader, read_trace, write_trace
from microbench.workloads.schedulers import SCHEDULERS, Scheduler, parse_scheduler

__all__ = [
    "SCHEDULERS",
    "ApiSettings",
    "Event",
    "EventKind",
    "EventLog",
    "JsonlEventWriter",
    "LoadSession",
    "RequestRecord",
    "RequestSpec",
    "Scheduler",
    "SessionResult",
    "SessionSettings",
    "Stage",
    "TraceHeader",
    "parse_scheduler",
    "read_trace",
    "sweep_stages",
    "write_trace",
]
