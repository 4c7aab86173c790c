"""The ablation definition: a grid (a sweep definition), named arms, rounds; defaults → YAML → flags.

An arm is the grid's engine with typed overrides (``engine_harness.handles.EngineOverrides``): on the
command line ``--arm NAME=engine:KEY=VALUE,...`` (``parse_arm``), in a file under ``sweeps/ablations/``
the same fields as a mapping (``arms: {A: {}, B: {chunk_size: 8192}}``, where a list value such as
``extra_args`` fits). The first arm is the reference A. Stored, resolved, in the run's manifest.

An arm may run another engine kind or model (``--arm sg=engine:kind=sglang,mixed_chunk=true``): its
overrides join the grid's ``engine:`` settings before they are resolved (``engine_harness.settings``), so
the grid's preset is read as the kind's counterpart (``cpu`` → ``sglang-cpu``) and a kind's own block
(``vllm: {cpu_kvcache_gib: 2}``) applies only where that kind runs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import Field, ValidationError, field_validator, model_validator

from benchcore.layered_config import load_layered
from benchcore.schema import FolderName, StrictModel
from engine_harness.engines import EngineSpec
from engine_harness.handles import ENGINE_IDENTITY, EngineOverrides
from engine_harness.settings import EngineSettings
from microbench.measure.grid import SweepConfig, load_sweep

__all__ = ["AblateConfig", "AblateConfigError", "load_ablation"]


class AblateConfigError(ValueError):
    """The ablation definition is invalid; the message names the file, the field and the problem."""


class AblateConfig(StrictModel):
    """Arms measured on one grid in counterbalanced rounds (round r measures repetition r of each point)."""

    name: FolderName = "ablate"
    grid: SweepConfig = Field(default_factory=SweepConfig, description="the grid and the base engine")
    arms: dict[str, dict[str, Any]] = Field(
        min_length=2, description="arm name → EngineSpec fields changed from the grid's engine; first: A"
    )
    rounds: int = Field(3, ge=1, le=1000, description="rounds measured before any stops early")
    until_resolved: float | None = Field(
        None, gt=0, lt=1, description="add rounds until every cell's CI excludes 1 or lies within ±this"
    )
    max_rounds: int = Field(12, ge=1, le=1000, description="with until_resolved: the most rounds")
    max_minutes: float | None = Field(None, gt=0, description="with until_resolved: stop adding rounds after")
    alpha: float = Field(0.05, gt=0, lt=1, description="false discovery rate across cells")
    tolerance: float = Field(0.1, gt=0, lt=1, description="a cell whose CI lies within ±this is decided")

    @field_validator("grid", mode="before")
    @classmethod
    def _grid_file(cls, grid: Any) -> Any:
        """A sweep definition file's path (``grid: sweeps/sim-quick.yaml``) is that file's grid."""
        return load_sweep(Path(grid), {}) if isinstance(grid, str | Path) else grid

    @field_validator("arms")
    @classmethod
    def _arms(cls, arms: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
        for name, values in arms.items():
            try:
                EngineOverrides.of(values or {}, engines=True)
            except ValueError as exc:
                raise ValueError(f"arm {name}: {exc}") from None
        return {name: values or {} for name, values in arms.items()}

    @model_validator(mode="after")
    def _check(self) -> AblateConfig:
        for name in self.arms:
            try:
                self.settings(name)
            except ValidationError as exc:
                why = "; ".join(str(e["msg"]).removeprefix("Value error, ") for e in exc.errors())
                raise ValueError(f"arm {name}: {why}") from None
        if any("chunk_size" in arm for arm in self.arms.values()) and len(self.grid.chunks) > 1:
            raise ValueError(
                f"an arm changes chunk_size: give a grid of one chunk (not {self.grid.chunks}); the arms' "
                "cells are then compared on (D, P)"
            )
        if self.max_rounds < self.rounds:
            raise ValueError(f"max_rounds {self.max_rounds} is below rounds {self.rounds}")
        return self

    @property
    def names(self) -> list[str]:
        return list(self.arms)

    def arm_grid(self, arm: str) -> SweepConfig:
        """The grid as ``arm`` measures it: the grid's, or its one chunk replaced by the arm's chunk_size."""
        chunk = self.arms[arm].get("chunk_size")
        return self.grid if chunk is None else self.grid.model_copy(update={"chunks": [int(chunk)]})

    def settings(self, arm: str) -> EngineSettings:
        """The grid's ``engine:`` settings with the arm's overrides (checked for the kind the arm runs)."""
        return EngineSettings.model_validate(self.grid.engine.root | self.arms[arm])

    def spec(self, arm: str, chunk: int) -> EngineSpec:
        """The engine of ``arm`` for ``chunk``: the grid's engine settings with the arm's overrides."""
        return self.settings(arm).resolve(chunk_size=self.arms[arm].get("chunk_size", chunk))

    def identity_differs(self) -> list[str]:
        """The engine kind or model where the arms differ (``ENGINE_IDENTITY``), as 'kind: vllm / sglang'."""
        specs = [self.spec(name, self.grid.chunks[0]) for name in self.names]
        out = []
        for key in ENGINE_IDENTITY:
            values = [getattr(s, key) for s in specs]
            if len(set(values)) > 1:
                out.append(f"{key}: {' / '.join(str(v) for v in values)}")
        return out

    def decision_tolerance(self) -> float:
        return self.until_resolved or self.tolerance

    def round_budget(self) -> int:
        return self.max_rounds if self.until_resolved else self.rounds


def load_ablation(path: Path | None, overrides: dict[str, Any]) -> AblateConfig:
    """Defaults, then the YAML file (if any), then the non-None ``overrides``; one validated definition."""
    return load_layered(
        AblateConfig,
        path,
        overrides,
        what="ablation definition",
        hint="see sweeps/ablations/ for the shipped ones",
        error=AblateConfigError,
    )
