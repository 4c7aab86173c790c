"""5.9 Long Context Scaling: TTFT against context length at low closed-loop concurrency, with fits.

Lengths come from the profile (the Long Context workload's targets in the conformant one), ascending; a
length that does not fit the engine's context with the fixed output is left out and named. Each length
runs ``context_requests`` cold prompts of exactly that many tokens. The fit
(``measure.scaling.fit_scaling``) gives the exponent k of TTFT ∝ length^k and a straight line, each with
R², over every request.
"""

from __future__ import annotations

from typing import Literal

import numpy as np
from matplotlib.figure import Figure

from benchcore.schema import StrictModel
from microbench.battery.compliance import must, should
from microbench.battery.context import BatteryContext
from microbench.battery.disclosures import stand_in
from microbench.battery.plan import Estimate, PlanInputs
from microbench.battery.plots import new_figure, plain_log
from microbench.battery.registry import FigureSpec, Outcome, SkipTest, register_test
from microbench.battery.report import TEST_DATA, Table, TestData, ms, num
from microbench.loadgen.stages import Stage
from microbench.measure.scaling import ScalingFit, fit_scaling
from microbench.measure.stats import Distribution, summarize
from microbench.workloads.schedulers import parse_scheduler

__all__ = ["LengthRow", "LongContextData", "run_long_context"]

LONG_CONTEXT_TARGETS = (8192, 16384, 32768, 65536, 131072)  # Appendix A.5


class LengthRow(StrictModel):
    length: int
    ttft: Distribution
    output_tps: float
    samples_s: list[float]

    @property
    def ms_per_1k(self) -> float | None:
        return None if self.ttft.mean is None else self.ttft.mean * 1e3 / self.length * 1000


@TEST_DATA.register("long_context")
class LongContextData(TestData):
    test: Literal["long_context"] = "long_context"
    output_tokens: int
    concurrency: int
    lengths: list[LengthRow]
    dropped: list[int]
    fit: ScalingFit | None

    def tables(self) -> list[Table]:
        rows = [
            [
                str(r.length),
                str(r.ttft.count),
                ms(r.ttft.mean),
                ms(r.ttft.p50),
                ms(r.ttft.p95),
                num(r.ms_per_1k, ".1f"),
                num(r.output_tps, ".1f"),
            ]
            for r in self.lengths
        ]
        f = self.fit
        note = (
            "no fit (fewer than two lengths)"
            if f is None
            else (
                f"Scaling exponent k = {f.exponent:.3f}{_ci(f.exponent_ci)} (R² = {f.r2_power:.4f}), "
                f"{f.verdict}; linear fit R² = {f.r2_linear:.4f}, "
                f"{f.slope_s_per_token * 1e6:.1f} µs per input token; best fit: {f.best}"
            )
        )
        return [
            Table(
                title="Long Context Scaling (Table 12)",
                columns=[
                    "Context (tokens)",
                    "Requests",
                    "TTFT Mean",
                    "TTFT P50",
                    "TTFT P95",
                    "ms/1K tokens",
                    "Output tok/s",
                ],
                rows=rows,
                note=note,
            )
        ]

    def headline(self) -> dict[str, str]:
        f = self.fit
        if f is None:
            return {"Scaling exponent (5.9)": "no fit (fewer than two lengths)"}
        if not f.meaningful:
            return {"Scaling exponent (5.9)": f.verdict}
        return {"Scaling exponent (5.9)": f"{f.exponent:.2f}{_ci(f.exponent_ci)}, R² {f.r2_power:.2f}"}


def _ci(ci: tuple[float, float] | None) -> str:
    return "" if ci is None else f" (95% CI {ci[0]:.2f} to {ci[1]:.2f})"


def _plan(i: PlanInputs) -> Estimate:
    p, probe = i.profile, i.probe
    reqs = len(p.context_lengths) * p.context_requests
    secs = sum(p.context_requests * probe.e2e_s * n / probe.input_tokens for n in p.context_lengths)
    return Estimate(len(p.context_lengths), reqs, secs)


