"""5.8 Memory Pressure Behaviour: closed-loop concurrency above the capacity measured by 5.5.

Per oversubscription level: the offered concurrency and the achieved rate and output throughput (the
same ``levels.level_row`` as 5.5, entered in the capacity ledger under 5.5's criteria), completion and
failure rates, out-of-memory errors, TTFT P99, and what preemption did (``preemption_figures``).

Engines count preemptions as a total, not per request. ``preemption_figures`` attributes them to requests
from what the trace and the /metrics series store: a request counts as preempted when one of its
inter-token gaps is a stall (over ``STALL_FACTOR`` × the level's median gap) and the preemption counter
rose during that stall (between the two scrapes around its rise); when more stalls qualify than the
counter rose, the longest ones are kept. Preempted share = such requests / requests sent; recovery rate =
those that completed / those preempted; loss = tokens whose KV a recompute-preemption (vLLM V1's only
mode, and the sim's) discards, prompt plus the tokens generated before the stall, averaged over the
attributed events. A request preempted before its first token shows no gap and is not counted (its
stall is in its TTFT), so the share is a lower bound; the counter's own per-request rate is given beside it.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Literal

import numpy as np
import pandas as pd
from pydantic import Field

from benchcore.schema import StrictModel
from microbench.battery.compliance import must, should
from microbench.battery.context import BatteryContext
from microbench.battery.plan import Estimate, PlanInputs
from microbench.battery.registry import Outcome, duration_requirement, register_test
from microbench.battery.report import TEST_DATA, Table, TestData, ms, num, pct
from microbench.battery.sections.capacity import find_max_concurrency, judge_closed_level
from microbench.loadgen.metrics_series import increments
from microbench.loadgen.stages import Stage
from microbench.measure.levels import LevelRow
from microbench.workloads.schedulers import parse_scheduler

__all__ = [
    "STALL_FACTOR",
    "MemoryPressureData",
    "PreemptionFigures",
    "PressureLevel",
    "preemption_figures",
    "run_memory_pressure",
]

STALL_FACTOR = 5.0  # an inter-token gap over 5x the level's median gap is a stall a preemption may explain


class PreemptionFigures(StrictModel):
    """5.8.4's preemption figures of one level (None where the engine has no preemption counter)."""

    events: float | None = Field(..., description="the preemption counter's rise over the level")
    requests: int
    preempted: int | None = Field(..., description="requests with a stall attributed to a preemption")
    recovered: int | None = Field(..., description="of those, how many completed")
    loss_tokens: float | None = Field(..., description="tokens discarded per attributed event (recompute)")
    stall_threshold_s: float | None = None

    @property
    def share(self) -> float | None:
        return None if self.preempted is None or not self.requests else self.preempted / self.requests

    @property
    def recovery_rate(self) -> float | None:
        return None if not self.preempted or self.recovered is None else self.recovered / self.preempted


def _stalls(trace: pd.DataFrame, threshold_s: float) -> list[tuple[float, int, float, float, float]]:
    """(gap s, row, start s, end s, tokens discarded) for every inter-token gap over ``threshold_s``."""
    found = []
    for i, row in enumerate(trace.itertuples(index=False)):
        stamps = np.asarray(row.chunk_ns, dtype=float) / 1e9
        if stamps.size < 2:
            continue
        done = np.cumsum(np.asarray(row.chunk_tokens, dtype=float))
        prompt = row.input_tokens if not pd.isna(row.input_tokens) else row.prompt_tokens
        for j in np.flatnonzero(np.diff(stamps) > threshold_s):
            gap = stamps[j + 1] - stamps[j]
            found.append((float(gap), i, float(stamps[j]), float(stamps[j + 1]), float(prompt + done[j])))
    return found


def preemption_figures(
    trace: pd.DataFrame, series: pd.DataFrame | None, stall_factor: float = STALL_FACTOR
) -> PreemptionFigures:
    """Preempted share, recovery and loss of one level from its trace rows (``chunk_ns``, ``chunk_tokens``,
    ``input_tokens``/``prompt_tokens``, ``status``) and its /metrics series (the ``preemptions`` counter)."""
    n = len(trace)
    rises = [] if series is None else increments(series, "preemptions")
    has_counter = series is not None and (series["quantity"] == "preemptions").any()
    if not has_counter:
        return PreemptionFigures(events=None, requests=n, preempted=None, recovered=None, loss_tokens=None)
    events = float(sum(r[2] for r in rises))
    diffs = [np.diff(np.asarray(c, dtype=float)) / 1e9 for c in trace["chunk_ns"]]
    gaps = np.concatenate(diffs) if diffs else np.empty(0)
    threshold = float(stall_factor * np.median(gaps)) if gaps.size else None
    if not events or threshold is None:
        return PreemptionFigures(
            events=events, requests=n, preempted=0, recovered=0, loss_tokens=None, stall_threshold_s=threshold
        )
    attributed = [
        s for s in _stalls(trace, threshold) if any(t1 >= s[2] and t0 <= s[3] for t0, t1, _ in rises)
    ]
    kept = sorted(attributed, reverse=True)[: round(events)]
    rows = {s[1] for s in kept}
    ok = trace["status"].to_numpy() == "ok"
    return PreemptionFigures(
        events=events,
        requests=n,
        preempted=len(rows),
        recovered=sum(bool(ok[i]) for i in rows),
        loss_tokens=float(np.mean([s[4] for s in kept])) if kept else None,
        stall_threshold_s=threshold,
    )


class PressureLevel(StrictModel):
    """One oversubscription level: its load level as 5.5 summarises one, plus what memory pressure does."""

    oversubscription: float
    level: LevelRow
    oom_errors: int
    preemptions: float | None
    preemption: PreemptionFigures | None = None

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
            pf = lv.preemption
            rows.append(
                [
                    f"{lv.oversubscription:.0%}",
                    str(lv.concurrency),
                    f"{row.request_rps:.2f}",
                    f"{row.output_tps:.1f}",
                    pct(row.success_rate),
                    num(per_req, ".2f"),
                    pct(None if pf is None else pf.share),
                    pct(None if pf is None else pf.recovery_rate),
                    num(None if pf is None else pf.loss_tokens, ".0f"),
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
                    "Preempted",
                    "Recovered",
                    "Loss (tok/event)",
                    "Fail Rate",
                    "OOM",
                    "TTFT P99",
                ],
                rows=rows,
                note="Achieved: completions inside the level's window less its ramp, and Output: the "
                "tokens delivered inside it, as 5.5 counts them; Complete: of every request sent. "
                "Preemptions/request: the engine's counter over requests sent. Preempted: share of "
                "requests with a stream stall (over "
                f"{STALL_FACTOR:g}x the level's median gap) during which the counter rose (a lower bound: a "
                "request preempted before its first token shows no stall); Recovered: of those, the share "
                "that completed; Loss: prompt + generated tokens a recompute discards, per attributed event",
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
        window = run.stage("level")
        row, oom = judge_closed_level(ctx, window, c, "5.8", label)
        figures = preemption_figures(run.frame[run.frame["stage"] == "level"], window.metrics)
        levels.append(
            PressureLevel(
                oversubscription=f, level=row, oom_errors=oom, preemptions=preempt, preemption=figures
            )
        )
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
            "preemption rate, recovery rate and loss per level are measured",
            all(lv.preemption is not None and lv.preemption.events is not None for lv in levels),
            "from stream stalls during which the engine's preemption counter rose (a lower bound on the "
            "share: preemptions before a first token show no stall)",
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
