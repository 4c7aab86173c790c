"""5.2 Output Token Throughput: search for the maximum sustainable open-loop rate, then report it.

Each probe is a Poisson stage of ``level_duration_s``. A level is sustainable when none of 5.2.3.1's
saturation signs shows over its steady window (queue growing, completions < 90% of arrivals, end-to-end
P99 above 10× the P50 of a lower level probed before) and, when SLOs are set, its TTFT/TPOT P99 meet
them. ``stats.search_max`` brackets and bisects the rate starting from half the preliminary estimate.
"""

from __future__ import annotations

from typing import Literal

from microbench.battery.compliance import must, should
from microbench.battery.context import BatteryContext
from microbench.battery.levels import LevelRow, level_row
from microbench.battery.registry import Outcome, duration_requirement, register_test
from microbench.battery.report import TEST_DATA, Table, TestData, ms, num
from microbench.battery.stats import SearchStep, search_max
from microbench.loadgen.stages import Stage
from microbench.workloads.schedulers import parse_scheduler

__all__ = ["ThroughputData", "run_throughput"]


@TEST_DATA.register("throughput")
class ThroughputData(TestData):
    test: Literal["throughput"] = "throughput"
    workload: str
    estimate_rps: float
    levels: list[LevelRow]
    search: list[SearchStep]
    sustainable_rps: float | None
    at_max: LevelRow | None
    per_device: str
    device_count: int
    ttft_slo_ms: float | None = None
    tpot_slo_ms: float | None = None

    def tables(self) -> list[Table]:
        m = self.at_max
        per = None if m is None else m.output_tps / max(self.device_count, 1)
        summary = [
            ["Max Output Throughput", num(None if m is None else m.output_tps, ".1f", " tok/s")],
            ["Max Request Throughput", num(None if m is None else m.request_rps, ".2f", " req/s")],
            ["Max Input Throughput", num(None if m is None else m.input_tps, ".1f", " tok/s")],
            ["Sustainable Load", num(self.sustainable_rps, ".2f", " req/s")],
            [f"Tokens per {self.per_device}-second", num(per, ".1f", f" tok/s/{self.per_device}")],
            ["Batch utilization", "not measured"],
        ]
        tables = [Table(title="Throughput Summary (Table 3)", columns=["Metric", "Value"], rows=summary)]
        if m is not None:
            rows = [
                [name, ms(d.p50), ms(d.p95), ms(d.p99)]
                for name, d in (("TTFT", m.ttft), ("TPOT", m.tpot), ("End-to-End", m.e2e))
            ]
            tables.append(
                Table(
                    title="Latency at Maximum Throughput (Table 4)",
                    columns=["Metric", "P50", "P95", "P99"],
                    rows=rows,
                )
            )
        probes = [
            [
                f"{r.offered:.2f}",
                f"{r.output_tps:.1f}",
                f"{r.steady.completion_rate:.2f}",
                ms(r.e2e.p99),
                "no" if r.steady.saturated else "yes",
                "–" if r.slo_met is None else ("yes" if r.slo_met else "no"),
                "; ".join(r.steady.reasons) or "–",
            ]
            for r in self.levels
        ]
        tables.append(
            Table(
                title="Search probes (in the order run)",
                columns=[
                    "Rate (r/s)",
                    "Output tok/s",
                    "Completions/s",
                    "E2E P99",
                    "Sustainable",
                    "SLO met",
                    "Saturation signs",
                ],
                rows=probes,
            )
        )
        return tables

    def headline(self) -> dict[str, str]:
        return {
            "Max Throughput": num(None if self.at_max is None else self.at_max.output_tps, ".1f", " tok/s")
        }


