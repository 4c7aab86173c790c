"""The per-request trace format (Parquet, plus CSV for people) and its header (JSON): reading and writing.

One row per request with the seed-003 columns that apply (client, tenant, SLO class, session and round,
prefix group, streaming, input/output tokens, intended and actual send times, first and last chunk, number
of chunks) plus every chunk's stamp and token count, status, HTTP status and error text, and the
load-generation worker that sent it (empty in a trace written before that column). Times are integer
nanoseconds of ``perf_counter_ns`` measured from the session start; ``session_start_unix_ns`` in the
header anchors them to wall-clock time, ``session_start_perf_ns`` to the host's monotonic clock (where an
engine on the same host stamps its own log: the simulated engine's). ``output_tokens`` and
``input_tokens`` come from the server's ``usage`` (empty where it sent none); ``chunk_tokens`` holds tokens
per chunk.

The load generator (``microbench.loadgen.trace``) writes a session's trace in this format; the calibration
(``analysis.calibrate``) reads a real one and writes its prediction in the same format, so every reader of
traces reads both. The format lives here, with the other stored records, for that reason.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any, Literal

import pandas as pd
from pydantic import Field

from benchcore.schema import StrictModel

__all__ = [
    "INT_COLUMNS",
    "LIST_COLUMNS",
    "TRACE_COLUMNS",
    "StageHealth",
    "TraceHeader",
    "read_metrics",
    "read_trace",
    "write_trace_files",
]

LIST_COLUMNS = ("chunk_ns", "chunk_tokens")
TRACE_COLUMNS = (
    "request_id", "stage", "warmup", "worker", "client_id", "tenant_id", "slo_class", "session_id",
    "round_index", "prefix_group", "prefix_tokens", "streaming", "prompt_tokens", "max_tokens",
    "input_tokens", "output_tokens", "cached_tokens", "intended_ns", "send_ns", "schedule_delay_ns",
    "headers_ns", "first_chunk_ns", "last_chunk_ns", "done_ns", "num_chunks", "chunk_ns", "chunk_tokens",
    "tokens_from_usage", "finish_reason", "status", "http_status", "error",
)  # fmt: skip
INT_COLUMNS = (
    "worker",
    "input_tokens",
    "output_tokens",
    "cached_tokens",
    "send_ns",
    "schedule_delay_ns",
    "headers_ns",
    "first_chunk_ns",
    "last_chunk_ns",
    "done_ns",
    "http_status",
)  # fmt: skip  (nullable integers: stored as Int64)


class StageHealth(StrictModel):
    """How well the load generator kept its schedule in one stage."""

    name: str
    warmup: bool
    scheduler: dict[str, Any]
    requested_rate: float | None = Field(
        default=None, description="requests per second asked for (open loop)"
    )
    scheduled_rate: float | None = Field(
        default=None, description="first-round intended sends per second (the draw)"
    )
    achieved_rate: float | None = Field(
        default=None, description="first-round sends per second actually made"
    )
    in_flight_limit: int | None = Field(default=None, description="closed-loop concurrency")
    max_in_flight: int
    issued: int = Field(..., description="requests sent, later rounds of conversations included")
    status_counts: dict[str, int]
    schedule_delay_p50_ms: float | None
    schedule_delay_p99_ms: float | None
    schedule_delay_max_ms: float | None
    duration_s: float = Field(..., description="stage start to the end of its drain")
    drain_cancelled: int
    stopped: bool
    saturated: bool
    listen_overflows: int | None = Field(
        default=None,
        description="handshakes this host dropped on a full accept queue over the stage, each request "
        "held 1 s by the retransmit (microbench.loadgen.handshakes); None: the engine is not on this host",
    )
    warning: str | None = None


class TraceHeader(StrictModel):
    """Everything needed to read, reproduce and trust a trace."""

    trace_version: Literal[1] = 1  # bump on a breaking change of columns or header; read_trace checks it
    created_at: str
    time_unit: Literal["ns"] = "ns"
    clock: str = "perf_counter_ns offsets from the session start"
    session_start_unix_ns: int
    session_start_perf_ns: int | None = Field(
        default=None,
        description="the session start on perf_counter_ns (CLOCK_MONOTONIC on Linux: one clock for every "
        "process of the host); absent in a trace written before it",
    )
    workload: dict[str, Any] = Field(default_factory=dict, description="name, seed, spec, notes")
    seed: int | None = Field(default=None, description="the workload seed")
    prompts: dict[str, Any] = Field(default_factory=dict, description="token space, salt, text or ids")
    engine: dict[str, Any] = Field(default_factory=dict, description="base URL, model, kind, settings")
    session: dict[str, Any] = Field(default_factory=dict, description="the session settings")
    loadgen: dict[str, Any] = Field(default_factory=dict, description="host and versions")
    hardware: dict[str, Any] = Field(default_factory=dict, description="the load generator's host: CPU, GPUs")
    network: dict[str, Any] = Field(default_factory=dict, description="round-trip time to the engine")
    metrics: dict[str, Any] = Field(
        default_factory=dict, description="the engine's /metrics series (metrics.csv): interval, quantities"
    )
    stages: list[StageHealth]
    saturated: bool = Field(
        ..., description="a measured stage fell behind its schedule (a warm-up stage's health says its own)"
    )
    warnings: list[str] = Field(default_factory=list, description="the measured stages' schedule warnings")


def _atomic_write(path: Path, write: Any) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    os.close(fd)
    try:
        write(tmp)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def write_trace_files(
    out_dir: str | Path, header: TraceHeader, frame: pd.DataFrame, series: pd.DataFrame | None = None
) -> None:
    """Write ``header.json``, ``trace.parquet`` and ``trace.csv`` (list columns space-separated) into
    ``out_dir``, each atomically; ``frame`` has the columns of ``TRACE_COLUMNS``; ``series``, the engine's
    /metrics time series sampled during the session, goes to ``metrics.csv`` when it holds rows."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    frame = frame[list(TRACE_COLUMNS)]
    _atomic_write(out / "trace.parquet", lambda p: frame.to_parquet(p, index=False))
    text = frame.copy()
    for column in LIST_COLUMNS:
        text[column] = [" ".join(map(str, v)) for v in text[column]]
    _atomic_write(out / "trace.csv", lambda p: text.to_csv(p, index=False))
    if series is not None and not series.empty:
        _atomic_write(out / "metrics.csv", lambda p: series.to_csv(p, index=False))
    _atomic_write(out / "header.json", lambda p: Path(p).write_text(header.model_dump_json(indent=2) + "\n"))


def read_trace(out_dir: str | Path) -> tuple[TraceHeader, pd.DataFrame]:
    """The header and the Parquet rows of a trace folder."""
    out = Path(out_dir)
    raw = json.loads((out / "header.json").read_text())
    if raw.get("trace_version") != 1:
        raise ValueError(
            f"{out} holds a trace of version {raw.get('trace_version')!r}; this suite reads version 1"
        )
    header = TraceHeader.model_validate(raw)
    frame = pd.read_parquet(out / "trace.parquet")
    if "worker" not in frame.columns:  # a trace from before the column: who sent what is not known
        frame.insert(TRACE_COLUMNS.index("worker"), "worker", pd.array([None] * len(frame), dtype="Int64"))
    return header, frame


def read_metrics(out_dir: str | Path) -> pd.DataFrame | None:
    """The /metrics time series stored beside a trace (``t_ns``, ``quantity``, ``value``), or None."""
    path = Path(out_dir) / "metrics.csv"
    if not path.exists():
        return None
    return pd.read_csv(path, dtype={"t_ns": "int64", "quantity": str, "value": float})
