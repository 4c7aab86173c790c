"""Result schemas of the interference sweep (pydantic, strict, versioned) and atomic read/write.

A run folder ``results/<run-id>/`` holds ``manifest.json`` (``Manifest``), one ``RunRecord`` per
measured point at ``runs/<chunk>/D<d>_P<p>_r<rep>.json`` (the valid attempt, or the last invalid one
once retries are spent), every invalid attempt under ``invalid/``, one ``BaselineRecord`` per (chunk, D)
at ``baselines/<chunk>/D<d>.json``, raw stamps under ``raw/`` (Parquet) and metric scrapes under
``metrics/``. The per-point record keeps seed 002's ``config``/``baseline``/``interference``/``derived``
sections and field names, and extends them.

Versioning: every record carries ``schema_version``. ``SCHEMA_VERSION`` is the one written; readers
accept every version listed in ``READABLE_VERSIONS`` (update both on a breaking change, and add the
upgrade step to ``_upgrade``).
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field

__all__ = [
    "READABLE_VERSIONS",
    "SCHEMA_VERSION",
    "Baseline",
    "BaselineRecord",
    "Derived",
    "EngineStep",
    "Interference",
    "LocalBaseline",
    "Manifest",
    "Record",
    "RunConfig",
    "RunRecord",
    "Validity",
    "atomic_write_bytes",
    "point_name",
    "read_record",
    "write_record",
]

SCHEMA_VERSION = 1
READABLE_VERSIONS = (1,)


class Record(BaseModel):
    """Base of every stored object: unknown keys are an error, not silently dropped."""

    model_config = ConfigDict(extra="forbid")


class RunConfig(Record):
    """What was measured (seed 002 ``config``, extended)."""

    decode_batch_size: int = Field(ge=0, description="D: decode streams running during the injection")
    new_prefill_tokens: int = Field(gt=0, description="P: tokens of the injected cold prompt")
    chunk_size: int = Field(gt=0, description="engine token budget per step (max-num-batched-tokens)")
    model: str
    gpu: str = Field(description="accelerator name, or the CPU model where there is none")
    repetition: int = Field(ge=0)
    engine: str = Field(description="engine kind and version, e.g. 'vllm 0.32.0'")
    decode_context: int = Field(ge=0, description="prompt tokens of each decode stream (shared prefix)")
    decode_max_tokens: int = Field(ge=0, description="max_tokens of each decode stream")
    scheduling: Literal["mixed", "exclusive"] | None = Field(
        None,
        description="how prefill steps treat the running decodes: 'mixed' (they ride in every prefill "
        "step: vLLM, SGLang --enable-mixed-chunk) or 'exclusive' (a prefill step runs instead of the "
        "decode step: SGLang's default); None in records written before this field",
    )


class Baseline(Record):
    """Decode-only inter-token latency of the (chunk, D) batch (seed 002 Phase 1)."""

    tpot_p50_ms: float | None
    tpot_p90_ms: float | None
    tpot_p99_ms: float | None
    step_time_ms: float | None = Field(description="median decode-only engine step (engine log), if logged")
    n_gaps: int = Field(ge=0)


class LocalBaseline(Record):
    """The last gaps of every stream right before this injection (drift-proof reference)."""

    tpot_p50_ms: float | None
    tpot_p90_ms: float | None
    n_gaps: int = Field(ge=0)


class EngineStep(Record):
    """One engine step as the engine itself reported it (vLLM's per-iteration log, or the sim's)."""

    prefill_tokens: int = Field(ge=0, description="context (prompt) tokens computed in the step")
    decode_tokens: int = Field(ge=0, description="generation tokens computed in the step")
    prefill_requests: int = Field(ge=0)
    decode_requests: int = Field(ge=0)
    elapsed_ms: float | None = Field(
        ge=0, description="the step's duration; None where the engine did not report it (SGLang: the "
        "first step after the mark, whose start is not logged)"
    )


class Interference(Record):
    """What happened while the prefill ran (seed 002 Phase 2, extended)."""

    tpot_during_prefill_p50_ms: float | None = Field(
        description="seed 002: median decode gap ending between the send and the first token, pooled over "
        "streams. In a window of a few engine steps it flips between a decode-only gap (steps that ran "
        "while the request was still being received) and a mixed step's: see Derived.tpot_penalty_ms"
    )
    tpot_during_prefill_p90_ms: float | None
    tpot_during_prefill_max_ms: float | None
    tpot_after_prefill_p50_ms: float | None
    num_chunks_actual: int | None = Field(
        description="prefill-carrying engine steps (step log, else histogram)"
    )
    num_chunks_source: Literal["engine_log", "histogram", "none"]
    num_chunks_expected: int = Field(description="ceil(P / (chunk − D)): vLLM's budget after D decode tokens")
    engine_steps: int | None = Field(description="engine steps between the scrapes around the injection")
    step_time_mixed_ms: float | None = Field(description="median prefill-carrying step time (engine log)")
    prefill_duration_ms: float | None = Field(description="send → first token of the injected request")
    prefill_ttft_ms: float | None
    n_gaps_during: int = Field(ge=0)
    max_tokens_per_read: int = Field(
        0, ge=0, description="most decode tokens one read carried around the window (>1: delivery stalled)"
    )
    recovery_gaps_ms: list[float] = Field(description="every stream's gaps after the first token, in order")
    prefix_cache_hits: float | None = Field(description="prefix-cache hit tokens during the injection")
    prefix_cache_queries: float | None
    cached_prompt_tokens: int | None = Field(description="the injection's own usage.cached_tokens")
    preemptions: float | None
    engine_steps_log: list[EngineStep] = Field(
        default_factory=list,
        description="every engine step from the injection's send to its first token, in order "
        "(empty when the engine does not report steps)",
    )


class Derived(Record):
    """Seed 002 ``derived`` fields, and the penalty per prefill step from the measured aggregate delay.

    Seed 002's identity is ``total delay = num_chunks × D × penalty``. The aggregate delay is measured
    (every stream, every gap of the window, against the local baseline), ``num_chunks`` is counted by
    the engine, so ``tpot_penalty_ms`` solves the identity for the penalty: the extra time each decode
    token waited per step that carried the prefill. Unlike the seed's window median it does not depend
    on how many decode-only steps fell into the window, so it repeats (CV per cell in the run summary).
    """

    tpot_penalty_ms: float | None = Field(
        description="aggregate_decode_delay / (D × num_chunks): extra ms per decode token per prefill step"
    )
    tpot_during_prefill_ms: float | None = Field(
        description="baseline p50 + tpot_penalty_ms: the TPOT a decode sees on a step carrying the prefill"
    )
    penalty_ratio: float | None = Field(description="tpot_during_prefill_ms / baseline p50")
    tpot_penalty_p50_ms: float | None = Field(description="seed 002: window p50 − baseline p50")
    tpot_penalty_ratio: float | None = Field(description="seed 002: window p50 / baseline p50")
    local_penalty_p50_ms: float | None = Field(description="window p50 − local baseline p50")
    total_interference_ms: float | None = Field(
        description="num_chunks × tpot_penalty_ms: the delay one decode stream took from the prefill"
    )
    decode_tokens_delayed: int = Field(description="D × num_chunks")
    aggregate_decode_delay_ms: float | None = Field(
        description="Σ over streams of Σ (gap − local baseline p50) over the gaps ending between send and "
        "first token: the measured counterpart of num_chunks × D × penalty"
    )


class Validity(Record):
    valid: bool
    reasons: list[str] = Field(default_factory=list)
    attempt: int = Field(ge=0)


class RunRecord(Record):
    """One measured point (chunk, D, P, repetition)."""

    schema_version: int = SCHEMA_VERSION
    run_id: str
    config: RunConfig
    baseline: Baseline | None = Field(description="None for D = 0 (no decodes)")
    local_baseline: LocalBaseline | None
    interference: Interference
    derived: Derived
    validity: Validity
    t_inject_ns: int = Field(description="perf_counter_ns at the injection's send")
    t_first_token_ns: int
    raw_file: str = Field(description="Parquet with every stamp, relative to the run folder")


class BaselineRecord(Record):
    """Phase 1 of one (chunk, D): measured once per decode batch."""

    schema_version: int = SCHEMA_VERSION
    run_id: str
    chunk_size: int
    decode_batch_size: int
    batch_index: int = Field(ge=0, description="which decode batch of this (chunk, D) it belongs to")
    baseline: Baseline
    steady_after_ms: float = Field(description="from the batch's start until steady state held")
    raw_file: str


class Manifest(Record):
    """Everything needed to know what a run was and to reproduce it."""

    schema_version: int = SCHEMA_VERSION
    run_id: str
    created_utc: str
    sweep: dict[str, Any] = Field(description="the resolved, validated sweep definition")
    engine_spec: dict[str, Any]
    engine_argv: dict[str, list[str]] = Field(default_factory=dict, description="per chunk size")
    engine_version: str | None
    warmup: dict[str, dict[str, Any]] = Field(
        default_factory=dict, description="per chunk size: probe latencies (ms) and whether they settled"
    )
    hardware: dict[str, Any]
    packages: dict[str, str]
    git_commit: str | None
    seed: int
    notes: list[str] = Field(default_factory=list)


def point_name(decode_batch: int, prefill_tokens: int, repetition: int) -> str:
    return f"D{decode_batch}_P{prefill_tokens}_r{repetition}"


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write via a temporary file in the same folder and ``os.replace``: never a half-written file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_record(path: Path, record: BaseModel) -> None:
    atomic_write_bytes(path, (record.model_dump_json(indent=2) + "\n").encode())


M = TypeVar("M", bound=BaseModel)


def _upgrade(data: dict[str, Any]) -> dict[str, Any]:
    """Bring an older record to the current schema (only version 1 exists so far)."""
    version = data.get("schema_version")
    if version not in READABLE_VERSIONS:
        raise ValueError(f"schema_version {version!r} is not one this suite reads ({READABLE_VERSIONS})")
    return data


def read_record(path: Path, model: type[M]) -> M:
    """Load a stored record of any readable schema version as the current model."""
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path} is not valid JSON: {exc}") from exc
    return model.model_validate(_upgrade(data))
