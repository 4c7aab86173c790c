"""Capacity of an engine for one workload (5.2.3), measured once per run before the loads scaled by it.

Two phases, each level judged by ``saturation`` and summarised by ``levels``:

1. **Closed-loop ramp** (``closed_loop_ramp``): concurrency ``start_concurrency``, doubled until two levels
   in a row fail to beat the best before them by more than 10% (or ``max_concurrency``; ``ramp_done``).
   The best level's completion rate X is the engine's service rate for this workload: a closed loop
   keeps the batch full with no arrival noise.
2. **Open-loop search** (``search.rate_search``): Poisson levels at fractions of X, from 0.9: +0.1 while
   sustainable, −0.1 while not, then bisection until the last sustainable and the first saturated
   fraction are within 0.05, within ``search_probes`` levels. The highest rate a sustainable level put
   to the engine (``sustainable_rate``: offered, or sent when a short Poisson draw sent less) is the
   run's sustainable rate (the battery's 5.1, 5.3, 5.4 scale by it; 5.2 reports it).

Levels run through a ``runs.StageRunner``; requests come from a ``RequestSource`` called once per level.
``capacity_ledger`` enters every level of a search in the capacity ledger (``sustainable``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

from pydantic import Field

from benchcore.schema import StrictModel
from microbench.client.requests import RequestSpec
from microbench.loadgen.stages import Stage
from microbench.measure.levels import LevelRow, ledger_entry, level_row
from microbench.measure.runs import StageRunner
from microbench.measure.search import SearchStep, rate_search
from microbench.measure.sustainable import LedgerEntry
from microbench.workloads.schedulers import parse_scheduler

__all__ = [
    "CapacityPlan",
    "CapacitySearch",
    "RequestSource",
    "capacity_ledger",
    "closed_criteria",
    "closed_loop_ramp",
    "measure_capacity",
    "ramp_done",
    "sustainable_open",
]

RequestSource = Callable[[], Iterator[RequestSpec]]  # a fresh stream of the workload's requests per level


@dataclass(frozen=True)
class CapacityPlan:
    """How the capacity is probed: the ramp's concurrencies and criterion, the search's levels and SLOs."""

    start_concurrency: int
    max_concurrency: int
    level_duration_s: float
    closed_ttft_p99_ms: float  # 5.5's criterion for a closed-loop level
    search_probes: int
    seed: int = 0
    ttft_slo_ms: float | None = None
    tpot_slo_ms: float | None = None


class CapacitySearch(StrictModel):
    """Both phases of the capacity measurement, as run."""

    closed_loop: list[LevelRow]
    closed_rps: float = Field(..., description="best closed-loop completion rate X (req/s)")
    open_loop: list[LevelRow] = Field(default_factory=list, description="in the order run")
    search: list[SearchStep] = Field(default_factory=list)
    sustainable_rps: float | None = Field(default=None, description="``sustainable_rate``: as sent")


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
    run: StageRunner, requests: RequestSource, label: str, plan: CapacityPlan, base_url: str | None = None
) -> list[LevelRow]:
    """Closed-loop levels, concurrency doubling while output throughput rises by more than 10%."""
    rows: list[LevelRow] = []
    c = plan.start_concurrency
    while True:
        scheduler = parse_scheduler({"kind": "concurrency", "concurrency": c})
        stage = Stage.scheduled("level", scheduler, requests(), duration_s=plan.level_duration_s)
        result = await run(f"{label}/c{c}", [stage], base_url=base_url)
        row = level_row(result.stage("level"), c, loop="closed")
        closed_criteria(row, plan.closed_ttft_p99_ms)
        rows.append(row)
        if ramp_done(rows, plan.max_concurrency) or row.succeeded == 0:
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


async def measure_capacity(run: StageRunner, requests: RequestSource, plan: CapacityPlan) -> CapacitySearch:
    """Both phases against the runner's engine (labels ``capacity/closed/c<N>``, ``capacity/rate-<R>``)."""
    ramp = await closed_loop_ramp(run, requests, "capacity/closed", plan)
    x = max(r.request_rps for r in ramp)
    if x <= 0:
        raise RuntimeError("the closed-loop capacity probe completed no request; is the engine serving?")
    rows: list[LevelRow] = []

    async def passes(rate: float) -> bool:
        scheduler = parse_scheduler({"kind": "poisson", "rate": rate, "seed": plan.seed + len(rows)})
        stage = Stage.scheduled("level", scheduler, requests(), duration_s=plan.level_duration_s)
        result = await run(f"capacity/rate-{rate:.3f}", [stage])
        row = level_row(result.stage("level"), rate)
        lower = [r.e2e.p50 for r in sorted(rows, key=lambda r: r.offered) if r.offered < rate and r.e2e.p50]
        ok = sustainable_open(row, lower[0] if lower else None, plan.ttft_slo_ms, plan.tpot_slo_ms)
        rows.append(row)
        return ok

    _, steps = await rate_search(passes, x, plan.search_probes)
    return CapacitySearch(
        closed_loop=ramp, closed_rps=x, open_loop=rows, search=steps, sustainable_rps=sustainable_rate(rows)
    )


def sustainable_rate(rows: list[LevelRow]) -> float | None:
    """The search's result: the highest rate a sustainable open-loop level put to the engine (``tested_rps``:
    offered, or sent when less), not the highest offered rate that passed."""
    return max((r.tested_rps for r in rows if r.sustainable), default=None)


def capacity_ledger(search: CapacitySearch, test: str) -> list[LedgerEntry]:
    """Every level of ``search`` as the capacity ledger's entries of ``test``, in the order they ran."""
    closed = [ledger_entry(test, f"closed loop, concurrency {r.offered:.0f}", r) for r in search.closed_loop]
    opened = [ledger_entry(test, f"open loop, {r.offered:.2f} req/s offered", r) for r in search.open_loop]
    return closed + opened
