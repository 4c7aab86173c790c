"""5.3 Throughput–Latency Trade-off: open-loop Poisson levels from 10% to 120% of the battery's capacity.

The levels are fractions of the sustainable rate the capacity measurement found (5.2). One session runs
them in ascending order (each drained before the next); every level goes into the capacity ledger.
Derived points (5.3.4), each rule printed under the table (``stats``): knee = first level whose TTFT
P99 exceeds 2× the smallest TTFT P99; saturation = first level whose achieved output throughput falls
below the previous level's by more than their combined 95% Poisson half-widths; optimal = the
sustainable level with the highest throughput whose TTFT P99 meets the SLO (``ttft_slo_ms``, 500 ms by
default, as in Appendix C.1).
"""

from __future__ import annotations

from typing import Literal

import numpy as np
from matplotlib.figure import Figure

from microbench.battery.compliance import must
from microbench.battery.context import BatteryContext
from microbench.battery.plan import Estimate, PlanInputs
from microbench.battery.plots import new_figure, plain_log
from microbench.battery.registry import FigureSpec, Outcome, duration_requirement, register_test
from microbench.battery.report import TEST_DATA, Table, TestData, num, pct
from microbench.loadgen.stages import Stage
from microbench.measure.levels import LevelRow, ledger_entry, level_row
from microbench.measure.stats import knee_point, optimal_point, saturation_point
from microbench.workloads.schedulers import parse_scheduler

__all__ = ["TradeoffData", "run_tradeoff"]


def _ms(v: float | None) -> str:
    return "–" if v is None else f"{v * 1e3:.0f}"


@TEST_DATA.register("tradeoff")
class TradeoffData(TestData):
    test: Literal["tradeoff"] = "tradeoff"
    workload: str
    capacity_rps: float
    fractions: list[float]
    levels: list[LevelRow]
    ttft_slo_ms: float
    knee_rps: float | None
    saturation_rps: float | None
    optimal_rps: float | None

    @property
    def optimal_row(self) -> LevelRow | None:
        return next((r for r in self.levels if r.offered == self.optimal_rps), None)

    @property
    def throughput_within_slo(self) -> float | None:
        """Achieved output tok/s at the optimal point (C.1's "Throughput at P99 TTFT < SLO")."""
        row = self.optimal_row
        return None if row is None else row.output_tps

    def tables(self) -> list[Table]:
        rows = [
            [
                f"{r.offered:.2f}",
                num(r.sent_rps, ".2f"),
                f"{r.request_rps:.2f}",
                f"{r.output_tps:.1f}",
                _ms(r.ttft.p50),
                _ms(r.ttft.p99),
                _ms(r.tpot.p50),
                _ms(r.tpot.p99),
                _ms(r.e2e.p99),
                pct(r.success_rate),
                "growing" if r.steady.queue_growing else "stable",
                "yes" if r.sustainable else "no",
            ]
            for r in self.levels
        ]
        table = Table(
            title="Throughput-Latency Table (Table 5), latencies in ms",
            columns=[
                "Offered (req/s)",
                "Sent (req/s)",
                "Achieved (req/s)",
                "Achieved (tok/s)",
                "TTFT P50",
                "TTFT P99",
                "TPOT P50",
                "TPOT P99",
                "E2E P99",
                "Success",
                "Queue",
                "Sustainable",
            ],
            rows=rows,
            note=(
                f"Levels are fractions of the sustainable rate {self.capacity_rps:.2f} req/s (5.2). "
                f"Knee point: {num(self.knee_rps, '.2f', ' req/s')} (first level whose TTFT P99 > 2× the "
                f"smallest TTFT P99); saturation point: {num(self.saturation_rps, '.2f', ' req/s')} (first "
                "level whose achieved tok/s falls below the previous level's by more than their combined "
                "95% Poisson half-widths); optimal operating point: "
                f"{num(self.optimal_rps, '.2f', ' req/s')} (the sustainable level with the highest "
                f"achieved tok/s whose TTFT P99 ≤ {self.ttft_slo_ms:g} ms)"
            ),
        )
        return [table]

    def headline(self) -> dict[str, str]:
        return {
            f"Throughput at P99 TTFT < {self.ttft_slo_ms:g} ms": num(
                self.throughput_within_slo, ".1f", " tok/s"
            )
        }


def _plan(i: PlanInputs) -> Estimate:
    p, n = i.profile, len(i.profile.tradeoff_levels)
    reqs = sum(f * i.probe.rps * p.level_duration_s for f in p.tradeoff_levels)
    return Estimate(n, int(reqs), n * i.level_s(p.level_duration_s))


