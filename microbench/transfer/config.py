"""The transfer benchmark's definition: the P grid, the connector, the two engines, validated as one object.

The connector is a preset of ``engine_harness.kv_connectors`` (``engine_harness/connectors/<name>.yaml``).
``TransferConfig`` flows defaults → ``sweeps/transfer-<name>.yaml`` → command-line flags, and is stored
resolved in the run's manifest.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from benchcore.layered_config import load_layered
from benchcore.schema import FolderName, StrictModel
from engine_harness.engines import EngineSpec
from engine_harness.kv_connectors import ConnectorPreset
from engine_harness.settings import EngineSettings
from microbench.measure.engine_pair import connector_preset, worker_spec
from microbench.results.transfer import Mode

__all__ = ["TransferConfig", "TransferConfigError", "load_transfer_config"]


class TransferConfigError(ValueError):
    """The transfer definition is invalid; the message says where and why."""


class TransferConfig(StrictModel):
    """One transfer-lifecycle run: the P grid, the connector, the two engines, the timeouts."""

    name: FolderName = "cli"
    prefill_tokens: list[int] = Field(
        default_factory=lambda: [1024, 2048, 4096, 8192, 16384], min_length=1, description="P grid"
    )
    repetitions: int = Field(3, ge=1, le=1000)
    colocated: bool = Field(
        True, description="also measure the same P on the producer alone while its connector peer idles"
    )
    alone: bool = Field(
        True,
        description="also measure the same P on the producer's engine started alone (no connector, no peer, "
        "same cores): the uncontended baseline the contention factor divides by",
    )
    connector: str = Field("nixl-cpu", description="a preset in engine_harness/connectors/")
    decode_tokens: int = Field(4, ge=1, description="max_tokens of the request (consumer decodes them)")
    warmup_tokens: int = Field(256, ge=1, description="P of the unrecorded warm-up hand-off")
    producer_chunk: int | None = Field(
        None,
        gt=0,
        description="producer token budget; default: the preset's, or ≥ max P if it must not chunk",
    )
    consumer_chunk: int | None = Field(None, gt=0, description="consumer token budget (default: preset's)")
    producer_cores: str | None = Field("0", description="VLLM_CPU_OMP_THREADS_BIND of the producer")
    consumer_cores: str | None = Field("1", description="VLLM_CPU_OMP_THREADS_BIND of the consumer")
    pin_engine_threads: bool = Field(
        True,
        description="after start-up, pin every thread of each engine's processes (API server, engine "
        "core, worker) to its cores: VLLM_CPU_OMP_THREADS_BIND pins only the compute threads, and the "
        "rest (busy-polling while requests run) otherwise lands on the other engine's core",
    )
    token_range: str | None = Field(None, description="LO:HI ids for prompts; default: from the model")
    producer_args: list[str] = Field(default_factory=list, description="extra argv of the producer only")
    consumer_args: list[str] = Field(
        default_factory=list, description="extra argv of the consumer only (e.g. a sim fault)"
    )
    engine: EngineSettings = Field(
        default_factory=EngineSettings, description="engine settings: preset plus EngineSpec fields"
    )
    pause_s: float = Field(
        0.5, ge=0, description="idle time before each point, so the previous hand-off's bookkeeping is done"
    )
    phase_timeout_s: float = Field(
        600,
        gt=0,
        description="per phase of one request (producer leg, consumer leg); the client waits longer",
    )
    stall_timeout_s: float = Field(
        60,
        gt=0,
        description="an engine making no progress (no /metrics answer, no counter moving, no byte "
        "streamed) this long is hung: the point fails blaming it and the run stops",
    )
    idle_sample_s: float = Field(5, ge=0, description="idle CPU of each engine is sampled this long (0: not)")
    spinners: Literal["leave", "sched-idle"] = Field(
        "leave",
        description="threads that burn over half a core while their engine is idle (NIXL's UCX progress "
        "thread polls with a zero timeout): leave them, or move them to SCHED_IDLE after the idle sample",
    )
    startup_timeout_s: float = Field(900, gt=0)

    @field_validator("prefill_tokens")
    @classmethod
    def _sorted_unique(cls, v: list[int]) -> list[int]:
        if any(x <= 0 for x in v):
            raise ValueError(f"prefill lengths must be > 0, got {v}")
        return sorted(set(v))

    @model_validator(mode="after")
    def _check(self) -> TransferConfig:
        preset = self.connector_preset()
        _check_model_length(self)
        chunk = self.producer_spec().chunk_size
        if preset.producer_must_not_chunk and chunk is not None and chunk < max(self.prefill_tokens):
            raise ValueError(
                f"connector {preset.name!r} breaks when the producer chunks the prompt: producer_chunk "
                f"{chunk} < largest P {max(self.prefill_tokens)} (leave producer_chunk unset)"
            )
        return self

    def connector_preset(self) -> ConnectorPreset:
        return connector_preset(self.connector)

    def producer_spec(self) -> EngineSpec:
        chunk = self.producer_chunk
        if chunk is None and self.connector_preset().producer_must_not_chunk:
            base = worker_spec(self.engine, None, None).chunk_size or 0
            chunk = max(base, max(self.prefill_tokens), self.warmup_tokens)
        spec = worker_spec(self.engine, chunk, self.producer_cores)
        return spec.model_copy(update={"extra_args": [*spec.extra_args, *self.producer_args]})

    def consumer_spec(self) -> EngineSpec:
        spec = worker_spec(self.engine, self.consumer_chunk, self.consumer_cores)
        return spec.model_copy(update={"extra_args": [*spec.extra_args, *self.consumer_args]})

    def pair_modes(self) -> list[Mode]:
        return ["disaggregated", "colocated"] if self.colocated else ["disaggregated"]

    def points(self) -> list[tuple[Mode, int, int]]:
        """(mode, P, repetition) in measuring order: the engine pair's points (per repetition, per P,
        disaggregated then colocated), then the lone engine's."""
        grid = [(r, p) for r in range(self.repetitions) for p in self.prefill_tokens]
        pair = [(m, p, r) for r, p in grid for m in self.pair_modes()]
        return pair + ([("alone", p, r) for r, p in grid] if self.alone else [])


