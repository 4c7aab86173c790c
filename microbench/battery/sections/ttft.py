"""5.1 Time to First Token: the distribution under open-loop Poisson load, by input length, with components.

TTFT is the first content chunk (a chunk carrying at least one token by the server's running usage; the
chat role announcement is not one) minus the actual send time. Load: Poisson at ``ttft_load`` of the
battery's sustainable rate (5.2). Queue and prefill components come from the engine's /metrics histograms
(their mean over the test) where the engine's metric table names them. The load level (offered, sent
and achieved rate) is summarised as every level is (``levels.level_row``) and entered in the capacity
ledger.
"""

from __future__ import annotations

from typing import Literal

import numpy as np
from matplotlib.figure import Figure

from benchcore.schema import StrictModel
from microbench.battery.compliance import must, should
from microbench.battery.context import BatteryContext
from microbench.battery.plan import Estimate, PlanInputs
from microbench.battery.plots import new_figure, plain_log
from microbench.battery.registry import FigureSpec, Outcome, register_test, sample_requirements
from microbench.battery.report import TEST_DATA, Table, TestData, level_rate_rows, ms
from microbench.loadgen.stages import Stage
from microbench.measure.levels import LevelRow, ledger_entry, level_row
from microbench.measure.stats import Distribution, length_bucket_label, summarize
from microbench.workloads.schedulers import parse_scheduler

__all__ = ["BucketRow", "TtftData", "distribution_table", "run_ttft"]


class BucketRow(StrictModel):
    """TTFT percentiles of one input-length bucket (5.1.4.2)."""

    bucket: str
    count: int
    p50_s: float | None
    p95_s: float | None
    p99_s: float | None


@TEST_DATA.register("ttft")
class TtftData(TestData):
    test: Literal["ttft"] = "ttft"
    workload: str
    load: str
    rate: float
    requests: int
    succeeded: int
    duration_s: float
    ttft: Distribution
    tpot: Distribution
    samples_s: list[float]
    by_length: list[BucketRow]
    prefill_mean_s: float | None = None
    queue_mean_s: float | None = None
    level: LevelRow | None = None  # None in reports written before levels were kept here

    def tables(self) -> list[Table]:
        tables = [distribution_table("TTFT Results (Table 1)", "TTFT", self.ttft, self.requests)]
        if self.level is not None:
            tables.append(level_rate_rows("Load level: offered and achieved", [self.level]))
        if len(self.by_length) > 1:
            rows = [[b.bucket, str(b.count), ms(b.p50_s), ms(b.p95_s), ms(b.p99_s)] for b in self.by_length]
            tables.append(
                Table(
                    title="TTFT by Input Length (Table 2)",
                    columns=["Input Tokens", "Count", "P50", "P95", "P99"],
                    rows=rows,
                )
            )
        tables.append(
            Table(
                title="TTFT components (server /metrics)",
                columns=["Component", "Mean"],
                rows=[
                    [name, "not exposed by the engine's metrics" if value is None else ms(value)]
                    for name, value in (("Queue wait", self.queue_mean_s), ("Prefill", self.prefill_mean_s))
                ],
            )
        )
        return tables

    def headline(self) -> dict[str, str]:
        return {
            "TTFT P50": ms(self.ttft.p50),
            "TTFT P99": ms(self.ttft.p99),
            "TPOT P50": ms(self.tpot.p50),
            "TPOT P99": ms(self.tpot.p99),
        }


def distribution_table(title: str, label: str, dist: Distribution, requests: int) -> Table:
    """Table 1 / Table 6 layout: count, percentiles, mean, min, max (ms)."""
    rows = [["Requests", str(requests)], ["Samples", str(dist.count)]]
    for name, value in (
        ("P50", dist.p50),
        ("P90", dist.p90),
        ("P95", dist.p95),
        ("P99", dist.p99),
        ("P99.9", dist.p999),
        ("Mean", dist.mean),
        ("Std Dev", dist.std),
        ("Min", dist.min),
        ("Max", dist.max),
    ):
        rows.append([f"{label} {name}", ms(value)])
    return Table(title=title, columns=["Metric", "Value"], rows=rows)


def _plan(i: PlanInputs) -> Estimate:
    p = i.profile
    return Estimate(1, p.ttft_requests, p.ttft_requests / (p.ttft_load * i.probe.rps) + i.probe.e2e_s)


