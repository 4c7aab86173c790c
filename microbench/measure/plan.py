"""What one interference shard measures: one chunk size's part of a grid, resolved before it runs.

A ``ShardPlan`` carries everything the shard would otherwise look up per point (the engine spec for this
chunk, the hardware name, the scheduling mode, decode budgets per D), so a job resolves it once per run
and an executor can ship it to another process as it is. ``split_plans`` cuts a chunk size's shard into
shards of groups of its D values, to fill more devices than there are chunk sizes: each part starts its
own engine and measures its D values with the whole run's P values, seeds and repetitions, so the records
are the ones one shard per chunk size would have stored.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field, replace
from typing import Literal

from engine_harness.engines import EngineSpec, engine_kind
from engine_harness.step_model import Scheduling
from microbench.client.prompts import TokenSpace, shared_prefix, token_space_for
from microbench.results.records import ProtocolRules, RunConfig
from microbench.results.wake import WakeProbeConfig

__all__ = ["DecodePrompts", "ShardPlan", "split_plans"]

# The decode streams' prompts: one warm prefix all share, or one warm prompt each (SweepConfig).
DecodePrompts = Literal["shared", "distinct"]


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
    decode_prompts: DecodePrompts = "shared"  # one warm prefix for every decode stream, or one each
    max_attempts: int = 3
    hardware: str = ""  # the RunConfig's ``gpu``: GPU names, or "CPU: <model>"
    token_range: str | None = None  # LO:HI ids for prompts; default: from the model
    part: str | None = None  # the D values of a chunk size split over several shards ("D2_8"; split_plans)
    wake: WakeProbeConfig | None = None  # the wake probe after the grid (one part of a split chunk runs it)

    @property
    def name(self) -> str:
        """The shard's name: its chunk size, and its D values when the chunk is split (``512-D2_8``); its
        engine's log and telemetry carry it."""
        return str(self.chunk) if self.part is None else f"{self.chunk}-{self.part}"

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

    def tokens(self) -> tuple[TokenSpace, list[list[int]]]:
        """The prompt id space and the decode streams' warm prompts (fixed by the seed): one shared by
        every stream, or one per stream of the largest batch (``decode_prompts``)."""
        space = TokenSpace.parse(self.token_range) if self.token_range else token_space_for(self.spec.model)
        count = 1 if self.decode_prompts == "shared" else max(self.decode_batch_sizes, default=1) or 1
        return space, [shared_prefix(self.decode_context, space, self.seed + i) for i in range(count)]

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


def split_plans(plans: list[ShardPlan], shards: int) -> list[ShardPlan]:
    """``plans`` (one per chunk size) as about ``shards`` shards: each chunk size's D values dealt round-robin
    into ``shards // len(plans)`` groups (the batched levels; D = 0, bare prefills with no decode batch and
    a fraction of a batched level's time, joins the smallest group), never more groups than batched levels.
    Each part pays its own engine start but runs beside the others, so filling idle devices shortens the
    run as long as a group takes longer than a start; with no more devices than chunk sizes nothing splits.
    """
    groups = shards // max(len(plans), 1)
    out = []
    for plan in plans:
        batched = [d for d in plan.decode_batch_sizes if d]
        n = min(groups, len(batched))
        if n < 2:
            out.append(plan)
            continue
        parts = [batched[i::n] for i in range(n)]
        if 0 in plan.decode_batch_sizes:
            parts[-1] = [0, *parts[-1]]
        for ds in parts:
            ordered = [d for d in plan.decode_batch_sizes if d in ds]  # the run's D order within the part
            part = "D" + "_".join(map(str, ordered))
            out.append(
                replace(
                    plan, decode_batch_sizes=ordered, part=part, wake=plan.wake if ds is parts[-1] else None
                )
            )
    return out
