"""A characterization's definition: the engine, the budget search, the users sweep, the workload, the
dataset. Defaults → YAML (``--config``, e.g. ``sweeps/characterize/*.yaml``) → flags → one validated
``CharacterizeConfig`` (``benchcore.layered_config``)::

    name: cpu-small-kv
    engine: {preset: cpu, max_model_len: 2048}
    search: {dimension: seqs, fixed: 2048, minimum: 1, maximum: 16, initial: 4, context: 2048}
    sweep: {users: [1, 2, 4, 8, 16, 32], configs: [default, found]}
    workload: synthetic-uniform
    dataset: results/characterization.parquet   # optional: also append the rows to this shared table

``sweep.configs`` names the configurations swept: ``default`` is the engine as defined, ``found`` the engine
with the search's setting, any other name a mapping of engine settings under ``sweep.settings``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import Field, model_validator

from benchcore.layered_config import load_layered
from benchcore.schema import StrictModel
from engine_harness.engines import EngineSpec, spec_from_settings
from engine_harness.handles import EngineOverrides
from microbench.characterize.budget import BudgetSearchPlan, Candidate
from microbench.characterize.probes import ProbeLimits
from microbench.characterize.users import UserSweepPlan

__all__ = [
    "CharacterizeConfig",
    "CharacterizeConfigError",
    "SearchSection",
    "SweepSection",
    "load_characterization",
]


class CharacterizeConfigError(ValueError):
    """The definition cannot be used; the message names the field and the fix."""


class SearchSection(StrictModel):
    """The batch-budget search (``enabled: false`` skips it)."""

    enabled: bool = True
    dimension: Literal["budget", "seqs"] = Field(
        default="budget",
        description="budget: max-num-batched-tokens at max-num-seqs = fixed; seqs: the reverse",
    )
    fixed: int | None = Field(default=None, ge=1, description="the setting held (default: the engine's own)")
    minimum: int = Field(default=256, ge=1)
    maximum: int = Field(default=65536, ge=1)
    initial: int | None = Field(default=None, ge=1, description="first probe (default: the minimum)")
    resolution: int = Field(default=1, ge=1)
    max_probes: int = Field(default=32, ge=1)
    context: int | None = Field(default=None, ge=2, description="longest request (default: max_model_len)")
    decode_tokens: int = Field(default=16, ge=2)
    short_tokens: int = Field(default=8, ge=1)
    preemption_limit: int = Field(default=0, ge=0)
    ttft_slo_ms: float | None = Field(default=None, gt=0)
    itl_slo_ms: float | None = Field(default=None, gt=0)
    batch_timeout_s: float = Field(default=600.0, gt=0)

    @model_validator(mode="after")
    def _check(self) -> SearchSection:
        if self.maximum < self.minimum:
            raise ValueError(f"search: maximum {self.maximum} < minimum {self.minimum}")
        if self.initial is not None and not self.minimum <= self.initial <= self.maximum:
            raise ValueError(f"search: initial {self.initial} outside [{self.minimum}, {self.maximum}]")
        return self


class SweepSection(UserSweepPlan):
    """The users sweep (``enabled: false`` skips it) and the configurations it runs."""

    enabled: bool = True
    configs: list[str] = Field(default_factory=lambda: ["found"], min_length=1)
    settings: dict[str, dict[str, Any]] = Field(default_factory=dict, description="engine settings per name")

    @model_validator(mode="after")
    def _check(self) -> SweepSection:
        for name in self.configs:
            if name not in ("default", "found") and name not in self.settings:
                raise ValueError(
                    f"sweep.configs: {name!r} is neither default, found nor a key of sweep.settings"
                )
        for name, values in self.settings.items():
            try:
                EngineOverrides.of(values)
            except ValueError as exc:
                raise ValueError(f"sweep.settings.{name}: {exc}") from None
        if sorted(self.users) != self.users or len(set(self.users)) != len(self.users) or self.users[0] < 1:
            raise ValueError(f"sweep.users must rise strictly from at least 1, got {self.users}")
        return self


class CharacterizeConfig(StrictModel):
    """Everything a characterization run does."""

    name: str = "characterize"
    engine: dict[str, Any] = Field(default_factory=lambda: {"preset": "cpu"})
    search: SearchSection = Field(default_factory=lambda: SearchSection())
    sweep: SweepSection = Field(default_factory=lambda: SweepSection())
    workload: str = Field(
        default="synthetic-uniform", description="a reference workload or a client-mix YAML"
    )
    joint_lengths: Path | None = Field(default=None, description="CSV/Parquet of (input, output) pairs")
    seed: int = Field(default=0, ge=0)
    dataset: Path | None = Field(
        default=None,
        description="a shared table to append the rows to as well (only when asked: it lies "
        "outside the run folder)",
    )
    device: str | None = Field(
        default=None, description="device name in the dataset (default: GPU or CPU model)"
    )
    start_timeout_s: float | None = Field(default=None, gt=0)

    @model_validator(mode="after")
    def _check(self) -> CharacterizeConfig:
        self.base_spec()  # an engine the kind table refuses is found now, not after the first start
        if not self.search.enabled and "found" in self.sweep.configs:
            raise ValueError("sweep.configs has 'found' but the search is disabled: sweep 'default' instead")
        if not self.search.enabled and not self.sweep.enabled:
            raise ValueError("both the search and the sweep are disabled: nothing to do")
        return self

    def base_spec(self) -> EngineSpec:
        return spec_from_settings(self.engine)

    def probe_limits(self) -> ProbeLimits:
        s = self.search
        context = s.context or self.base_spec().max_model_len
        if context is None:
            raise ValueError("search.context is needed: the engine sets no max_model_len")
        return ProbeLimits(
            context=context,
            decode_tokens=s.decode_tokens,
            short_tokens=s.short_tokens,
            preemption_limit=s.preemption_limit,
            ttft_slo_ms=s.ttft_slo_ms,
            itl_slo_ms=s.itl_slo_ms,
        )

    def search_plan(self) -> BudgetSearchPlan:
        s, spec = self.search, self.base_spec()
        held = spec.max_num_seqs if s.dimension == "budget" else spec.chunk_size
        fixed = s.fixed or held
        if fixed is None:
            other = "max_num_seqs" if s.dimension == "budget" else "chunk_size"
            raise ValueError(f"search.fixed is needed: the engine sets no {other} to hold")
        return BudgetSearchPlan(
            dimension=s.dimension,
            fixed=fixed,
            minimum=s.minimum,
            maximum=s.maximum,
            initial=s.initial or s.minimum,
            resolution=s.resolution,
            max_probes=s.max_probes,
            limits=self.probe_limits(),
            batch_timeout_s=s.batch_timeout_s,
        )

    def spec_for(self, candidate: Candidate) -> EngineSpec:
        return self.base_spec().model_copy(
            update={"chunk_size": candidate.budget, "max_num_seqs": candidate.max_seqs}
        )

    def sweep_spec(self, name: str, found: Candidate | None) -> EngineSpec:
        if name == "default":
            return self.base_spec()
        if name == "found":
            if found is None:
                raise ValueError("the search found no passing setting: nothing to sweep as 'found'")
            return self.spec_for(found)
        return EngineOverrides.of(self.sweep.settings[name]).apply(self.base_spec())


def load_characterization(path: Path | None, overrides: dict[str, Any]) -> CharacterizeConfig:
    config = load_layered(
        CharacterizeConfig,
        path,
        overrides,
        what="characterization",
        hint="see sweeps/characterize/",
        error=CharacterizeConfigError,
    )
    try:
        config.probe_limits() if config.search.enabled else None
        config.search_plan() if config.search.enabled else None
    except ValueError as exc:
        raise CharacterizeConfigError(f"invalid characterization: {exc}") from None
    return config
