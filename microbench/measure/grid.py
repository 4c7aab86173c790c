"""The interference grid (a sweep definition): defaults → ``sweeps/<name>.yaml`` → flags → one object.

``SweepConfig`` is strict (a misspelled key is an error, not a silent default) and is stored, resolved,
in the run's manifest, so a run says exactly what it measured. ``shard_plans`` resolves it into one
``ShardPlan`` per chunk size. It lives on the measurement floor because every job that measures the grid
reads it: the sweep (one engine configuration) and the ablation (one per arm, the same grid).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import Field, field_validator, model_validator

from benchcore.layered_config import load_layered
from benchcore.schema import FolderName, StrictModel
from engine_harness.engines import EngineSpec
from engine_harness.settings import EngineSettings
from microbench.client.prompts import TokenSpace
from microbench.measure.plan import DecodePrompts, ShardPlan
from microbench.results.records import ProtocolRules
from microbench.results.wake import WakeProbeConfig

__all__ = ["SweepConfig", "SweepConfigError", "hardware_name", "load_sweep", "shard_plans"]

SEED_D = [0, 1, 2, 4, 6, 8, 12]
SEED_P = [512, 1024, 2048, 4096, 8192, 16384, 32768]


class SweepConfigError(ValueError):
    """The sweep definition is invalid; the message names the file, the field and the problem."""


class SweepConfig(StrictModel):
    """One interference sweep: the grid, the engine, the protocol."""

    name: FolderName = "cli"
    chunks: list[int] = Field([8192], min_length=1, description="token budgets (max-num-batched-tokens)")
    decode_batch_sizes: list[int] = Field(default_factory=lambda: list(SEED_D), min_length=1)
    prefill_tokens: list[int] = Field(default_factory=lambda: list(SEED_P), min_length=1)
    repetitions: int = Field(5, ge=1, le=1000)
    decode_context: int = Field(4096, ge=1, description="warm prompt tokens of every decode stream")
    decode_prompts: DecodePrompts = Field(
        "shared",
        description="the decode streams' prompts: one shared warm prefix (seed 002), or a warm prompt of "
        "their own each ('distinct': the decodes read D contexts, as a serving mix's requests do; the "
        "CPU engine's step grows ≈ 0.3 ms per such decode, against ≈ 0 when they share one)",
    )
    decode_tokens: int | None = Field(
        None, ge=16, description="max_tokens of each decode stream; default: enough for the batch's plan"
    )
    max_decode_tokens: int = Field(2048, ge=64, description="cap on the automatic decode_tokens")
    max_attempts: int = Field(3, ge=1, le=20, description="tries per point before it is recorded invalid")
    seed: int = 0
    token_range: str | None = Field(None, description="LO:HI ids for prompts; default: from the model")
    engine: EngineSettings = Field(
        default_factory=EngineSettings, description="engine settings: preset plus EngineSpec fields"
    )
    protocol: ProtocolRules = Field(default_factory=lambda: ProtocolRules())
    wake_probe: WakeProbeConfig | None = Field(
        None, description="after the grid, isolated cold requests after idle gaps on the same engine "
        "(microbench.measure.wake): the wake cost a calibration's simulator charges; none by default"
    )  # fmt: skip

    @field_validator("chunks", "decode_batch_sizes", "prefill_tokens")
    @classmethod
    def _sorted_unique(cls, v: list[int]) -> list[int]:
        if any(x < 0 for x in v):
            raise ValueError(f"values must be ≥ 0, got {v}")
        return sorted(set(v))

    @field_validator("token_range")
    @classmethod
    def _token_range(cls, v: str | None) -> str | None:
        if v is not None:
            TokenSpace.parse(v)  # checked before the run exists, not after its manifest is written
        return v

    @model_validator(mode="after")
    def _check(self) -> SweepConfig:
        if any(c <= 0 for c in self.chunks) or any(p <= 0 for p in self.prefill_tokens):
            raise ValueError("chunk sizes and prefill lengths must be > 0")
        too_big = [d for d in self.decode_batch_sizes if d >= min(self.chunks)]
        if too_big:
            raise ValueError(
                f"decode batch sizes {too_big} leave no room for prefill in chunk {min(self.chunks)}"
            )
        return self

    def engine_spec(self, chunk: int | None = None) -> EngineSpec:
        """The engine for ``chunk`` (default: the first chunk size); the runner resolves it once per chunk."""
        return self.engine.resolve(chunk_size=chunk or self.chunks[0])

    def points(self) -> int:
        return len(self.chunks) * len(self.decode_batch_sizes) * len(self.prefill_tokens) * self.repetitions

    def decode_budget(self, chunk: int, decode_batch: int) -> int:
        """max_tokens for one decode batch: warm-up + baseline + every planned injection, capped."""
        if self.decode_tokens is not None:
            return self.decode_tokens
        p = self.protocol
        need = p.steady_min_tokens + p.baseline_gaps + 2
        for prefill in self.prefill_tokens:
            window = math.ceil(prefill / max(chunk - decode_batch, 1)) + 2
            # ×2: waiting for steady state and a clean local baseline takes some tokens more
            need += (p.local_gaps + window + p.recovery_gaps + 2) * 2 * self.repetitions
        return min(need + 32, self.max_decode_tokens)


def load_sweep(path: Path | None, overrides: dict[str, Any]) -> SweepConfig:
    """Defaults, then the YAML file (if any), then the non-None ``overrides``; one validated config."""
    return load_layered(
        SweepConfig,
        path,
        overrides,
        what="sweep definition",
        hint="see sweeps/ for the shipped ones",
        error=SweepConfigError,
    )


def hardware_name(hardware: dict[str, Any]) -> str:
    """A manifest's hardware as records name it (``RunConfig.gpu``): GPU names, or "CPU: <model>"."""
    return ", ".join(hardware.get("gpus") or []) or f"CPU: {hardware.get('cpu')}"


def shard_plans(
    sweep: SweepConfig, hardware: str, spec_for: Callable[[int], EngineSpec] | None = None
) -> list[ShardPlan]:
    """One shard per chunk size, resolved once for a run: the engine (``spec_for(chunk)``, default the
    sweep's own engine for that chunk), hardware name, decode budgets."""
    return [
        ShardPlan(
            spec=(spec_for or sweep.engine_spec)(chunk),
            chunk=chunk,
            decode_batch_sizes=sweep.decode_batch_sizes,
            prefill_tokens=sweep.prefill_tokens,
            repetitions=sweep.repetitions,
            decode_context=sweep.decode_context,
            decode_prompts=sweep.decode_prompts,
            seed=sweep.seed,
            decode_budgets={d: sweep.decode_budget(chunk, d) for d in sweep.decode_batch_sizes if d},
            rules=sweep.protocol,
            max_attempts=sweep.max_attempts,
            hardware=hardware,
            token_range=sweep.token_range,
            wake=sweep.wake_probe,
        )
        for chunk in sweep.chunks
    ]
