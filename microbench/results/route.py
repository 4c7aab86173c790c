"""Result schema of the route experiment: one ``ReplayRecord`` per (policy, repetition), beside the
replay's per-request frame (``replays/<policy>_r<rep>.parquet``: the load generator's trace columns, the
router's decision inputs and phase stamps, all ``perf_counter_ns`` offsets from the replay's start).

Written by ``microbench.route`` through ``results.layout.RouteFolder``; read by ``microbench.route.derive``.
"""

from __future__ import annotations

from pydantic import Field

from benchcore.schema import StrictModel as Record
from microbench.results.records import SCHEMA_VERSION

__all__ = ["EngineLoad", "ReplayRecord"]


class EngineLoad(Record):
    """One engine's CPU use over one replay: the contention each policy put on the box."""

    role: str
    busy_pct: float = Field(ge=0, description="all threads of its process group, % of one core")
    top_threads_pct: dict[str, float] = Field(default_factory=dict)


class ReplayRecord(Record):
    """One policy's replay of the workload: what the engines' counters said around it, and its validity."""

    schema_version: int = SCHEMA_VERSION
    policy: str
    repetition: int = Field(ge=0)
    position: int = Field(ge=0, description="its place in the round's counterbalanced order")
    seed: int
    started_unix_ns: int
    duration_s: float = Field(ge=0, description="first send to the end of the drain")
    requests: int = Field(ge=0)
    failed_requests: int = Field(ge=0, description="requests that did not finish with status ok")
    prefix_cache_hits: dict[str, float] = Field(
        default_factory=dict, description="per engine role: prefix-cache hit tokens over the replay (cold: 0)"
    )
    kv_xfer_count: float | None = Field(None, description="decode worker: KV transfers over the replay")
    kv_xfer_sum_ms: float | None = Field(None, description="decode worker: their summed transfer time (ms)")
    loadavg_1m: float | None = Field(None, description="the box's 1-minute load average at the replay's end")
    engine_load: list[EngineLoad] = Field(default_factory=list)
    valid: bool
    reasons: list[str] = Field(default_factory=list, description="why the replay is invalid")
