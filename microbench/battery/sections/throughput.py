"""5.2 Output Token Throughput: the battery's one capacity measurement, reported.

``measure.capacity.measure_capacity`` runs once per battery (whichever test needs the capacity first): a
closed-loop ramp, then an open-loop search for the highest sustainable Poisson rate, each level judged by
``saturation.SATURATION_RULE`` (after the ramp, over several E2E times). Every level goes into the capacity
ledger; the maximum this test shows is the ledger's (``sustainable.capacity_from``), the same figure
C.1, 5.3, 5.5 and 5.10 show.

Batch utilization (5.2.4.2) is ``batch_utilization``: the engine's running-request gauge, time-averaged over
the judged window of the level at the sustainable rate (its /metrics series, ``LevelRow.mean_running``),
divided by the engine's maximum batch size (its ``max_num_seqs`` setting).
"""

from __future__ import annotations

from typing import ClassVar, Literal

from matplotlib.figure import Figure
from pydantic import Field

from microbench.battery.compliance import must, should
from microbench.battery.context import BatteryContext
from microbench.battery.plots import new_figure
from microbench.battery.registry import FigureSpec, Outcome, duration_requirement, register_test
from microbench.battery.report import TEST_DATA, Table, TestData, capacity_rows, level_rate_rows, ms, num
from microbench.measure.capacity import CapacitySearch
from microbench.measure.levels import LevelRow
from microbench.measure.search import RESOLUTION

__all__ = ["ThroughputData", "batch_utilization", "run_throughput"]


def batch_utilization(mean_running: float | None, max_batch: int | None) -> tuple[float | None, str]:
    """5.2.4.2: average batch size / maximum batch size, and the cell that shows it (why not, if not)."""
    if mean_running is None:
        return None, "not measured (the engine's /metrics gave no running-request series)"
    if not max_batch:
        return (
            None,
            f"average batch {mean_running:.1f} requests; maximum batch size not known (max_num_seqs unset)",
        )
    util = mean_running / max_batch
    return util, f"{util:.1%} (average batch {mean_running:.1f} of max_num_seqs {max_batch})"


@TEST_DATA.register("throughput")
class ThroughputData(TestData):
    shows_capacity: ClassVar[bool] = True
    test: Literal["throughput"] = "throughput"
    workload: str
    search: CapacitySearch
    at_max: LevelRow | None = Field(default=None, description="the open-loop level at the sustainable rate")
    per_device: str
    device_count: int
    ttft_slo_ms: float | None = None
    tpot_slo_ms: float | None = None
    max_batch: int | None = Field(default=None, description="the engine's max_num_seqs (None: not known)")

    def tables(self) -> list[Table]:
        m = self.at_max
        cap = self.battery_capacity
        per = (
            None
            if cap is None or cap.max_output_tps is None
            else cap.max_output_tps / max(self.device_count, 1)
        )
        summary = [
            *capacity_rows(cap),
            [
                "Max Input Throughput (at the sustainable rate)",
                num(None if m is None else m.input_tps, ".1f", " tok/s"),
            ],
            [f"Tokens per {self.per_device}-second", num(per, ".1f", f" tok/s/{self.per_device}")],
            [
                "Batch utilization",
                batch_utilization(None if m is None else m.mean_running, self.max_batch)[1],
            ],
        ]
        tables = [Table(title="Throughput Summary (Table 3)", columns=["Metric", "Value"], rows=summary)]
        if m is not None:
            rows = [
                [name, ms(d.p50), ms(d.p95), ms(d.p99)]
                for name, d in (("TTFT", m.ttft), ("TPOT", m.tpot), ("End-to-End", m.e2e))
            ]
            tables.append(
                Table(
                    title=f"Latency at the maximum sustainable rate, {m.tested_rps:.2f} req/s "
                    f"({m.offered:.2f} offered) (Table 4)",
                    columns=["Metric", "P50", "P95", "P99"],
                    rows=rows,
                )
            )
        tables.append(
            level_rate_rows(
                "Capacity phase 1: closed-loop ramp (concurrency doubled until two levels gained ≤ 10%)",
                self.search.closed_loop,
            )
        )
        tables.append(
            level_rate_rows("Capacity phase 2: open-loop search (in the order run)", self.search.open_loop)
        )
        return tables


