"""5.5 Concurrent Request Capacity: binary search over closed-loop concurrency with the success criteria.

Workload: the battery workload's inputs with a fixed output length (``capacity_output``). A level passes
when ≥ 99% of its requests complete, TTFT P99 ≤ ``capacity_ttft_p99_ms`` and no request failed with an
out-of-memory error. ``find_max_concurrency`` is shared with 5.8, which needs the measured capacity.

Each level runs for a request count, not a time (``level_requests``): enough for ``capacity_completions_per_
slot`` completions per slot (5.5.3: 100) and for ``capacity_duration_s`` (60 s) at the end-to-end time a
short concurrency-1 probe of the same requests measured (E2E only grows with concurrency, so both minima
hold). The report states each level's completions per slot and duration as run.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator
from typing import ClassVar, Literal

import numpy as np
from matplotlib.figure import Figure

from microbench.battery.compliance import must
from microbench.battery.context import BatteryContext
from microbench.battery.plan import Estimate, PlanInputs
from microbench.battery.plots import new_figure, plain_log
from microbench.battery.registry import FigureSpec, Outcome, register_test
from microbench.battery.report import TEST_DATA, Table, TestData, capacity_rows, ms, num, pct
from microbench.client.requests import RequestSpec
from microbench.loadgen.stages import Stage
from microbench.measure.capacity import closed_criteria
from microbench.measure.levels import LevelRow, ledger_entry, level_row
from microbench.measure.runs import StageWindow
from microbench.measure.search import SearchStep, search_max
from microbench.workloads.schedulers import parse_scheduler

__all__ = [
    "CapacityData",
    "find_max_concurrency",
    "is_oom",
    "judge_closed_level",
    "level_requests",
    "run_capacity",
]


def level_requests(concurrency: int, per_slot: int, min_duration_s: float, e2e_s: float) -> int:
    """Requests of a closed-loop level: ``per_slot`` completions per slot, and at least ``min_duration_s``
    of issuing when each slot finishes a request every ``e2e_s``."""
    return concurrency * max(per_slot, math.ceil(min_duration_s / max(e2e_s, 1e-6)))


_OOM_MARKERS = ("out of memory", "outofmemory", "oom", "cuda error: out")


def is_oom(error: object) -> bool:
    """Whether an error text names an out-of-memory failure."""
    text = str(error or "").lower()
    return any(marker in text for marker in _OOM_MARKERS)


@TEST_DATA.register("capacity")
class CapacityData(TestData):
    shows_capacity: ClassVar[bool] = True
    test: Literal["capacity"] = "capacity"
    workload: str
    output_tokens: int
    ttft_p99_limit_ms: float
    levels: list[LevelRow]
    search: list[SearchStep]
    max_concurrency: int | None
    throughput_at_max: float | None
    tokens_in_flight: float | None

    def tables(self) -> list[Table]:
        rows = [
            [
                f"{r.offered:.0f}",
                f"{r.request_rps:.2f}",
                f"{r.output_tps:.1f}",
                pct(r.success_rate),
                ms(r.ttft.p99),
                ms(r.tpot.p99),
                str(r.requests - r.succeeded),
                "Pass" if r.slo_met else "Fail",
            ]
            for r in self.levels
        ]
        note = f"Maximum concurrent requests meeting criteria: {num(self.max_concurrency, '.0f')}"
        summary = [
            ["Maximum concurrent requests", num(self.max_concurrency, ".0f")],
            ["Output throughput at that concurrency", num(self.throughput_at_max, ".1f", " tok/s")],
            ["Tokens in flight at maximum (approx.)", num(self.tokens_in_flight, ".0f")],
            *capacity_rows(self.battery_capacity),
        ]
        return [
            Table(
                title="Capacity Search Results (Table 7)",
                columns=[
                    "Concurrency",
                    "Achieved (req/s)",
                    "Output (tok/s)",
                    "Completion",
                    "TTFT P99",
                    "TPOT P99",
                    "Errors",
                    "Status",
                ],
                rows=rows,
                note=note,
            ),
            Table(title="Capacity summary", columns=["Metric", "Value"], rows=summary),
        ]

    def headline(self) -> dict[str, str]:
        return {"Max concurrency": num(self.max_concurrency, ".0f")}


def judge_closed_level(
    ctx: BatteryContext, window: StageWindow, concurrency: int, test: str, label: str
) -> tuple[LevelRow, int]:
    """A closed-loop level judged by 5.5's criteria (completion, TTFT P99, no out-of-memory error) and
    entered in the capacity ledger; also its count of out-of-memory failures (5.5 and 5.8)."""
    lat = window.latencies
    oom = int(sum(is_oom(e) for e in lat.loc[~lat["ok"], "error"]))
    row = level_row(window, concurrency, loop="closed")
    row.slo_met = closed_criteria(row, ctx.profile.capacity_ttft_p99_ms) and not oom
    ctx.ledger.append(ledger_entry(test, label, row))
    return row, oom


async def _e2e_probe(ctx: BatteryContext, requests: Iterator[RequestSpec]) -> float:
    """Median end-to-end time of a few requests one at a time (memoised: 5.8 reuses 5.5's)."""
    if "capacity_e2e_s" not in ctx.estimates:
        scheduler = parse_scheduler({"kind": "concurrency", "concurrency": 1})
        run = await ctx.run(
            "capacity/e2e-probe", [Stage.scheduled("probe", scheduler, requests, max_requests=3)]
        )
        lat = run.stage("probe").latencies
        e2e = lat.loc[lat["ok"], "e2e_s"].astype(float)
        if e2e.empty:
            raise RuntimeError("5.5's end-to-end probe completed no request; is the engine serving?")
        ctx.estimates["capacity_e2e_s"] = float(e2e.median())
    return ctx.estimates["capacity_e2e_s"]


async def find_max_concurrency(ctx: BatteryContext) -> CapacityData:
    """Run the 5.5 search (memoised in ``ctx.estimates['max_concurrency']`` for 5.8)."""
    p = ctx.profile
    spec = ctx.workload_spec()
    requests = (dataclasses.replace(r, max_tokens=p.capacity_output) for r in ctx.requests(spec))
    rows: dict[float, LevelRow] = {}
    e2e_s = await _e2e_probe(ctx, requests)

    async def passes(concurrency: float) -> bool:
        c = int(concurrency)
        scheduler = parse_scheduler({"kind": "concurrency", "concurrency": c})
        count = level_requests(c, p.capacity_completions_per_slot, p.capacity_duration_s, e2e_s)
        stage = Stage.scheduled("level", scheduler, requests, max_requests=count)
        run = await ctx.run(f"capacity/c{c}", [stage])
        rows[c], _ = judge_closed_level(ctx, run.stage("level"), c, "5.5", f"concurrency {c}")
        return bool(rows[c].slo_met)

    best, steps = await search_max(
        passes, initial=p.capacity_initial, maximum=p.capacity_max, minimum=1, resolution=1, integer=True
    )
    at = rows.get(best) if best is not None else None
    in_flight = None
    if at is not None and best is not None:
        ctx.estimates["max_concurrency"] = best
        ok = [r for r in rows.values() if r.offered == best]
        in_flight = best * (ok[0].input_tps / max(ok[0].request_rps, 1e-9) + p.capacity_output / 2)
    return CapacityData(
        workload=spec.name,
        output_tokens=p.capacity_output,
        ttft_p99_limit_ms=p.capacity_ttft_p99_ms,
        levels=sorted(rows.values(), key=lambda r: r.offered),
        search=steps,
        max_concurrency=None if best is None else int(best),
        throughput_at_max=None if at is None else at.output_tps,
        tokens_in_flight=in_flight,
    )


def _plan(i: PlanInputs) -> Estimate:
    p = i.profile
    n = max(1, int(math.log2(p.capacity_max / p.capacity_initial)) + 3)
    level_s = max(p.capacity_duration_s, p.capacity_completions_per_slot * i.probe.e2e_s)  # level_requests
    return Estimate(n, int(n * i.probe.rps * level_s), n * i.level_s(level_s))


_CAPTION = "Figure 5.5: TTFT P99 (ms) per closed-loop concurrency, against the success criterion."


def _capacity_search(data: CapacityData) -> Figure:
    fig, (ax,) = new_figure()
    for row in data.levels:
        y = np.nan if row.ttft.p99 is None else row.ttft.p99 * 1e3
        ax.scatter(row.offered, y, color="C2" if row.slo_met else "C3", zorder=3)
    ax.axhline(data.ttft_p99_limit_ms, color="grey", ls=":", lw=1, label="TTFT P99 limit")
    ax.scatter([], [], color="C2", label="pass")
    ax.scatter([], [], color="C3", label="fail")
    ax.set(xlabel="concurrency", ylabel="TTFT P99 (ms)", title="5.5 capacity search")
    plain_log(ax, base=2)
    ax.legend()
    return fig


@register_test(
    "capacity",
    "5.5",
    "Concurrent Request Capacity",
    estimate=_plan,
    figure=FigureSpec(_capacity_search, _CAPTION),
)
async def run_capacity(ctx: BatteryContext) -> Outcome:
    p = ctx.profile
    data = await find_max_concurrency(ctx)
    per_slot = min((r.succeeded / max(r.offered, 1) for r in data.levels), default=0.0)
    shortest = min(((r.window_s or 0.0) + r.steady.ramp_s for r in data.levels), default=0.0)
    reqs = [
        must("5.5.2", "fixed output length", True, f"{data.output_tokens} tokens"),
        must(
            "5.5.3",
            "each level runs ≥ 60 s and ≥ 100 completions per slot",
            shortest >= 60 and per_slot >= 100,
            f"shortest level {shortest:.1f} s; fewest completions per slot {per_slot:.1f} (the profile asks "
            f"{p.capacity_completions_per_slot} per slot and {p.capacity_duration_s:g} s)",
        ),
        must(
            "5.5.3", "the search found a concurrency meeting the criteria", data.max_concurrency is not None
        ),
    ]
    notes = [f"success criteria: completion ≥ 99%, TTFT P99 ≤ {data.ttft_p99_limit_ms:g} ms, no OOM error"]
    if data.max_concurrency == p.capacity_max:
        notes.append(f"the search reached its upper bound {p.capacity_max}: capacity is at least that")
    return Outcome(data, reqs, notes)