_CAPTION = "Figure 5.9: TTFT (ms) against context length (tokens), log-log, with the fitted power law."


def _context_scaling(data: LongContextData) -> Figure:
    fig, (ax,) = new_figure()
    for row in data.lengths:
        ax.scatter([row.length] * len(row.samples_s), np.asarray(row.samples_s) * 1e3, color="C0", alpha=0.6)
    if data.fit is not None and data.lengths:
        xs = np.geomspace(min(r.length for r in data.lengths), max(r.length for r in data.lengths), 50)
        f = data.fit
        ax.plot(
            xs,
            f.coefficient * xs**f.exponent * 1e3,
            "C1-",
            label=f"power law k={f.exponent:.2f} (R²={f.r2_power:.3f})",
        )
        ax.plot(
            xs,
            (f.intercept_s + f.slope_s_per_token * xs) * 1e3,
            "C2--",
            label=f"linear (R²={f.r2_linear:.3f})",
        )
        ax.legend()
    ax.set(
        xlabel="context length (tokens)",
        ylabel="TTFT (ms)",
        title="5.9 long context scaling",
    )
    plain_log(ax)
    plain_log(ax, "y")
    return fig


@register_test(
    "long_context",
    "5.9",
    "Long Context Scaling",
    estimate=_plan,
    figure=FigureSpec(_context_scaling, _CAPTION),
)
async def run_long_context(ctx: BatteryContext) -> Outcome:
    p = ctx.profile
    limit = ctx.max_model_len
    fits = sorted(n for n in p.context_lengths if limit is None or n + p.context_output <= limit)
    dropped = sorted(set(p.context_lengths) - set(fits))
    if not fits:
        raise SkipTest(f"no context length of {p.context_lengths} fits max_model_len {limit}")
    scheduler = parse_scheduler({"kind": "concurrency", "concurrency": p.context_concurrency})
    stages = [
        Stage.scheduled(
            f"len-{n}", scheduler, ctx.fixed_requests(n, p.context_output), max_requests=p.context_requests
        )
        for n in fits
    ]
    run = await ctx.run("long-context", stages)
    rows = []
    for n in fits:
        w = run.stage(f"len-{n}")
        ok = w.latencies[w.latencies["ok"]]
        rows.append(
            LengthRow(
                length=n,
                ttft=summarize(ok["ttft_s"]),
                output_tps=w.output_tokens_per_s,
                samples_s=ok["ttft_s"].astype(float).tolist(),
            )
        )
    xs = [r.length for r in rows for _ in r.samples_s]
    ys = [s for r in rows for s in r.samples_s]
    fit = fit_scaling(xs, ys) if len({r.length for r in rows if r.samples_s}) >= 2 else None
    data = LongContextData(
        output_tokens=p.context_output,
        concurrency=p.context_concurrency,
        lengths=rows,
        dropped=dropped,
        fit=fit,
    )
    reqs = [
        must(
            "5.9.2",
            "the Long Context workload's lengths (Appendix A.5: 8K–128K)",
            set(LONG_CONTEXT_TARGETS) <= set(fits),
            f"ran {fits}",
        ),
        must(
            "5.9.2",
            "at least 20 requests per context length",
            min(r.ttft.count for r in rows) >= 20,
            f"fewest {min(r.ttft.count for r in rows)}",
        ),
        must("5.9.2", "closed loop at concurrency 1–4", True, str(p.context_concurrency)),
        must("5.9.2", "fixed output length", True, f"{p.context_output} tokens"),
        should("5.9.2", "output of 256 tokens", p.context_output == 256, f"{p.context_output} tokens"),
        stand_in(
            "4.3.2.5",
            "Long Context (document + question)",
            "unique random tokens of each target length, no document-plus-question structure",
        ),
    ]
    notes = ["output throughput per length is at the test's concurrency, not a maximum"]
    if dropped:
        notes.append(f"lengths {dropped} left out: they do not fit max_model_len {limit} with the output")
    return Outcome(data, reqs, notes)
