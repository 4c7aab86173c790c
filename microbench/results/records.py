"""The stored objects of a sweep run (pydantic, strict, versioned) and how older versions are read.

The run-folder layout is ``microbench.results.layout``. Measured: ``Manifest``, ``Observation`` (one per
attempt), ``BaselineRecord`` (one per decode batch), with the stamps and scrapes beside them. Derived:
``RunRecord`` (seed 002's ``config``/``baseline``/``interference``/``derived`` sections and field names,
extended), written by ``microbench.results.derive`` from the measured objects.

Versioning: every object carries ``schema_version``. ``SCHEMA_VERSION`` is the one written; readers
accept every version listed in ``READABLE_VERSIONS`` and ``_upgrade`` brings an older one to the current
schema (version 1's derived fields are kept under names that say what they were).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, Field, ValidationError

from benchcore.schema import StrictModel
from engine_harness.step_model import Scheduling
from engine_harness.step_modes import StepMode
from engine_harness.steps import EngineStep

__all__ = [
    "READABLE_VERSIONS",
    "SCHEMA_VERSION",
    "Baseline",
    "BaselineRecord",
    "Derived",
    "Interference",
    "LocalBaseline",
    "Manifest",
    "Observation",
    "ProtocolRules",
    "RunConfig",
    "RunRecord",
    "ShardRun",
    "UnreadableRecord",
    "Validity",
    "point_name",
    "read_record",
]

SCHEMA_VERSION = 2
READABLE_VERSIONS = (1, 2)


class RunConfig(StrictModel):
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
    scheduling: Scheduling | None = Field(
        None,
        description="how prefill steps treat the running decodes: 'mixed' (they ride in every prefill "
        "step: vLLM, SGLang --enable-mixed-chunk) or 'exclusive' (a prefill step runs instead of the "
        "decode step: SGLang's default); None in records written before this field",
    )


class Baseline(StrictModel):
    """Decode-only inter-token latency of the (chunk, D) batch (seed 002 Phase 1), token-weighted."""

    tpot_p50_ms: float | None
    tpot_p90_ms: float | None
    tpot_p99_ms: float | None
    n_gaps: int = Field(ge=0)


class LocalBaseline(StrictModel):
    """The last gaps of every stream right before this injection: the one baseline of every derived field
    of the point (decode context grows while a batch is reused, so the batch's Phase 1 baseline drifts)."""

    tpot_p50_ms: float | None = Field(description="token-weighted median of the local gaps")
    tpot_p90_ms: float | None
    n_gaps: int = Field(ge=0)
    context_tokens: float | None = Field(
        None, description="mean tokens in each decode stream's context at the send (prefix + generated)"
    )


class Interference(StrictModel):
    """What happened while the prefill ran (seed 002 Phase 2, extended). Client-side percentiles weight
    every decode token once (a read carrying 3 tokens counts 3 times, each at a third of its gap)."""

    tpot_during_prefill_p50_ms: float | None = Field(
        description="seed 002: median decode gap ending between the send and the first token, pooled over "
        "streams, token-weighted. A window of a few engine steps also holds decode-only steps that ran "
        "while the request was being received, so it flips between a decode gap and a mixed step's"
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
    full_chunk_steps: int | None = Field(
        None, description="prefill steps that carried chunk − D prompt tokens"
    )
    step_time_full_chunk_ms: float | None = Field(None, description="median full-chunk step (engine log)")
    step_time_last_chunk_ms: float | None = Field(
        None, description="the last prefill step when it carried fewer tokens than a full chunk (engine log)"
    )
    decode_step_ms: float | None = Field(
        None, description="median decode-only engine step right before the first prefill step (engine log): "
        "the engine's local baseline of the per-step penalty"
    )  # fmt: skip
    attempt_decode_step_ms: float | None = Field(
        None, description="median of every decode-only engine step at its D in the attempt (engine log)"
    )
    attempt_decode_steps: int | None = Field(None, description="decode-only steps in attempt_decode_step_ms")
    engine_prefill_ms: float | None = Field(None, description="Σ of the prefill-carrying steps (engine log)")
    engine_queue_ms: float | None = Field(
        None, description="the engine's queue time of the injection (/metrics)"
    )
    engine_prefill_time_ms: float | None = Field(
        None, description="the engine's prefill time of the injection: scheduled → first token (/metrics)"
    )
    frontend_ms: float | None = Field(
        None, description="prefill_duration − engine queue − engine prefill time: request serialization, the "
        "API server's parsing and hand-off, and the first token's way back"
    )  # fmt: skip
    client_lag_max_ms: float | None = Field(
        None, description="the client's worst event-loop lag from the local baseline to the recovery's end"
    )
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
        description="every engine step from the injection's first to its last prefill step, in order "
        "(empty when the engine does not report steps)",
    )
    step_mode: StepMode | None = Field(
        None, description="how the engine ran its steps and where engine_steps_log's durations came from"
    )


class Derived(StrictModel):
    """The figures a user acts on. Baseline: the local one (``LocalBaseline``) for every field.

    ``tpot_penalty_ms`` is the extra time a decode token waits on a step that carries a *full* prefill
    chunk, from the engine's own step record (full-chunk step − decode-only step); a tiny last chunk is
    reported apart (``penalty_last_step_ms``) so it does not dilute it. Seed 002's identity
    ``aggregate delay = D × Σ per-step penalties`` is kept as a check (``identity_check`` ≈ 1). Without a
    step record the penalty is solved from the identity (``penalty_source = "identity"``).
    """

    tpot_penalty_ms: float | None = Field(description="extra ms per decode token per full-chunk prefill step")
    penalty_source: Literal["engine_steps", "identity", "none"] = "none"
    penalty_last_step_ms: float | None = Field(None, description="the same for a partial last chunk step")
    tpot_during_prefill_ms: float | None = Field(
        description="local baseline p50 + tpot_penalty_ms: the TPOT a decode sees on a full-chunk step"
    )
    penalty_ratio: float | None = Field(description="tpot_during_prefill_ms / local baseline p50")
    tpot_penalty_p50_ms: float | None = Field(description="seed 002's window median − local baseline p50")
    tpot_penalty_ratio: float | None = Field(description="seed 002's window median / local baseline p50")
    penalty_identity_ms: float | None = Field(
        None, description="aggregate_decode_delay / (D × num_chunks_used): every prefill step alike"
    )
    identity_check: float | None = Field(
        None, description="aggregate_decode_delay / (D × Σ per-step penalties of the engine's record)"
    )
    num_chunks_used: int | None = Field(None, description="the prefill step count the penalty was divided by")
    chunks_note: str | None = Field(None, description="why num_chunks_used differs from the measured count")
    total_interference_ms: float | None = Field(
        description="Σ per-step penalties: the delay one decode stream took from the prefill"
    )
    decode_tokens_delayed: int = Field(description="D × num_chunks_used")
    aggregate_decode_delay_ms: float | None = Field(
        description="Σ over streams of Σ (gap − local baseline p50 × tokens) over the gaps ending between "
        "send and first token: the measured counterpart of D × Σ per-step penalties"
    )


class Validity(StrictModel):
    valid: bool
    reasons: list[str] = Field(default_factory=list)
    attempt: int = Field(ge=0)


class ProtocolRules(StrictModel):
    """Seed 002's measurement rules: the live protocol waits by them and ``derive`` judges by them."""

    steady_min_tokens: int = Field(32, ge=2, description="tokens every stream must have before measuring")
    steady_window: int = Field(8, ge=2, description="last gaps that must agree for steady state")
    steady_ratio: float = Field(2.0, gt=1, description="max/min of those gaps")
    discard_tokens: int = Field(16, ge=0, description="first tokens of each stream never used")
    baseline_gaps: int = Field(32, ge=4, description="gaps per stream in the Phase 1 baseline")
    local_gaps: int = Field(8, ge=2, description="gaps per stream right before each injection")
    recovery_gaps: int = Field(16, ge=1, description="gaps per stream after the prefill's first token")
    steady_timeout_s: float = Field(300, gt=0)
    injection_timeout_s: float = Field(900, gt=0)
    idle_timeout_s: float = Field(120, gt=0)


class Observation(StrictModel):
    """What the live protocol saw of one attempt beyond the stamps in ``raw_file``: the inputs of
    ``microbench.results.derive`` together with the stamps, the batch's baseline and the scrapes."""

    schema_version: int = SCHEMA_VERSION
    run_id: str
    config: RunConfig
    attempt: int = Field(ge=0)
    t_inject_ns: int = Field(description="perf_counter_ns at the injection's send")
    t_first_token_ns: int | None = Field(description="the injection's first token; None: it never came")
    prompt_tokens: int | None = Field(description="usage.prompt_tokens of the injection")
    cached_prompt_tokens: int | None = Field(description="usage cached_tokens of the injection")
    engine_steps: list[EngineStep] | None = Field(
        description="every engine step from the mark before the injection to the end of its recovery "
        "window; None: the engine reports no steps"
    )
    step_mode: StepMode | None = Field(
        None, description="how the engine ran its steps (as it stated at start-up) and where their durations "
        "came from; None: no step source, or written before this field"
    )  # fmt: skip
    notes: list[str] = Field(
        default_factory=list, description="what failed live (request error, timeout, a stream that broke)"
    )
    decode_failure: str | None = Field(None, description="why a decode stream had stopped, if one had")
    client_lag_max_ms: float | None = Field(
        None, description="the client's worst event-loop lag from the local baseline to the recovery's end"
    )
    baseline_file: str | None = Field(description="BaselineRecord of the decode batch (None for D = 0)")
    raw_file: str | None = Field(description="Parquet of stamps, relative to the run folder")
    metrics_file: str | None = Field(description="the /metrics scrapes before and after")


class RunRecord(StrictModel):
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


class BaselineRecord(StrictModel):
    """Phase 1 of one (chunk, D): measured once per decode batch."""

    schema_version: int = SCHEMA_VERSION
    run_id: str
    chunk_size: int
    decode_batch_size: int
    batch_index: int = Field(ge=0, description="which decode batch of this (chunk, D) it belongs to")
    baseline: Baseline
    steady_after_ms: float = Field(description="from the batch's start until steady state held")
    raw_file: str


class ShardRun(StrictModel):
    """Where and how one shard of a run (one chunk size) ran, once per execution (a resumed shard adds
    another): the executor writes it when the shard starts and again when it ends (DESIGN §7)."""

    chunk: int
    part: str | None = Field(None, description="its D values, where the chunk size was split (``D2_8``)")
    executor: Literal["local", "ray"]
    host: str
    node_id: str | None = Field(None, description="the Ray node it ran on")
    pid: int | None = Field(None, description="the process that ran the shard (a Ray worker)")
    device: str = Field(description="what measured: GPU ids and names, or the CPU cores it owned")
    gpus: list[str] = Field(default_factory=list, description="CUDA_VISIBLE_DEVICES of the shard")
    cores: list[int] = Field(default_factory=list, description="the cores the shard and its engine ran on")
    cores_exclusive: bool = Field(description="no other shard of the run could run on these cores/GPUs")
    engine_version: str | None = None
    code: str | None = Field(
        None, description="the code the shard ran: package version @ git commit (+ uncommitted changes)"
    )
    driver_code: str | None = Field(
        None, description="the code of the process that ran the job; a shard whose code differs is refused"
    )
    started_utc: str
    wall_s: float | None = Field(None, description="from the shard's start to its end (None: running)")
    points: int = Field(0, description="points of the shard that became final in this execution")
    outcome: str = Field("running", description="running, done, stopped, or failed: <why>")


class Manifest(StrictModel):
    """Everything needed to know what a run was and to reproduce it."""

    schema_version: int = SCHEMA_VERSION
    job: str | None = Field(
        None,
        description="the job that wrote the folder (sweep, transfer, battery; microbench.results.layout); "
        "None: written before manifests named their job",
    )
    run_id: str
    created_utc: str
    sweep: dict[str, Any] = Field(description="the resolved, validated job definition")
    engine_spec: dict[str, Any]
    engine_argv: dict[str, list[str]] = Field(default_factory=dict, description="per chunk size")
    engine_version: str | None
    metric_names: str | None = Field(
        None,
        description="the metric table the run read /metrics with (engine_harness.metric_names.METRIC_TABLES; "
        "an external engine's is what it serves); None: its engine kind's",
    )
    warmup: dict[str, dict[str, Any]] = Field(
        default_factory=dict, description="per chunk size: probe latencies (ms) and whether they settled"
    )
    step_modes: dict[str, StepMode] = Field(
        default_factory=dict, description="per chunk size: how the engine ran its steps, as it stated at "
        "start-up, and where step durations come from (engine_harness.step_modes)"
    )  # fmt: skip
    hardware: dict[str, Any]
    packages: dict[str, str]
    git_commit: str | None
    seed: int
    notes: list[str] = Field(default_factory=list)
    shards: list[ShardRun] = Field(
        default_factory=list, description="every execution of every shard: host, device, placement, wall time"
    )


def point_name(decode_batch: int, prefill_tokens: int, repetition: int) -> str:
    return f"D{decode_batch}_P{prefill_tokens}_r{repetition}"


M = TypeVar("M", bound=BaseModel)


def _upgrade(data: dict[str, Any]) -> dict[str, Any]:
    """Bring an older stored object to the current schema; version 1's derived fields meant otherwise:
    its penalty was the identity solution over every prefill step against the local baseline, its ratio
    divided by the batch's baseline. They are kept under the names that say so, never as today's."""
    version = data.get("schema_version")
    if version == 1 and "derived" in data:
        data = json.loads(json.dumps(data))
        if data.get("baseline"):
            data["baseline"].pop("step_time_ms", None)
        itf, der = data["interference"], data["derived"]
        itf.pop("step_time_mixed_ms", None)
        old_penalty = der.pop("tpot_penalty_ms", None)
        der.pop("local_penalty_p50_ms", None)
        der.update(tpot_penalty_ms=None, penalty_identity_ms=old_penalty, tpot_during_prefill_ms=None,
                   penalty_ratio=None, tpot_penalty_ratio=None, tpot_penalty_p50_ms=None)  # fmt: skip
        data["schema_version"] = 2
    elif version == 1 and "baseline" in data:
        data = {**data, "baseline": {k: v for k, v in data["baseline"].items() if k != "step_time_ms"}}
        data["schema_version"] = 2
    elif version == 1:
        data = {**data, "schema_version": 2}
    return data


class UnreadableRecord(ValueError):
    """A stored file that is no record this suite reads; the message names the file and why."""


def read_record(path: Path, model: type[M]) -> M:
    """Load a stored record of any readable schema version as the current model (``UnreadableRecord``:
    not JSON, not UTF-8, no or an unknown ``schema_version``, or not a valid ``model``)."""
    name = model.__name__
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise UnreadableRecord(f"{path} is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise UnreadableRecord(f"{path} is not a stored {name} (a JSON object)")
    version = data.get("schema_version")
    if version not in READABLE_VERSIONS:
        which = "names no schema_version" if version is None else f"has schema_version {version!r}"
        raise UnreadableRecord(
            f"{path} {which}; this suite reads versions {', '.join(map(str, READABLE_VERSIONS))} of a "
            f"{name} (a file of another version of the suite, or not one of its records)"
        )
    try:
        return model.model_validate(_upgrade(data))
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors()[:3])
        more = f" (and {exc.error_count() - 3} more)" if exc.error_count() > 3 else ""
        raise UnreadableRecord(f"{path} is not a valid {name} (v{version}): {problems}{more}") from None
