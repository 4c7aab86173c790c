"""The route experiment's definition: the engines, the connector, the policies, the workload, validated as
one object. ``RouteConfig`` flows defaults → ``sweeps/route-<name>.yaml`` → command-line flags and is
stored resolved in the run's manifest.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import Field, model_validator

from benchcore.layered_config import load_layered
from benchcore.schema import StrictModel
from engine_harness.engines import EngineSpec
from engine_harness.kv_connectors import ConnectorPreset
from engine_harness.settings import EngineSettings
from microbench.measure.engine_pair import connector_preset, worker_spec
from microbench.route.decide import POLICIES, PolicyName
from microbench.route.workload import RouteWorkload

__all__ = ["RouteConfig", "RouteConfigError", "load_route_config"]


class RouteConfigError(ValueError):
    """The route definition is invalid; the message says where and why."""


class RouteConfig(StrictModel):
    """One route experiment: every policy replays the same seeded workload, in counterbalanced rounds."""

    name: str = "cli"
    policies: list[PolicyName] = Field(default_factory=lambda: list(POLICIES), min_length=1)
    repetitions: int = Field(3, ge=1, le=1000, description="rounds; each replays every policy once")
    seed: int = Field(0, description="the workload's shape (times, lengths); token ids are fresh per replay")
    workload: RouteWorkload = Field(default_factory=RouteWorkload)
    table: Path | None = Field(None, description="offload table (analysis.policy JSON) of the table policy")
    connector: str = Field("nixl-cpu", description="a preset in engine_harness/connectors/")
    prefill_chunk: int | None = Field(None, gt=0, description="prefill worker's token budget")
    decode_chunk: int | None = Field(
        None, gt=0, description="decode worker's token budget (the table's chunk)"
    )
    prefill_cores: str | None = Field("0", description="VLLM_CPU_OMP_THREADS_BIND of the prefill worker")
    decode_cores: str | None = Field("1", description="VLLM_CPU_OMP_THREADS_BIND of the decode worker")
    pin_engine_threads: bool = Field(True, description="pin every thread of each engine to its cores")
    prefill_args: list[str] = Field(default_factory=list, description="extra argv of the prefill worker")
    decode_args: list[str] = Field(default_factory=list, description="extra argv of the decode worker")
    token_range: str | None = Field(None, description="LO:HI ids for prompts; default: from the model")
    engine: EngineSettings = Field(
        default_factory=EngineSettings, description="preset plus EngineSpec fields"
    )
    slo_ttft_ms: float = Field(2000, gt=0, description="goodput SLO: time to first token")
    slo_tpot_ms: float = Field(
        100, gt=0, description="goodput SLO: mean time per output token after the first"
    )
    pause_s: float = Field(1.0, ge=0, description="idle time between replays")
    warmup: bool = Field(True, description="one unrecorded hand-off and one local request before the rounds")
    phase_timeout_s: float = Field(600, gt=0, description="per phase of one request in the router")
    drain_timeout_s: float = Field(600, gt=0, description="how long a replay's last requests may take")
    startup_timeout_s: float = Field(900, gt=0)

    @model_validator(mode="after")
    def _check(self) -> RouteConfig:
        self.connector_preset()
        if "table" in self.policies and self.table is None:
            raise ValueError(
                "the table policy needs table: an offload table (python -m analysis.policy build)"
            )
        if len(set(self.policies)) != len(self.policies):
            raise ValueError(f"policies repeat: {self.policies}")
        return self

    def connector_preset(self) -> ConnectorPreset:
        return connector_preset(self.connector)

    def prefill_spec(self) -> EngineSpec:
        return worker_spec(self.engine, self.prefill_chunk, self.prefill_cores, self.prefill_args)

    def decode_spec(self) -> EngineSpec:
        return worker_spec(self.engine, self.decode_chunk, self.decode_cores, self.decode_args)

    def chunk(self) -> int:
        """The decode worker's token budget: the chunk the table is asked at."""
        chunk = self.decode_spec().chunk_size
        if chunk is None:
            raise ValueError("the decode worker has no token budget: set decode_chunk or engine.chunk_size")
        return chunk

    def rounds(self) -> list[list[PolicyName]]:
        """Per repetition, the policies in order: a rotation (Latin square), so each policy runs in each
        position equally often over ``len(policies)`` rounds (order and warming effects cancel)."""
        n = len(self.policies)
        return [[self.policies[(r + i) % n] for i in range(n)] for r in range(self.repetitions)]


def load_route_config(path: Path | None, overrides: dict[str, Any]) -> RouteConfig:
    """Defaults, then the YAML file (if any), then the non-None ``overrides``; one validated config."""
    return load_layered(
        RouteConfig,
        path,
        overrides,
        what="route definition",
        hint="see sweeps/route-*.yaml",
        error=RouteConfigError,
    )
