"""5.9 Long Context Scaling: TTFT against context length at low closed-loop concurrency, with fits.

Lengths come from the profile (the Long Context workload's targets in the conformant one), ascending; a
length that does not fit the engine's context with the fixed output is left out and named. Each length
runs ``context_requests`` prompts of exactly that many tokens, shaped as the Long Context workload's
(Appendix A.5): a cold document, then a fixed ~100-token question (``PromptFactory.document_question``).
The fit (``measure.scaling.fit_scaling``) gives the exponent k of TTFT ∝ length^k and a straight line,
each with R², over every request.

Throughput at each length (5.9.4, "maximum throughput achievable at each context length") is a
closed-loop ramp of that length's requests (``measure.capacity.closed_loop_ramp``: concurrency 1, 2, 4,
… doubling until two levels in a row gain ≤ 10%, or ``context_ramp_max``); ``max_throughput`` reads the
highest output rate among its levels that completed ≥ 99% of their requests, and whether the ramp
levelled off (a maximum) or stopped at its ceiling (a lower bound).
"""

from __future__ import annotations

import functools
from typing import Literal

import numpy as np
from matplotlib.figure import Figure

from benchcore.schema import StrictModel
from microbench.battery.compliance import must, should
from microbench.battery.context import BatteryContext
from microbench.battery.plan import Estimate, PlanInputs
from microbench.battery.plots import new_figure, plain_log
from microbench.battery.registry import FigureSpec, Outcome, SkipTest, register_test
from microbench.battery.report import TEST_DATA, Table, TestData, ms, num
from microbench.loadgen.stages import Stage
from microbench.measure.capacity import CapacityPlan, closed_loop_ramp, ramp_done
from microbench.measure.levels import LevelRow
from microbench.measure.scaling import ScalingFit, fit_scaling
from microbench.measure.stats import Distribution, summarize
from microbench.workloads.prompts import QUESTION_TOKENS
from microbench.workloads.schedulers import parse_scheduler

__all__ = ["LengthRow", "LengthThroughput", "LongContextData", "max_throughput", "run_long_context"]

LONG_CONTEXT_TARGETS = (8192, 16384, 32768, 65536, 131072)  # Appendix A.5


class LengthThroughput(StrictModel):
    """5.9.4's throughput at one length: the ramp's levels and its maximum."""

    levels: list[LevelRow]
    max_output_tps: float | None
    max_output_tps_ci: float | None = None
    at_concurrency: int | None = None
    levelled_off: bool = False  # False: the ramp hit its ceiling or failed, the maximum is a lower bound


def max_throughput(levels: list[LevelRow], ramp_max: int) -> LengthThroughput:
    """The highest output tokens/s among ``levels`` that completed ≥ 99% of their requests, and whether the
    ramp levelled off (two levels in a row ≤ 10% above the best before them) below ``ramp_max``."""
    good = [r for r in levels if r.success_rate is not None and r.success_rate >= 0.99 and r.output_tps > 0]
    best = max(good, key=lambda r: r.output_tps, default=None)
    levelled = bool(levels) and ramp_done(levels, 1 << 62) and levels[-1].offered * 2 <= ramp_max
    return LengthThroughput(
        levels=levels,
        max_output_tps=None if best is None else best.output_tps,
        max_output_tps_ci=None if best is None else best.output_tps_ci,
        at_concurrency=None if best is None else int(best.offered),
        levelled_off=levelled and best is not None,
    )


class LengthRow(StrictModel):
    length: int
    ttft: Distribution
    output_tps: float
    samples_s: list[float]
    throughput: LengthThroughput | None = None

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
                _max_cell(r.throughput),
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
                    "Max output tok/s",
                ],
                rows=rows,
                note=note + "; Output tok/s at the test's concurrency; Max: the best closed-loop level of a "
                "ramp at that length (≥ 99% completed), at concurrency c; '≥' where the ramp stopped at its "
                "ceiling before levelling off",
            )
        ]

    def headline(self) -> dict[str, str]:
        f = self.fit
        if f is None:
            return {"Scaling exponent (5.9)": "no fit (fewer than two lengths)"}
        if not f.meaningful:
            return {"Scaling exponent (5.9)": f.verdict}
        return {"Scaling exponent (5.9)": f"{f.exponent:.2f}{_ci(f.exponent_ci)}, R² {f.r2_power:.2f}"}


def _max_cell(t: LengthThroughput | None) -> str:
    if t is None:
        return "not measured"
    if t.max_output_tps is None:
        return "no level completed"
    bound = "" if t.levelled_off else "≥ "
    return f"{bound}{t.max_output_tps:.1f} ± {t.max_output_tps_ci or 0:.1f} (c = {t.at_concurrency})"


def _ci(ci: tuple[float, float] | None) -> str:
    return "" if ci is None else f" (95% CI {ci[0]:.2f} to {ci[1]:.2f})"


def _plan(i: PlanInputs) -> Estimate:
    p, probe = i.profile, i.probe
    reqs = len(p.context_lengths) * p.context_requests
    secs = sum(p.context_requests * probe.e2e_s * n / probe.input_tokens for n in p.context_lengths)
    ramp = len(p.context_lengths) * (p.context_ramp_max.bit_length() if p.context_ramp_max else 0)
    return Estimate(
        len(p.context_lengths) + ramp,
        reqs + int(ramp * probe.rps * p.level_duration_s),
        secs + ramp * i.level_s(p.level_duration_s),
    )


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
            f"len-{n}", scheduler, ctx.document_requests(n, p.context_output), max_requests=p.context_requests
        )
        for n in fits
    ]
    run = await ctx.run("long-context", stages)
    rows = []
    for n in fits:
        w = run.stage(f"len-{n}")
        ok = w.latencies[w.latencies["ok"]]
        throughput = None
        if p.context_ramp_max:
            plan = CapacityPlan(1, p.context_ramp_max, p.level_duration_s, p.capacity_ttft_p99_ms, 2)
            ramp = await closed_loop_ramp(
                ctx.run,
                functools.partial(ctx.document_requests, n, p.context_output),
                f"long-context/ramp-{n}",
                plan,
            )
            throughput = max_throughput(ramp, p.context_ramp_max)
        rows.append(
            LengthRow(
                length=n,
                ttft=summarize(ok["ttft_s"]),
                output_tps=w.output_tokens_per_s,
                samples_s=ok["ttft_s"].astype(float).tolist(),
                throughput=throughput,
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
        must(
            "4.3.2.5",
            "Long Context prompts are a document followed by a fixed question (A.5.1)",
            True,
            f"cold document of each length less {QUESTION_TOKENS} tokens, then the same "
            f"{QUESTION_TOKENS}-token question",
        ),
    ]
    reqs.append(
        should(
            "5.9.4",
            "maximum throughput at each context length",
            all(r.throughput is not None and r.throughput.levelled_off for r in rows),
            "no ramp (context_ramp_max 0)"
            if not p.context_ramp_max
            else f"levelled off at {sum(bool(r.throughput and r.throughput.levelled_off) for r in rows)} of "
            f"{len(rows)} lengths below concurrency {p.context_ramp_max}",
        )
    )
    notes = []
    if dropped:
        notes.append(f"lengths {dropped} left out: they do not fit max_model_len {limit} with the output")
    return Outcome(data, reqs, notes)
