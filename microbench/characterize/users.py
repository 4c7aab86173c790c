"""The concurrency sweep (seed 001 §III-C.3): 1, 2, 4 … N closed-loop users, one level each.

Each level: a warm-up stage (``warmup_requests(users)`` requests, kept in the trace, never measured),
then the measured stage of ``users`` closed-loop users for the level's duration. The level is summarised
by ``measure.levels.level_row`` (its ramp cut: max(10% of the level, two E2E times)) plus nTTFT, the TTFT
per input token, beside TTFT (seed 001's latency metric for prompts of mixed length).

Level length rule (``level_duration``): a level issues for max(``min_duration_s``, ``1.2 · min_requests ·
E2E P50 / users``) seconds, E2E P50 from the level before (the first level runs the minimum), capped at
``max_duration_s`` — so every level aims at ``min_requests`` measured requests (≥ 100 for a P99 that is
more than the maximum). A level that still got fewer is stored with its count; the dataset keeps it.
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable, Iterator

import numpy as np
from pydantic import Field

from benchcore.schema import StrictModel
from microbench.client.requests import RequestSpec
from microbench.loadgen.stages import Stage
from microbench.measure.levels import LevelRow, level_row
from microbench.measure.runs import Run, StageRunner
from microbench.measure.stats import Distribution, summarize
from microbench.workloads.schedulers import parse_scheduler

__all__ = ["LEVEL_RULE", "UserLevel", "UserSweepPlan", "level_duration", "sweep_users", "user_levels"]

LEVEL_RULE = (
    "each level issues for max(min duration, 1.2 × min requests × E2E P50 of the level before / users) s, "
    "capped at the max duration; warm-up requests before each level are not measured; the first "
    "max(10% of the level, 2 × E2E) s of a level are its ramp, not measured"
)


class UserSweepPlan(StrictModel):
    """The users levels and how long each runs."""

    users: list[int] = Field(default_factory=lambda: [1, 2, 4, 8, 16, 32, 64, 128], min_length=1)
    min_duration_s: float = Field(default=30.0, gt=0)
    max_duration_s: float = Field(default=120.0, gt=0)
    min_requests: int = Field(default=100, ge=1, description="measured requests a level aims at")
    warmup_per_user: int = Field(default=1, ge=0, description="warm-up requests per user before each level")


def user_levels(maximum: int, minimum: int = 1) -> list[int]:
    """1, 2, 4 … up to ``maximum`` (``maximum`` itself last when it is not a power of two)."""
    if minimum < 1 or maximum < minimum:
        raise ValueError(f"users levels need 1 <= minimum <= maximum, got {minimum}..{maximum}")
    out = [u for u in (2**k for k in range(0, 31)) if minimum <= u <= maximum]
    return out if out and out[-1] == maximum else [*out, maximum]


def level_duration(plan: UserSweepPlan, users: int, e2e_p50_s: float | None) -> float:
    """The level length rule (``LEVEL_RULE``)."""
    want = plan.min_duration_s
    if e2e_p50_s is not None and math.isfinite(e2e_p50_s):
        want = max(want, 1.2 * plan.min_requests * e2e_p50_s / users)
    return min(want, max(plan.max_duration_s, plan.min_duration_s))


class UserLevel(StrictModel):
    """One users level as measured: the shared level summary plus nTTFT (s per input token)."""

    users: int
    duration_s: float
    row: LevelRow
    nttft: Distribution = Field(..., description="TTFT / input tokens of each measured request (s/token)")
    input_tokens: Distribution
    output_tokens: Distribution


def _measured(run: Run, row: LevelRow) -> tuple[Distribution, Distribution, Distribution]:
    window = run.stage("level")
    lat = window.latencies
    begin = window.issue_end_s - (row.window_s or 0.0)
    measured = lat[lat["ok"] & (lat["send_s"] >= begin)]
    if measured.empty:
        measured = lat[lat["ok"]]
    inp = measured["input_tokens"].to_numpy(float)
    with np.errstate(divide="ignore", invalid="ignore"):
        nttft = measured["ttft_s"].to_numpy(float) / inp
    return summarize(nttft), summarize(inp), summarize(measured["output_tokens"].to_numpy(float))


async def sweep_users(
    run: StageRunner,
    requests: Iterator[RequestSpec],
    plan: UserSweepPlan,
    label: str,
    *,
    done: dict[int, UserLevel] | None = None,
    on_level: Callable[[UserLevel, Run | None], Awaitable[None]] | None = None,
) -> list[UserLevel]:
    """Every level of ``plan`` in order; ``done`` levels (a resumed sweep) are kept, not run again.

    ``on_level`` sees each new level with its run (to store its stamps and the dataset rows).
    """
    levels: list[UserLevel] = []
    e2e: float | None = None
    for users in plan.users:
        if done and users in done:
            level = done[users]
        else:
            warm_n = plan.warmup_per_user * users
            stages = []
            if warm_n:
                warm = parse_scheduler({"kind": "concurrency", "concurrency": users})
                stages.append(Stage.scheduled("warmup", warm, requests, max_requests=warm_n, warmup=True))
            duration = level_duration(plan, users, e2e)
            closed = parse_scheduler({"kind": "concurrency", "concurrency": users})
            stages.append(Stage.scheduled("level", closed, requests, duration_s=duration))
            result = await run(f"{label}/u{users}", stages)
            row = level_row(result.stage("level"), users, loop="closed")
            nttft, inp, out = _measured(result, row)
            level = UserLevel(
                users=users, duration_s=duration, row=row, nttft=nttft, input_tokens=inp, output_tokens=out
            )
            if on_level is not None:
                await on_level(level, result)
        levels.append(level)
        e2e = level.row.e2e.p50
    return levels
