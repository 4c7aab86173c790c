"""Result schema of the transfer benchmark: one ``TransferRecord`` per (mode, P, repetition).

A record keeps the client's and the proxy's stamps (``perf_counter_ns`` of one process), the phase
durations derived from them, the engines' own view (histogram-sum and counter deltas of ``/metrics``
around the request) and the KV-reuse proof on the consumer. Stored at
``runs/<mode>/P<p>_r<rep>.json`` (written by the transfer job through ``results.layout.TransferFolder``);
read by ``analysis.transfer`` through ``records_frame``; versioned like every record of the suite
(``microbench.results.records``).
"""

from __future__ import annotations

from typing import Literal

import pandas as pd
from pydantic import Field

from benchcore.schema import StrictModel as Record

__all__ = ["SCHEMA_VERSION", "EngineSide", "Mode", "Phases", "TransferRecord", "records_frame"]

SCHEMA_VERSION = 1  # additive since: mode "alone", field hung (default False); v1 records load as they are
Mode = Literal["disaggregated", "colocated", "alone"]


class Phases(Record):
    """Client-side phase durations in ms (None where the phase did not happen or did not finish)."""

    total_ttft_ms: float | None = Field(description="client send → first token at the client")
    producer_ms: float | None = Field(description="proxy → producer → its answer (prefill + 1 token)")
    proxy_gap_ms: float | None = Field(description="producer's answer → consumer request sent")
    consumer_ttft_ms: float | None = Field(
        description="consumer request sent → its first token at the proxy (KV load + first decode step)"
    )
    handoff_ms: float | None = Field(
        description="producer's answer → first token at the proxy: everything disaggregation adds "
        "after the prefill (proxy gap + KV transfer + consumer's first step)"
    )
    client_overhead_ms: float | None = Field(
        description="total TTFT − producer − handoff: client↔proxy legs and the proxy's own work"
    )


class EngineSide(Record):
    """One engine's own account of the request, from /metrics deltas (None: metric absent)."""

    queue_ms: float | None = Field(description="Δ sum of vllm:request_queue_time_seconds")
    prefill_ms: float | None = Field(description="Δ sum of vllm:request_prefill_time_seconds")
    ttft_ms: float | None = Field(description="Δ sum of vllm:time_to_first_token_seconds")
    prompt_tokens: float | None = Field(description="Δ vllm:prompt_tokens_total (prompt tokens it received)")
    tokens_local_compute: float | None = Field(description="Δ prompt_tokens_by_source{local_compute}")
    tokens_local_cache_hit: float | None = Field(description="Δ prompt_tokens_by_source{local_cache_hit}")
    tokens_external: float | None = Field(description="Δ prompt_tokens_by_source{external_kv_transfer}")
    kv_xfer_ms: float | None = Field(description="Δ sum of the connector's transfer-time histogram")
    kv_xfer_count: float | None = Field(description="Δ count of that histogram (transfers)")
    kv_post_ms: float | None = Field(description="Δ sum of the connector's post-time histogram")
    kv_bytes: float | None = Field(description="Δ sum of the connector's bytes-transferred histogram")


class TransferRecord(Record):
    """One measured request: disaggregated (proxy, producer → consumer), colocated (the producer, its
    connector peer idling beside it) or alone (the same engine started with no connector and no peer)."""

    schema_version: int = SCHEMA_VERSION
    run_id: str
    mode: Mode
    prefill_tokens: int = Field(gt=0, description="P: tokens of the cold prompt")
    repetition: int = Field(ge=0)
    connector: str
    decode_tokens: int = Field(ge=1)
    valid: bool
    reasons: list[str] = Field(default_factory=list, description="why the point is invalid or failed")
    failed_phase: str | None = Field(None, description="producer / consumer / client, when it failed")
    hung: bool = Field(False, description="the failed phase's engine made no progress for the stall timeout")
    engine_log_tail: str | None = Field(None, description="tail of the failed engine's log")
    phases: Phases
    producer: EngineSide | None = Field(description="the producer (colocated, alone: the one engine)")
    consumer: EngineSide | None = Field(description="None for colocated")
    cached_tokens_consumer: int | None = Field(
        description="consumer usage.prompt_tokens_details.cached_tokens"
    )
    cached_tokens_producer: int | None = Field(description="producer (or colocated) cached_tokens: 0 if cold")
    completion_tokens: int = Field(ge=0)
    stamps: dict[str, int | None] = Field(description="every perf_counter_ns stamp of the request")
    raw_file: str = Field(description="Parquet of every stamp incl. each stream chunk, relative to the run")


def _transfer_side(row: dict[str, object]) -> dict[str, object]:
    """The connector's own transfer time and bytes from the engine that counted the transfer (its
    histogram's count grew): the consumer (pull: it reads) or else the producer (push: it writes); which
    one is said in ``kv_xfer_side``. An engine whose count did not grow measured nothing (not 0 ms)."""
    for side in ("consumer", "producer"):
        xfer, count = row.get(f"{side}_kv_xfer_ms"), row.get(f"{side}_kv_xfer_count")
        counted = isinstance(count, int | float) and not pd.isna(count) and count > 0  # a 0 is no transfer
        if xfer is not None and counted and row.get("mode") == "disaggregated":
            return {"kv_xfer_ms": xfer, "kv_bytes": row.get(f"{side}_kv_bytes"), "kv_xfer_side": side}
    return {"kv_xfer_ms": None, "kv_bytes": None, "kv_xfer_side": None}


def records_frame(records: list[TransferRecord]) -> pd.DataFrame:
    """One row per record: the phases, both engines' sides (prefixed) and the KV-reuse evidence."""
    rows = []
    for r in records:
        row: dict[str, object] = {
            "mode": r.mode,
            "prefill_tokens": r.prefill_tokens,
            "repetition": r.repetition,
            "connector": r.connector,
            "valid": r.valid,
            "failed_phase": r.failed_phase,
            "hung": r.hung,
            **r.phases.model_dump(),
            "cached_tokens_consumer": r.cached_tokens_consumer,
            "cached_tokens_producer": r.cached_tokens_producer,
            "completion_tokens": r.completion_tokens,
            "reasons": "; ".join(r.reasons),
        }
        for side in ("producer", "consumer"):
            values = getattr(r, side)
            for key, value in (values.model_dump() if values is not None else {}).items():
                # the engine's own TTFT must not overwrite the client-side phase consumer_ttft_ms
                row[f"{side}_engine_ttft_ms" if key == "ttft_ms" else f"{side}_{key}"] = value
        row |= _transfer_side(row)
        rows.append(row)
    frame = pd.DataFrame(rows)
    if not frame.empty:
        frame = frame.sort_values(["mode", "prefill_tokens", "repetition"], kind="stable")
    return frame.reset_index(drop=True)
