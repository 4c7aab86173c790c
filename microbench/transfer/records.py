"""Result schema of the transfer benchmark: one ``TransferRecord`` per (mode, P, repetition).

A record keeps the client's and the proxy's stamps (``perf_counter_ns`` of one process), the phase
durations derived from them, the engines' own view (histogram-sum and counter deltas of ``/metrics``
around the request) and the KV-reuse proof on the consumer. Stored at
``runs/<mode>/P<p>_r<rep>.json`` (see ``microbench.transfer.folder``); versioned like every record
of the suite (``microbench.results.records``).
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from benchcore.schema import StrictModel as Record

__all__ = ["SCHEMA_VERSION", "EngineSide", "Mode", "Phases", "TransferRecord"]

SCHEMA_VERSION = 1
Mode = Literal["disaggregated", "colocated"]


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
    """One measured request: disaggregated (proxy, producer → consumer) or colocated (one engine)."""

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
    engine_log_tail: str | None = Field(None, description="tail of the failed engine's log")
    phases: Phases
    producer: EngineSide | None = Field(description="the producer (colocated: the one engine)")
    consumer: EngineSide | None = Field(description="None for colocated")
    cached_tokens_consumer: int | None = Field(
        description="consumer usage.prompt_tokens_details.cached_tokens"
    )
    cached_tokens_producer: int | None = Field(description="producer (or colocated) cached_tokens: 0 if cold")
    completion_tokens: int = Field(ge=0)
    stamps: dict[str, int | None] = Field(description="every perf_counter_ns stamp of the request")
    raw_file: str = Field(description="Parquet of every stamp incl. each stream chunk, relative to the run")