def _sustainable(
    row: LevelRow, lower_p50: float | None, ttft_slo_ms: float | None, tpot_slo_ms: float | None
) -> bool:
    if lower_p50 is not None and row.e2e.p99 is not None and row.e2e.p99 > 10 * lower_p50:
        row.steady.reasons.append(f"E2E P99 {row.e2e.p99:.3f} s > 10× P50 {lower_p50:.3f} s at a lower load")
        row.steady.saturated = True
    slo = True
    if ttft_slo_ms is not None:
        slo = slo and row.ttft.p99 is not None and row.ttft.p99 * 1e3 <= ttft_slo_ms
    if tpot_slo_ms is not None:
        slo = slo and row.tpot.p99 is not None and row.tpot.p99 * 1e3 <= tpot_slo_ms
    row.slo_met = slo if (ttft_slo_ms or tpot_slo_ms) else None
    return not row.steady.saturated and slo


@register_test("throughput", "5.2", "Output Token Throughput")
async def run_throughput(ctx: BatteryContext) -> Outcome:
    p = ctx.profile
    estimate = await ctx.capacity_rps()
    spec = ctx.workload_spec()
    requests = ctx.requests(spec)
    rows: dict[float, LevelRow] = {}

    async def passes(rate: float) -> bool:
        scheduler = parse_scheduler({"kind": "poisson", "rate": rate, "seed": ctx.seed + len(rows)})
        stage = Stage.scheduled("level", scheduler, requests, duration_s=p.level_duration_s)
        run = await ctx.run(f"throughput/rate-{rate:.3f}", [stage])
        row = level_row(run.stage("level"), rate)
        lower = [r.e2e.p50 for k, r in sorted(rows.items()) if k < rate and r.e2e.p50 is not None]
        rows[rate] = row
        return _sustainable(row, lower[0] if lower else None, ctx.ttft_slo_ms, ctx.tpot_slo_ms)

    best, steps = await search_max(
        passes,
        initial=0.5 * estimate,
        maximum=2.0 * estimate,
        minimum=0.05 * estimate,
        resolution=0.1 * estimate,
        max_probes=p.search_probes,
    )
    at_max = rows.get(best) if best is not None else None
    if best is not None:
        ctx.estimates["capacity_rps"] = best
    per_device = "GPU" if ctx.accelerators else "CPU core"
    data = ThroughputData(
        workload=spec.name,
        estimate_rps=estimate,
        levels=list(rows.values()),
        search=steps,
        sustainable_rps=best,
        at_max=at_max,
        per_device=per_device,
        device_count=ctx.accelerators or ctx.cpu_count,
        ttft_slo_ms=ctx.ttft_slo_ms,
        tpot_slo_ms=ctx.tpot_slo_ms,
    )
    bracketed = any(s.passed for s in steps) and any(not s.passed for s in steps)
    reqs = [
        duration_requirement("5.2.2.1", p.level_duration_s, 60.0),
        duration_requirement("5.2.2.1", p.level_duration_s, 300.0, level="SHOULD"),
        must(
            "5.2.3",
            "a sustainable load level was found",
            at_max is not None,
            "none of the probed rates was sustainable" if at_max is None else f"{best:.2f} req/s",
        ),
        should(
            "5.2.3",
            "the search bracketed the maximum (a sustainable and a saturated level)",
            bracketed,
            f"{len(steps)} probes",
        ),
        must(
            "5.2.3.2",
            "queue depth stable at the reported level",
            at_max is not None and not at_max.steady.queue_growing,
        ),
        should(
            "5.2.3.2",
            "throughput stable across the reported level (halves within 20%)",
            at_max is not None and at_max.steady.throughput_stable,
            ""
            if at_max is None
            else f"{at_max.steady.throughput_first_half:.1f} vs "
            f"{at_max.steady.throughput_second_half:.1f} tok/s",
        ),
        must("5.2.3.2", "the first 10% of each level is excluded (ramp-up)", True),
    ]
    notes = [f"preliminary estimate {estimate:.2f} req/s from a closed-loop probe"]
    if not ctx.accelerators:
        notes.append("no GPU: tokens per CPU-core-second stand in for tokens per GPU-second (5.2.4.2)")
    return Outcome(data, reqs, notes)
