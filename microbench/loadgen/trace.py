"""The per-request trace of a session: its rows and the load generator's health per stage, written in the
one trace format (``microbench.results.trace``: columns, header, reader).

The header carries the workload spec and seed, the prompt settings (token space, salt), the engine, and
the load generator's health per stage: requested vs achieved rate, schedule-delay p50/p99/max, the most
requests in flight, the engine's ``/metrics`` time series when one was sampled (``metrics.csv``,
``metrics_series``), and a saturation warning when the generator fell behind (median schedule delay above
10 ms, p99 above 100 ms: a tail of late sends the median hides, or an open loop whose sends spanned more
than 1/0.9 of the time its schedule asked for).
"""

from __future__ import annotations

import datetime as dt
import os
import platform
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import pandas as pd
import pydantic

from benchcore.provenance import hardware_info
from engine_harness.telemetry import NvmlSource
from microbench.loadgen.stages import RequestRecord, SessionResult, StageOutcome
from microbench.results.trace import (
    INT_COLUMNS,
    TRACE_COLUMNS,
    StageHealth,
    TraceHeader,
    read_metrics,
    read_trace,
    write_trace_files,
)

__all__ = [
    "SATURATION_DELAY_MS",
    "SATURATION_DELAY_P99_MS",
    "TRACE_COLUMNS",
    "StageHealth",
    "TraceHeader",
    "read_metrics",
    "read_trace",
    "stage_health",
    "trace_frame",
    "write_trace",
]

SATURATION_DELAY_MS = 10.0
SATURATION_DELAY_P99_MS = 100.0
SATURATION_RATE_FRACTION = 0.9


def _offset(t_ns: int | None, t0_ns: int) -> int | None:
    return None if not t_ns else t_ns - t0_ns


def _row(rec: RequestRecord, t0_ns: int) -> dict[str, Any]:
    s, spec = rec.stream, rec.spec
    usage = s.usage or {}
    send = _offset(s.t_send_ns, t0_ns)
    intended = rec.intended_ns - t0_ns
    return {
        "request_id": rec.request_id,
        "stage": rec.stage,
        "warmup": rec.warmup,
        "worker": rec.worker,
        "client_id": spec.client_id,
        "tenant_id": spec.tenant_id,
        "slo_class": spec.slo_class,
        "session_id": spec.session_id,
        "round_index": spec.round_index,
        "prefix_group": spec.prefix_group,
        "prefix_tokens": spec.prefix_tokens,
        "streaming": spec.streaming,
        "prompt_tokens": spec.prompt_tokens,
        "max_tokens": spec.max_tokens,
        "input_tokens": usage.get("prompt_tokens"),
        "output_tokens": usage.get("completion_tokens"),
        "cached_tokens": s.cached_prompt_tokens,
        "intended_ns": intended,
        "send_ns": send,
        "schedule_delay_ns": None if send is None else send - intended,
        "headers_ns": _offset(s.t_headers_ns, t0_ns),
        "first_chunk_ns": _offset(s.first_token_ns, t0_ns),
        "last_chunk_ns": _offset(s.chunk_t_ns[-1] if s.chunk_t_ns else None, t0_ns),
        "done_ns": _offset(s.t_done_ns, t0_ns),
        "num_chunks": len(s.chunk_t_ns),
        "chunk_ns": [t - t0_ns for t in s.chunk_t_ns],
        "chunk_tokens": list(s.chunk_tokens),
        "tokens_from_usage": s.tokens_from_usage,
        "finish_reason": s.finish_reason,
        "status": rec.status,
        "http_status": s.status,
        "error": s.error,
    }


def trace_frame(result: SessionResult) -> pd.DataFrame:
    """One row per request (nullable integer columns stay integers)."""
    frame = pd.DataFrame([_row(r, result.t0_ns) for r in result.records], columns=list(TRACE_COLUMNS))
    for column in INT_COLUMNS:
        frame[column] = frame[column].astype("Int64")
    return frame


def _rate(times_ns: np.ndarray) -> float | None:
    """Events per second over the span of ``times_ns`` (None for fewer than two or a zero span)."""
    if times_ns.size < 2 or times_ns.max() <= times_ns.min():
        return None
    return float((times_ns.size - 1) / ((times_ns.max() - times_ns.min()) / 1e9))


def _percentile_ms(values: np.ndarray, q: float) -> float | None:
    return None if values.size == 0 else float(np.percentile(values, q) / 1e6)


