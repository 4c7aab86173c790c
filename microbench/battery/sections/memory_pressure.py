"""5.8 Memory Pressure Behaviour: closed-loop concurrency above the capacity measured by 5.5.

Per oversubscription level: the offered concurrency and the achieved rate and output throughput (the
same ``levels.level_row`` as 5.5, entered in the capacity ledger under 5.5's criteria), completion and
failure rates, out-of-memory errors, TTFT P99, and the engine's preemption counter (/metrics delta).
Engines report preemptions as a total, not per request, so the share of requests preempted at least
once, the recovery rate and tokens lost per preemption are stated as not measurable; preemption events
per request are reported instead.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Literal

from benchcore.schema import StrictModel
from microbench.battery.compliance import must, should
from microbench.battery.context import BatteryContext
from microbench.battery.plan import Estimate, PlanInputs
from microbench.battery.registry import Outcome, duration_requirement, register_test
from microbench.battery.report import TEST_DATA, Table, TestData, ms, num, pct
from microbench.battery.sections.capacity import find_max_concurrency, judge_closed_level
from microbench.loadgen.stages import Stage
from microbench.measure.levels import LevelRow
from microbench.workloads.schedulers import parse_scheduler

__all__ = ["MemoryPressureData", "PressureLevel", "run_memory_pressure"]


class PressureLevel(StrictModel):
    """One oversubscription level: its load level as 5.5 summarises one, plus what memory pressure does."""

    oversubscription: float
    level: LevelRow
    oom_errors: int
    preemptions: float | None

    @property
    def concurrency(self) -> int:
        return int(self.level.offered)

    @property
    def failed(self) -> int:
        return self.level.requests - self.level.succeeded


@TEST_DATA.register("memory_pressure")
class MemoryPressureData(TestData):
    test: Literal["memory_pressure"] = "memory_pressure"
    workload: str
    capacity: int
    levels: list[PressureLevel]

    def tables(self) -> list[Table]:
        rows = []
        for lv in self.levels:
            row, n = lv.level, lv.level.requests
            per_req = None if lv.preemptions is None or not n else lv.preemptions / n
            rows.append(
                [
                    f"{lv.oversubscription:.0%}",
                    str(lv.concurrency),
                    f"{row.request_rps:.2f}",
                    f"{row.output_tps:.1f}",
                    pct(row.success_rate),
                    num(per_req, ".2f"),
                    pct(lv.failed / n if n else None),
                    str(lv.oom_errors),
                    ms(row.ttft.p99),
                ]
            )
        return [
            Table(
                title="Memory Pressure Degradation (Table 11)",
                columns=[
                    "Level",
                    "Concurrency (offered)",
                    "Achieved (req/s)",
                    "Output (tok/s)",
                    "Complete",
                    "Preemptions/request",
                    "Fail Rate",
                    "OOM",
                    "TTFT P99",
                ],
                rows=rows,
                note="Achieved and Output: completions inside the level's window less its ramp, as 5.5 "
                "counts them; Complete: of every request sent. Preempted share, recovery rate and "
                "preemption loss: not measurable (the engine reports preemption totals only)",
            )
        ]


def _plan(i: PlanInputs) -> Estimate:
    p, n = i.profile, len(i.profile.pressure_levels)
    return Estimate(n, int(n * i.probe.rps * p.pressure_duration_s), n * i.level_s(p.pressure_duration_s))


@register_test("memory_pressure", "5.8", "Memory Pressure Behaviour", estimate=_plan)
async def run_memory_pressure(ctx: BatteryContext) -> Outcome:
    p = ctx.profile
    capacity = ctx.estimates.get("max_concurrency")
    notes = []
    if capacity is None:
        data5 = await find_max_concurrency(ctx)
        capacity = data5.max_concurrency
        notes.append("capacity measured here with the 5.5 search (5.5 was not run before)")
    if capacity is None:
        raise RuntimeError("5.5's search found no concurrency meeting its criteria; nothing to oversubscribe")
    spec = ctx.workload_spec()
    requests = (dataclasses.replace(r, max_tokens=p.capacity_output) for r in ctx.requests(spec))
    levels = []
    for f in p.pressure_levels:
        c = max(math.ceil(capacity * f), int(capacity) + 1)
        stage = Stage.scheduled(
            "level",
            parse_scheduler({"kind": "concurrency", "concurrency": c}),
            requests,
            duration_s=p.pressure_duration_s,
        )
        before = await ctx.scrape()
        run = await ctx.run(f"memory-pressure/{f:g}", [stage])
        after = await ctx.scrape()
        preempt = None
        if before is not None and after is not None:
            preempt = after.delta(before, ctx.engine.metrics.preemptions)
        label = f"{f:.0%} of capacity, concurrency {c}"
        row, oom = judge_closed_level(ctx, run.stage("level"), c, "5.8", label)
        levels.append(PressureLevel(oversubscription=f, level=row, oom_errors=oom, preemptions=preempt))
    data = MemoryPressureData(workload=spec.name, capacity=int(capacity), levels=levels)
    reqs = [
        must(
            "5.8.3",
            "levels above the capacity measured by 5.5",
            all(lv.concurrency > capacity for lv in levels),
            f"capacity {capacity}",
        ),
        duration_requirement("5.8.3", p.pressure_duration_s, 120.0),
        must("5.8.3", "OOM errors and failures are recorded", True),
        should("5.8.2", "Long Context workload (RECOMMENDED)", spec.name == "long-context", spec.name),
        should(
            "5.8.4",
            "preemption rate per request is measured",
            False,
            "the engine reports preemption totals only; events per request are given",
        ),
    ]
    if any(lv.preemptions is None for lv in levels):
        notes.append("the engine exposes no preemption counter")
    elif not any(lv.preemptions or lv.failed for lv in levels):
        notes.append(
            "no preemption, failure or OOM at any level: these levels did not put the engine's KV memory "
            "under pressure"
            + (
                f" (5.5's search stopped at its upper bound {p.capacity_max}, so capacity is only a lower "
                "bound: raise capacity_max or give the engine less KV memory)"
                if capacity >= p.capacity_max
                else ""
            )
        )
    return Outcome(data, reqs, notes)