_CAPTION = (
    "Figure 5.1: cumulative distribution of TTFT (ms) over every request of the test, with P50/P99 marks."
)


def _ttft_cdf(data: TtftData) -> Figure:
    fig, (ax,) = new_figure()
    values = np.asarray(data.samples_s) * 1e3
    ax.step(values, np.arange(1, values.size + 1) / values.size, where="post", color="C0")
    for q, style in ((0.5, ":"), (0.99, "--")):
        if values.size:
            ax.axvline(np.percentile(values, q * 100), color="grey", ls=style, lw=1, label=f"P{q * 100:g}")
    ax.set(
        xlabel="TTFT (ms)",
        ylabel="fraction of requests",
        title=f"TTFT CDF ({data.workload}, {values.size} requests)",
    )
    if values.size and values.max() / max(values.min(), 1e-9) > 20:
        plain_log(ax)
    ax.legend(loc="lower right")
    return fig


@register_test(
    "ttft",
    "5.1",
    "Time to First Token",
    estimate=_plan,
    needs_capacity=True,
    figure=FigureSpec(_ttft_cdf, _CAPTION),
)
async def run_ttft(ctx: BatteryContext) -> Outcome:
    p = ctx.profile
    capacity = await ctx.capacity_rps()
    rate = p.ttft_load * capacity
    spec = ctx.workload_spec()
    scheduler = parse_scheduler({"kind": "poisson", "rate": rate, "seed": ctx.seed})
    stage = Stage.scheduled("ttft", scheduler, ctx.requests(spec), max_requests=p.ttft_requests)
    before = await ctx.scrape()
    run = await ctx.run("ttft", [stage])
    after = await ctx.scrape()
    window = run.stage("ttft")
    level = level_row(window, rate)
    ctx.ledger.append(ledger_entry("5.1", f"{p.ttft_load:.0%} level, {rate:.2f} req/s offered", level))
    lat = window.latencies
    ok = lat[lat["ok"]]
    buckets = []
    labels = ok["input_tokens"].map(length_bucket_label)
    for label in sorted(labels.unique(), key=lambda s: int(s.split("-")[0].rstrip("+"))):
        d = summarize(ok.loc[labels == label, "ttft_s"])
        buckets.append(BucketRow(bucket=label, count=d.count, p50_s=d.p50, p95_s=d.p95, p99_s=d.p99))

    def mean_s(names: tuple[str, ...]) -> float | None:
        """Mean of a server histogram over the run (its _sum and _count deltas)."""
        if before is None or after is None or not names:
            return None
        total = after.delta(before, [f"{n}_sum" for n in names])
        count = after.delta(before, [f"{n}_count" for n in names])
        return total / count if total is not None and count else None

    data = TtftData(
        workload=spec.name,
        load=(
            f"open loop, Poisson {rate:.2f} req/s "
            f"({p.ttft_load:.0%} of the sustainable rate {capacity:.2f} req/s, 5.2)"
        ),
        rate=rate,
        requests=len(lat),
        succeeded=len(ok),
        duration_s=window.end_s - window.start_s,
        ttft=summarize(ok["ttft_s"]),
        tpot=summarize(ok["tpot_s"]),
        samples_s=sorted(float(v) for v in ok["ttft_s"] if np.isfinite(v)),
        by_length=buckets,
        prefill_mean_s=mean_s(ctx.engine.metrics.prefill_time),
        queue_mean_s=mean_s(ctx.engine.metrics.queue_time),
        level=level,
    )
    reqs = sample_requirements("5.1.2.1", data.ttft.count)
    reqs += [
        must("5.1.2.2", "open-loop arrivals are Poisson", True, f"Poisson, {rate:.2f} req/s"),
        must("5.1.4.1", "P50, P90, P95, P99 and P99.9 are reported", data.ttft.count > 0),
        must("5.1.4.3", "the sample count is stated", True, f"{data.ttft.count} samples"),
        should("5.1.5.4", "a CDF or histogram of TTFT is included", data.ttft.count > 0, "CDF figure"),
    ]
    notes = [
        "TTFT = first content chunk (at least one token by the server's usage) − actual send (5.1.3.1); "
        "SSE framing and chat role announcements are not tokens",
        *run.generator_warnings,
    ]
    if data.succeeded < data.requests:
        notes.append(
            f"{data.requests - data.succeeded} of {data.requests} requests failed; TTFT is over the rest"
        )
    return Outcome(data, reqs, notes)