def _health(outcome: StageOutcome, rows: pd.DataFrame) -> StageHealth:
    sent = rows[rows["send_ns"].notna()]
    delays = sent["schedule_delay_ns"].to_numpy(dtype=float)
    first_rounds = sent[sent["round_index"] == 0]
    achieved = _rate(first_rounds["send_ns"].to_numpy(dtype=float))
    scheduled = _rate(first_rounds["intended_ns"].to_numpy(dtype=float))
    p50 = _percentile_ms(delays, 50)
    problems = []
    if p50 is not None and p50 > SATURATION_DELAY_MS:
        problems.append(f"median schedule delay {p50:.1f} ms > {SATURATION_DELAY_MS:g} ms")
    p99 = _percentile_ms(delays, 99)
    if p99 is not None and p99 > SATURATION_DELAY_P99_MS:
        problems.append(f"schedule delay p99 {p99:.1f} ms > {SATURATION_DELAY_P99_MS:g} ms")
    if (
        outcome.in_flight_limit is None
        and achieved is not None
        and scheduled is not None
        and achieved < SATURATION_RATE_FRACTION * scheduled
    ):
        problems.append(
            f"sent {achieved:.1f} req/s < {SATURATION_RATE_FRACTION:.0%} of scheduled {scheduled:.1f}"
        )
    said = [f"load generator fell behind ({'; '.join(problems)})"] if problems else []
    if outcome.listen_overflows:
        said.append(
            f"this host dropped {outcome.listen_overflows} connection handshake(s) on a full accept queue: "
            "their requests waited 1 s or more for a retransmit (a listen backlog smaller than the stage's "
            "bursts of new connections)"
        )
    warning = f"stage {outcome.name!r}: {'; '.join(said)}" if said else None
    return StageHealth(
        name=outcome.name,
        warmup=outcome.warmup,
        scheduler=outcome.description,
        requested_rate=outcome.requested_rate,
        scheduled_rate=scheduled,
        achieved_rate=achieved,
        in_flight_limit=outcome.in_flight_limit,
        max_in_flight=outcome.max_in_flight,
        issued=len(rows),
        status_counts={str(k): int(v) for k, v in rows["status"].value_counts().items()},
        schedule_delay_p50_ms=p50,
        schedule_delay_p99_ms=p99,
        schedule_delay_max_ms=None if delays.size == 0 else float(delays.max() / 1e6),
        duration_s=(outcome.end_ns - outcome.start_ns) / 1e9,
        drain_cancelled=outcome.drain_cancelled,
        stopped=outcome.stopped,
        saturated=bool(problems),
        listen_overflows=outcome.listen_overflows,
        warning=warning,
    )


def stage_health(result: SessionResult, frame: pd.DataFrame | None = None) -> list[StageHealth]:
    """Health of every stage of ``result``."""
    frame = trace_frame(result) if frame is None else frame
    return [_health(o, frame[frame["stage"] == o.name]) for o in result.stages]


def _network(rtt_ms: list[float]) -> dict[str, Any]:
    if not rtt_ms:
        return {"rtt_ms": None, "note": "GET /v1/models got no answer: round-trip time not measured"}
    return {
        "rtt_ms": {"min": min(rtt_ms), "median": float(np.median(rtt_ms)), "max": max(rtt_ms)},
        "probes": len(rtt_ms),
        "method": "sequential GET /v1/models before the first stage",
    }


def write_trace(
    out_dir: str | Path,
    result: SessionResult,
    *,
    workload: dict[str, Any] | None = None,
    seed: int | None = None,
    prompts: dict[str, Any] | None = None,
    engine: dict[str, Any] | None = None,
    metrics: tuple[pd.DataFrame | None, dict[str, Any]] | None = None,
) -> TraceHeader:
    """Write ``header.json``, ``trace.parquet`` and ``trace.csv`` into ``out_dir``; returns the header.

    ``metrics``: the engine's /metrics series (``metrics_series.series_frame``) and what the header says of
    it (``series_header``); the series goes to ``metrics.csv``."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    frame = trace_frame(result)
    health = stage_health(result, frame)
    # A warm-up stage is not measured: engines run their first requests slowly (compilation, caches), so
    # its sends may fall behind (a 22.8 ms median delay after a CPU engine's start, 2026-11-29); its own
    # health keeps that, and the run is judged on the stages it measures.
    measured = [h for h in health if not h.warmup]
    header = TraceHeader(
        created_at=dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        session_start_unix_ns=result.started_unix_ns,
        session_start_perf_ns=result.t0_ns,
        workload=workload or {},
        seed=seed,
        prompts=prompts or {},
        engine=engine or {"base_url": result.settings.base_url, "model": result.settings.api.model},
        session=result.settings.model_dump(),
        loadgen={
            "python": platform.python_version(),
            "aiohttp": aiohttp.__version__,
            "pydantic": pydantic.VERSION,
            "host": platform.node(),
            "cpu_count": os.cpu_count(),
        },
        hardware=hardware_info(NvmlSource.gpu_names()),
        network=_network(result.rtt_ms),
        metrics={} if metrics is None else metrics[1],
        stages=health,
        saturated=any(h.saturated for h in measured),
        warnings=[h.warning for h in measured if h.warning],
    )
    write_trace_files(out, header, frame, series=None if metrics is None else metrics[0])
    return header