def model_max_len(spec: EngineSpec) -> tuple[int | None, str]:
    """The longest prompt + completion the engine serves (the smaller of its ``max_model_len`` and the
    model's ``max_position_embeddings``), and where that number comes from."""
    limits: list[tuple[int, str]] = []
    if spec.max_model_len is not None:
        limits.append((spec.max_model_len, "the engine's max_model_len"))
    cfg_path = Path(spec.model) / "config.json"
    if cfg_path.is_file():  # a local model folder: every launched engine enforces its positions
        positions = json.loads(cfg_path.read_text()).get("max_position_embeddings")
        if isinstance(positions, int):
            limits.append((positions, f"max_position_embeddings of {cfg_path}"))
    return min(limits) if limits else (None, "unknown")


def _check_model_length(cfg: TransferConfig) -> None:
    """Refuse a P the model cannot take, before any engine starts (not 75 s later)."""
    limit, source = model_max_len(cfg.producer_spec())
    need = max(cfg.prefill_tokens) + cfg.decode_tokens
    if limit is not None and need > limit:
        too_long = [p for p in cfg.prefill_tokens if p + cfg.decode_tokens > limit]
        raise ValueError(
            f"P {too_long} + {cfg.decode_tokens} decode tokens exceed the model's maximum length {limit} "
            f"({source}): drop those P or raise engine.max_model_len"
        )


def load_transfer_config(path: Path | None, overrides: dict[str, Any]) -> TransferConfig:
    """Defaults, then the YAML file (if any), then the non-None ``overrides``; one validated config."""
    return load_layered(
        TransferConfig,
        path,
        overrides,
        what="transfer definition",
        hint="see sweeps/transfer-*.yaml",
        error=TransferConfigError,
    )
