"""What one interference shard measures: one chunk size's part of a grid, resolved before it runs.

A ``ShardPlan`` carries everything the shard would otherwise look up per point (the engine spec for this
chunk, the hardware name, the scheduling mode, decode budgets per D), so a job resolves it once per run
and an executor can ship it to another process as it is.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

from engine_harness.engines import EngineSpec, engine_kind
from engine_harness.step_model import Scheduling
from microbench.client.prompts import TokenSpace, shared_prefix, token_space_for
from microbench.results.records import ProtocolRules, RunConfig

__all__ = ["ShardPlan"]


@dataclass(frozen=True)
class ShardPlan:
    """One chunk size's part of an interference grid, resolved: nothing here is looked up per point."""

    spec: EngineSpec  # the engine for this chunk (its token budget set)
    chunk: int
    decode_batch_sizes: list[int]
    prefill_tokens: list[int]
    repetitions: int
    decode_context: int
    seed: int
    decode_budgets: dict[int, int]  # max_tokens of a decode batch, per D > 0
    rules: ProtocolRules = field(default_factory=ProtocolRules)
    max_attempts: int = 3
    hardware: str = ""  # the RunConfig's ``gpu``: GPU names, or "CPU: <model>"
    token_range: str | None = None  # LO:HI ids for prompts; default: from the model

    def points(self) -> list[tuple[int, int, int]]:
        """(D, P, repetition) in measuring order: per D, per repetition, every P."""
        return [
            (d, p, r)
            for d in self.decode_batch_sizes
            for r in range(self.repetitions)
            for p in self.prefill_tokens
        ]

    @functools.cached_property
    def scheduling(self) -> Scheduling:
        """``mixed`` or ``exclusive`` (the engine's prefill scheduling; ``engine_harness.step_model``)."""
        return engine_kind(self.spec.kind).scheduling(self.spec)

    def tokens(self) -> tuple[TokenSpace, list[int]]:
        """The prompt id space and the decode streams' shared prefix (fixed by the seed)."""
        space = TokenSpace.parse(self.token_range) if self.token_range else token_space_for(self.spec.model)
        return space, shared_prefix(self.decode_context, space, self.seed)

    def config(self, d: int, p: int, r: int, budget: int) -> RunConfig:
        return RunConfig(
            decode_batch_size=d,
            new_prefill_tokens=p,
            chunk_size=self.chunk,
            model=self.spec.model_name,
            gpu=self.hardware,
            repetition=r,
            engine=self.spec.kind,
            decode_context=self.decode_context,
            decode_max_tokens=budget if d else 0,
            scheduling=self.scheduling,
        )