_CAPTION = (
    "Figure 5.2: open-loop levels of the capacity search: achieved output tokens/s (± 95% Poisson "
    "half-width) against the offered rate (req/s); green sustainable, red saturated."
)


def _throughput_search(data: ThroughputData) -> Figure:
    fig, (ax,) = new_figure()
    for row in data.search.open_loop:
        ax.errorbar(
            row.offered,
            row.output_tps,
            yerr=row.output_tps_ci or 0,
            fmt="o",
            color="C2" if row.sustainable else "C3",
            zorder=3,
        )
    ax.scatter([], [], color="C2", label="sustainable")
    ax.scatter([], [], color="C3", label="saturated / SLO missed")
    if data.search.sustainable_rps is not None:
        ax.axvline(data.search.sustainable_rps, color="grey", ls="--", lw=1, label="max sustainable rate")
    ax.set(
        xlabel="offered load (req/s)", ylabel="output tokens/s (steady window)", title="5.2 throughput search"
    )
    ax.legend()
    return fig


@register_test(
    "throughput",
    "5.2",
    "Output Token Throughput",
    needs_capacity=True,
    figure=FigureSpec(_throughput_search, _CAPTION),
)
async def run_throughput(ctx: BatteryContext) -> Outcome:
    p = ctx.profile
    await ctx.capacity_rps()  # notes a capacity without a sustainable level
    search = await ctx.capacity_search()
    best = search.sustainable_rps
    at_max = next((r for r in search.open_loop if r.sustainable and r.tested_rps == best), None)
    data = ThroughputData(
        workload=ctx.workload_spec().name,
        search=search,
        at_max=at_max,
        per_device="GPU" if ctx.accelerators else "CPU core",
        device_count=ctx.accelerators or ctx.cpu_count,
        ttft_slo_ms=ctx.ttft_slo_ms,
        tpot_slo_ms=ctx.tpot_slo_ms,
        max_batch=ctx.engine.settings.get("max_num_seqs"),
    )
    utilization, utilization_text = batch_utilization(
        None if at_max is None else at_max.mean_running, data.max_batch
    )
    steps = search.search
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
            f"the search bracketed the maximum within {RESOLUTION:.0%} of the closed-loop rate",
            bracketed,
            f"{len(steps)} open-loop probes",
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
        must(
            "5.2.3.2",
            "the ramp-up is excluded (first 10% or two E2E times, whichever is longer)",
            True,
        ),
        should(
            "5.2.3.2",
            "the judged window spans at least three E2E times at the reported level",
            at_max is not None and at_max.steady.conclusive,
            "no sustainable level"
            if at_max is None
            else f"judged over {at_max.steady.window_s:.1f} s; E2E P50 of the first requests "
            + ("unknown" if at_max.steady.e2e_ref_s is None else f"{at_max.steady.e2e_ref_s:.2f} s"),
        ),
        should(
            "5.2.4.2",
            "batch utilization (average / maximum batch size) reported where measurable",
            utilization is not None,
            utilization_text,
        ),
    ]
    notes = [
        f"closed-loop service rate X = {search.closed_rps:.2f} req/s; open-loop levels at fractions of X",
        "Max Output Throughput is the highest achieved throughput among the levels judged sustainable "
        "anywhere in this battery (one ledger, one rule); its ± is the 95% Poisson half-width",
    ]
    if ctx.capacity_note:
        notes.append(ctx.capacity_note)
    if not ctx.accelerators:
        notes.append("no GPU: tokens per CPU-core-second stand in for tokens per GPU-second (5.2.4.2)")
    return Outcome(data, reqs, notes)
