"""Capacity, measured once per battery run (5.2.3), before any test that scales its load by it.

Two phases, each level entered in the capacity ledger (``sustainable``):

1. **Closed-loop ramp**: concurrency ``probe_concurrency``, doubled until two levels in a row fail to
   beat the best before them by more than 10% (or ``capacity_max``; ``ramp_done``). The best level's
   completion rate X is the engine's service rate for this workload: a closed loop keeps the batch full
   with no arrival noise.
2. **Open-loop search** (``rate_search``): Poisson levels at fractions of X, from 0.9: +0.1 while
   sustainable, −0.1 while not, then bisection until the last sustainable and the first saturated
   fraction are within 0.05, within ``search_probes`` levels. The highest sustainable offered rate is
   the battery's sustainable rate (5.1, 5.3, 5.4 scale by it; 5.2 reports it).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from pydantic import Field

from benchcore.schema import StrictModel
from microbench.battery.context import BatteryContext
from microbench.battery.levels import LevelRow, ledger_entry, level_row
from microbench.battery.stats import SearchStep
from microbench.loadgen.stages import Stage
from microbench.workloads.schedulers import parse_scheduler
from microbench.workloads.spec import WorkloadSpec

__all__ = [
    "CapacitySearch",
    "closed_loop_ramp",
    "measure_capacity",
    "ramp_done",
    "rate_search",
    "sustainable_open",
]

RESOLUTION = 0.05  # of the closed-loop rate X


class CapacitySearch(StrictModel):
    """Both phases of the capacity measurement, as run."""

    closed_loop: list[LevelRow]
    closed_rps: float = Field(..., description="best closed-loop completion rate X (req/s)")
    open_loop: list[LevelRow] = Field(default_factory=list, description="in the order run")
    search: list[SearchStep] = Field(default_factory=list)
    sustainable_rps: float | None = None


async def rate_search(
    passes: Callable[[float], Awaitable[bool]], x: float, probes: int
) -> tuple[float | None, list[SearchStep]]:
    """Highest sustainable rate among fractions of ``x`` probed (see the module docstring)."""
    steps: list[SearchStep] = []
    good: float | None = None
    bad: float | None = None
    f = 0.9
    while len(steps) < probes:
        ok = await passes(f * x)
        steps.append(SearchStep(value=f * x, passed=ok))
        if ok:
            good = f if good is None else max(good, f)
        else:
            bad = f if bad is None else min(bad, f)
        if good is not None and bad is not None:
            if bad - good <= RESOLUTION + 1e-9:
                break
            f = (good + bad) / 2
        elif ok:
            f = round(f + 0.1, 6)
        else:
            f = round(f - 0.1, 6) if f > 0.15 else f / 2
    return (None if good is None else good * x), steps


def sustainable_open(
    row: LevelRow, lower_p50: float | None, ttft_slo_ms: float | None, tpot_slo_ms: float | None
) -> bool:
    """5.2.3.1's third sign (E2E P99 > 10× a lower level's P50) and the SLOs, on top of the row's verdict."""
    if lower_p50 is not None and row.e2e.p99 is not None and row.e2e.p99 > 10 * lower_p50:
        row.steady.reasons.append(f"E2E P99 {row.e2e.p99:.3f} s > 10× P50 {lower_p50:.3f} s at a lower load")
        row.steady.saturated = True
    slo = True
    if ttft_slo_ms is not None:
        slo = slo and row.ttft.p99 is not None and row.ttft.p99 * 1e3 <= ttft_slo_ms
    if tpot_slo_ms is not None:
        slo = slo and row.tpot.p99 is not None and row.tpot.p99 * 1e3 <= tpot_slo_ms
    row.slo_met = slo if (ttft_slo_ms or tpot_slo_ms) else None
    return row.sustainable


def closed_criteria(row: LevelRow, ttft_p99_ms: float) -> bool:
    """5.5's success criteria for a closed-loop level: ≥ 99% completed, TTFT P99 within the limit."""
    row.slo_met = (
        row.success_rate is not None
        and row.success_rate >= 0.99
        and row.ttft.p99 is not None
        and row.ttft.p99 * 1e3 <= ttft_p99_ms
    )
    return row.slo_met


async def closed_loop_ramp(
    ctx: BatteryContext, label: str, spec: WorkloadSpec, base_url: str | None = None
) -> list[LevelRow]:
    """Closed-loop levels, concurrency doubling while output throughput rises by more than 10%."""
    p = ctx.profile
    rows: list[LevelRow] = []
    c = p.probe_concurrency
    while True:
        scheduler = parse_scheduler({"kind": "concurrency", "concurrency": c})
        stage = Stage.scheduled("level", scheduler, ctx.requests(spec), duration_s=p.level_duration_s)
        run = await ctx.run(f"{label}/c{c}", [stage], base_url=base_url)
        row = level_row(run.stage("level"), c, loop="closed")
        closed_criteria(row, p.capacity_ttft_p99_ms)
        rows.append(row)
        if ramp_done(rows, p.capacity_max) or row.succeeded == 0:
            return rows
        c *= 2


def ramp_done(rows: list[LevelRow], capacity_max: int) -> bool:
    """The ramp stops at ``capacity_max`` or once two levels in a row beat the best before them by ≤ 10%.

    One level is not enough on a shared machine: a single slow level (another process's burst) would end
    the ramp below the engine's capacity.
    """
    if rows[-1].offered * 2 > capacity_max:
        return True
    tps = [r.output_tps for r in rows]
    stalled = [i for i in range(1, len(tps)) if tps[i] <= 1.1 * max(tps[:i])]
    return len(stalled) >= 2 and stalled[-2:] == [len(tps) - 2, len(tps) - 1]


async def measure_capacity(ctx: BatteryContext) -> CapacitySearch:
    """Both phases against the battery's engine; every level goes into ``ctx.ledger`` as 5.2's."""
    p = ctx.profile
    spec = ctx.workload_spec()
    ramp = await closed_loop_ramp(ctx, "capacity/closed", spec)
    for row in ramp:
        ctx.ledger.append(ledger_entry("5.2", f"closed loop, concurrency {row.offered:.0f}", row))
    x = max(r.request_rps for r in ramp)
    if x <= 0:
        raise RuntimeError("the closed-loop capacity probe completed no request; is the engine serving?")
    rows: list[LevelRow] = []

    async def passes(rate: float) -> bool:
        scheduler = parse_scheduler({"kind": "poisson", "rate": rate, "seed": ctx.seed + len(rows)})
        stage = Stage.scheduled("level", scheduler, ctx.requests(spec), duration_s=p.level_duration_s)
        run = await ctx.run(f"capacity/rate-{rate:.3f}", [stage])
        row = level_row(run.stage("level"), rate)
        lower = [r.e2e.p50 for r in sorted(rows, key=lambda r: r.offered) if r.offered < rate and r.e2e.p50]
        ok = sustainable_open(row, lower[0] if lower else None, ctx.ttft_slo_ms, ctx.tpot_slo_ms)
        rows.append(row)
        ctx.ledger.append(ledger_entry("5.2", f"open loop, {rate:.2f} req/s offered", row))
        return ok

    best, steps = await rate_search(passes, x, p.search_probes)
    return CapacitySearch(closed_loop=ramp, closed_rps=x, open_loop=rows, search=steps, sustainable_rps=best)