_CAPTION = (
    "Figure 5.3: achieved output tokens/s and TTFT P99 (ms) against the offered rate (req/s), with the "
    "knee, saturation and optimal points."
)


def _tradeoff_curve(data: TradeoffData) -> Figure:
    fig, (left, right) = new_figure(2)
    offered = [r.offered for r in data.levels]
    left.plot(offered, [r.output_tps for r in data.levels], "o-", color="C0")
    left.set(xlabel="offered load (req/s)", ylabel="achieved output tokens/s", title="achieved vs offered")
    for x, label, color in (
        (data.knee_rps, "knee", "C1"),
        (data.saturation_rps, "saturation", "C3"),
        (data.optimal_rps, "optimal", "C2"),
    ):
        if x is not None:
            left.axvline(x, color=color, ls="--", lw=1, label=label)
    left.legend()
    tps = [r.output_tps for r in data.levels]
    for key, style in (("p50", "o-"), ("p99", "s--")):
        right.plot(
            tps,
            [getattr(r.ttft, key) * 1e3 if getattr(r.ttft, key) is not None else np.nan for r in data.levels],
            style,
            label=f"TTFT {key.upper()}",
        )
    right.axhline(data.ttft_slo_ms, color="grey", ls=":", lw=1, label=f"SLO {data.ttft_slo_ms:g} ms")
    right.set(
        xlabel="achieved output tokens/s", ylabel="TTFT (ms)", title="throughput–latency curve (load order)"
    )
    plain_log(right, "y")
    right.legend()
    return fig


@register_test(
    "tradeoff",
    "5.3",
    "Throughput-Latency Trade-off",
    estimate=_plan,
    needs_capacity=True,
    figure=FigureSpec(_tradeoff_curve, _CAPTION),
)
async def run_tradeoff(ctx: BatteryContext) -> Outcome:
    p = ctx.profile
    capacity = await ctx.capacity_rps()
    spec = ctx.workload_spec()
    requests = ctx.requests(spec)
    fractions = sorted(p.tradeoff_levels)
    stages = [
        Stage.scheduled(
            f"load-{f:g}",
            parse_scheduler({"kind": "poisson", "rate": f * capacity, "seed": ctx.seed + i}),
            requests,
            duration_s=p.level_duration_s,
        )
        for i, f in enumerate(fractions)
    ]
    run = await ctx.run("tradeoff", stages)
    rows = [level_row(run.stage(f"load-{f:g}"), f * capacity) for f in fractions]
    slo = ctx.ttft_slo_ms or p.ttft_slo_ms
    for f, r in zip(fractions, rows, strict=True):
        ctx.ledger.append(ledger_entry("5.3", f"{f:.0%} level, {r.offered:.2f} req/s offered", r))
    offered = [r.offered for r in rows]
    achieved: list[float | None] = [r.output_tps for r in rows]
    meets = [r.sustainable and r.ttft.p99 is not None and r.ttft.p99 * 1e3 <= slo for r in rows]
    for r in rows:  # after the ledger saw the saturation verdict alone
        r.slo_met = r.ttft.p99 is not None and r.ttft.p99 * 1e3 <= slo
    data = TradeoffData(
        workload=spec.name,
        capacity_rps=capacity,
        fractions=fractions,
        levels=rows,
        ttft_slo_ms=slo,
        knee_rps=knee_point(offered, [r.ttft.p99 for r in rows]),
        saturation_rps=saturation_point(offered, achieved, [r.output_tps_ci for r in rows]),
        optimal_rps=optimal_point(offered, achieved, meets),
    )
    reqs = [
        must("5.3.2", "at least 10 load levels", len(fractions) >= 10, f"{len(fractions)} levels"),
        must(
            "5.3.2",
            "levels span 10% of estimated capacity to saturation",
            min(fractions) <= 0.1 and (max(fractions) >= 1.0 or data.saturation_rps is not None),
            f"{min(fractions):.0%} … {max(fractions):.0%}",
        ),
        must("5.3.2", "open-loop load", True, "Poisson"),
        duration_requirement("5.3.2", p.level_duration_s, 60.0),
    ]
    notes = [f"levels scale by the battery's sustainable rate {capacity:.2f} req/s (5.2)"]
    if ctx.capacity_note:
        notes.append(ctx.capacity_note)
    return Outcome(data, reqs, [*notes, *run.generator_warnings])
