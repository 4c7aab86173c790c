"""5.4 Inter-Token Latency Distribution at several open-loop load levels.

Method (4.6.3, declared in the report): Option A, chunk timing. Gaps are taken between consecutive SSE
chunks of a stream, never including the TTFT interval. The server's running usage gives the tokens of
each chunk; where every chunk carried one token the gaps are exactly inter-token latencies, otherwise the
report calls them "time between chunks" and gives the share of multi-token chunks.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Literal

import numpy as np
from matplotlib.figure import Figure
from pydantic import Field

from benchcore.schema import StrictModel
from microbench.battery.compliance import must, should
from microbench.battery.context import BatteryContext
from microbench.battery.plan import Estimate, PlanInputs
from microbench.battery.plots import new_figure, plain_log
from microbench.battery.registry import FigureSpec, Outcome, register_test
from microbench.battery.report import TEST_DATA, Table, TestData, level_rate_rows, ms, num
from microbench.battery.sections.ttft import distribution_table
from microbench.client.requests import RequestSpec
from microbench.loadgen.stages import Stage
from microbench.measure.levels import LevelRow, ledger_entry, level_row
from microbench.measure.stats import Distribution, inter_chunk_gaps, modality, summarize
from microbench.workloads.schedulers import parse_scheduler

__all__ = ["BURST_GAP_S", "ItlData", "ItlLevel", "itl_level", "run_itl", "tail_type"]

BURST_GAP_S = (
    1e-4  # gaps shorter than this are chunks that arrived together (after a stall), not decode steps
)


_TAIL_EXCEEDANCES = 30  # fewest gaps above P90 the tail is judged on


def tail_type(samples: np.ndarray) -> str:
    """5.4.4.3's tail character, from the excesses over P90: their coefficient of variation is 1 for an
    exponential tail (memoryless), below it for a bounded one, and above it for a power law (heavy).
    Bands: < 0.75 bounded, 0.75–1.5 exponential-type (a normal's reads 0.84), > 1.5 heavy."""
    values = np.asarray(samples, dtype=float)
    threshold = float(np.quantile(values, 0.9)) if values.size else 0.0
    excess = values[values > threshold] - threshold
    if excess.size < _TAIL_EXCEEDANCES or not excess.mean() > 0:
        return f"not classified (fewer than {_TAIL_EXCEEDANCES} gaps above P90)"
    cv = float(excess.std(ddof=1) / excess.mean())
    kind = "bounded" if cv < 0.75 else "exponential-type" if cv <= 1.5 else "heavy-tailed (power law)"
    return f"{kind}: CV of excesses over P90 {cv:.2f}"


class ItlLevel(StrictModel):
    """ITL statistics of one load level."""

    load_fraction: float
    rate: float
    requests: int
    min_output_tokens: int | None
    gaps: Distribution
    jitter: Distribution
    max_pause: Distribution
    tail_ratio: float | None
    modality: str
    tail_type: str = "not classified (report written before 5.4's tail type was kept)"
    multi_token_chunk_share: float
    burst_share: float = Field(..., description="share of gaps under 0.1 ms: chunks delivered together")
    histogram_edges_s: list[float]
    histogram_counts: list[int]
    level: LevelRow | None = None  # offered vs achieved (None in reports written before it was kept)


def itl_level(
    chunk_ns: list[list[int]],
    chunk_tokens: list[list[int]],
    load_fraction: float,
    rate: float,
    output_tokens: list[float],
) -> ItlLevel:
    """Aggregate, per-request and shape statistics of the chunk gaps of successful requests."""
    per_request = [inter_chunk_gaps(c) for c in chunk_ns]
    gaps = np.concatenate(per_request) if per_request else np.empty(0)
    jitters = [float(np.std(g, ddof=1)) for g in per_request if g.size > 1]
    pauses = [float(g.max()) for g in per_request if g.size]
    tokens = np.concatenate([np.asarray(t[1:], dtype=float) for t in chunk_tokens]) if chunk_tokens else []
    agg = summarize(gaps)
    positive = gaps[gaps > 0]
    if positive.size:
        edges = np.geomspace(positive.min(), positive.max() * 1.0001, 41)
        counts, _ = np.histogram(positive, bins=edges)
    else:
        edges, counts = np.empty(0), np.empty(0, dtype=int)
    return ItlLevel(
        load_fraction=load_fraction,
        rate=rate,
        requests=len(chunk_ns),
        min_output_tokens=int(min(output_tokens)) if output_tokens else None,
        gaps=agg,
        jitter=summarize(jitters),
        max_pause=summarize(pauses),
        tail_ratio=None if not agg.p50 or agg.p99 is None else agg.p99 / agg.p50,
        modality=modality(gaps),
        tail_type=tail_type(gaps),
        multi_token_chunk_share=float(np.mean(np.asarray(tokens) > 1)) if len(tokens) else 0.0,
        burst_share=float(np.mean(gaps < BURST_GAP_S)) if gaps.size else 0.0,
        histogram_edges_s=[float(e) for e in edges],
        histogram_counts=[int(c) for c in counts],
    )


@TEST_DATA.register("itl")
class ItlData(TestData):
    test: Literal["itl"] = "itl"
    workload: str
    method: str
    levels: list[ItlLevel]

    def tables(self) -> list[Table]:
        tables = []
        for lv in self.levels:
            t = distribution_table(
                (
                    f"ITL Results at {lv.load_fraction:.0%} of the sustainable rate, "
                    f"{lv.rate:.2f} req/s offered (Table 6)"
                ),
                "ITL",
                lv.gaps,
                lv.requests,
            )
            t.rows.append(["P99/P50 Ratio", num(lv.tail_ratio, ".2f")])
            t.rows.append(["Modality", lv.modality])
            t.rows.append(["Tail type", lv.tail_type])
            t.rows.append(["Multi-token chunks", f"{lv.multi_token_chunk_share:.1%}"])
            t.rows.append(["Gaps < 0.1 ms (burst delivery)", f"{lv.burst_share:.1%}"])
            tables.append(t)
        rows = [
            [
                f"{lv.load_fraction:.0%}",
                ms(lv.jitter.p50),
                ms(lv.jitter.p95),
                ms(lv.jitter.p99),
                ms(lv.max_pause.p50),
                ms(lv.max_pause.p95),
                ms(lv.max_pause.p99),
            ]
            for lv in self.levels
        ]
        if loads := [lv.level for lv in self.levels if lv.level is not None]:
            tables.append(level_rate_rows("Load levels: offered and achieved", loads))
        tables.append(
            Table(
                title="Per-request jitter (std of ITL) and maximum pause",
                columns=[
                    "Load",
                    "Jitter P50",
                    "Jitter P95",
                    "Jitter P99",
                    "Max pause P50",
                    "Max pause P95",
                    "Max pause P99",
                ],
                rows=rows,
            )
        )
        return tables


def _long_enough(requests: Iterator[RequestSpec], minimum: int) -> Iterator[RequestSpec]:
    for r in requests:
        yield r if r.max_tokens >= minimum else dataclasses.replace(r, max_tokens=minimum)


def _plan(i: PlanInputs) -> Estimate:
    p = i.profile
    secs = sum(p.itl_requests / (f * i.probe.rps) + 2 * i.probe.e2e_s for f in p.itl_levels)
    return Estimate(len(p.itl_levels), p.itl_requests * len(p.itl_levels), secs)


_CAPTION = "Figure 5.4: distribution of inter-chunk gaps (ms, log scale) per load level."


def _itl_histograms(data: ItlData) -> Figure:
    fig, (ax,) = new_figure()
    for lv in data.levels:
        if lv.histogram_counts:
            edges = np.asarray(lv.histogram_edges_s) * 1e3
            share = np.asarray(lv.histogram_counts) / max(sum(lv.histogram_counts), 1)
            ax.stairs(share, edges, label=f"{lv.load_fraction:.0%} load ({lv.gaps.count} gaps)")
    ax.set(xlabel="inter-chunk gap (ms)", ylabel="share of gaps", title="5.4 ITL distribution")
    plain_log(ax)
    ax.legend()
    return fig


@register_test(
    "itl",
    "5.4",
    "Inter-Token Latency Distribution",
    estimate=_plan,
    needs_capacity=True,
    figure=FigureSpec(_itl_histograms, _CAPTION),
)
async def run_itl(ctx: BatteryContext) -> Outcome:
    p = ctx.profile
    capacity = await ctx.capacity_rps()
    spec = ctx.workload_spec()
    requests = _long_enough(ctx.requests(spec), p.itl_min_output)
    fractions = sorted(p.itl_levels)
    stages = [
        Stage.scheduled(
            f"load-{f:g}",
            parse_scheduler({"kind": "poisson", "rate": f * capacity, "seed": ctx.seed + i}),
            requests,
            max_requests=p.itl_requests,
        )
        for i, f in enumerate(fractions)
    ]
    run = await ctx.run("itl", stages)
    levels = []
    for f in fractions:
        rows = run.frame[(run.frame["stage"] == f"load-{f:g}") & (run.frame["status"] == "ok")]
        load = level_row(run.stage(f"load-{f:g}"), f * capacity)
        ctx.ledger.append(ledger_entry("5.4", f"{f:.0%} level, {f * capacity:.2f} req/s offered", load))
        gaps = itl_level(
            [list(c) for c in rows["chunk_ns"]],
            [list(t) for t in rows["chunk_tokens"]],
            f,
            f * capacity,
            rows["output_tokens"].dropna().astype(float).tolist(),
        )
        levels.append(gaps.model_copy(update={"level": load}))
    multi = max((lv.multi_token_chunk_share for lv in levels), default=0.0)
    method = "Option A (chunk timing): gaps between SSE chunks; " + (
        "every chunk carried one token, so these are inter-token latencies"
        if multi == 0
        else f"up to {multi:.1%} of chunks carried several tokens: read as time between chunks"
    )
    burst = max((lv.burst_share for lv in levels), default=0.0)
    if burst > 0:
        method += (
            f"; up to {burst:.1%} of gaps are under 0.1 ms (tokens delivered together after a stall): "
            "they are reported as observed, not smoothed"
        )
    data = ItlData(workload=spec.name, method=method, levels=levels)
    min_out = min((lv.min_output_tokens or 0 for lv in levels), default=0)
    samples = min((lv.gaps.count for lv in levels), default=0)
    reqs = [
        must(
            "5.4.2",
            "every request generates at least 50 output tokens",
            min_out >= 50,
            f"smallest output {min_out} tokens",
        ),
        must(
            "5.4.2",
            "at least 100 requests per load level",
            min(lv.requests for lv in levels) >= 100,
            f"{min(lv.requests for lv in levels)} requests",
        ),
        should("5.4.2", "5000+ ITL samples per level", samples >= 5000, f"{samples} samples"),
        should(
            "5.4.2",
            "several load levels (25/50/75/90% of saturation)",
            len(levels) >= 2,
            ", ".join(f"{f:.0%}" for f in fractions),
        ),
        must("5.4.3", "the TTFT interval is not included in ITL", True, "gaps start at the first chunk"),
        must("4.6.3", "the ITL method for multi-token chunks is declared", True, method),
    ]
    return Outcome(data, reqs, [method, *run.generator_warnings])
