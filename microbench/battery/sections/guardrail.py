"""5.10 Guardrail Overhead: the same workload against two or more named configurations, baseline first.

A configuration is an endpoint (``--arm NAME=URL``, e.g. the bare engine and the same engine behind an
input filter) or the battery's own engine restarted with other settings (``--arm NAME=engine:KEY=VALUE``,
``EngineOverrides``; warmed up after the restart); the first is the baseline. Configurations run in order,
each a closed-loop ramp to saturation (Table 14) then open-loop Poisson runs at ``guardrail_levels`` × the
baseline's probed capacity (Table 13); afterwards the engine runs as launched again. Each configuration's
TTFT and E2E at each level are compared with the baseline's at that level by ``analysis.effects`` (the
A/B statistics of ``analysis.compare``, here on medians of the per-request values: bootstrap CI, rank
test corrected across every comparison, verdict). With fewer than two configurations the test is
skipped: there is nothing to compare, and the report's guardrail disclosure says what the SUT runs.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from analysis.effects import Effect, compare_samples
from benchcore.schema import StrictModel
from engine_harness.handles import EngineOverrides, NotRestartable
from microbench.battery.compliance import must, should
from microbench.battery.context import BatteryContext
from microbench.battery.plan import Estimate, PlanInputs
from microbench.battery.registry import Outcome, SkipTest, register_test
from microbench.battery.report import TEST_DATA, Table, TestData, ms, num, pct
from microbench.battery.warmup import warm_up
from microbench.loadgen.stages import Stage
from microbench.measure.capacity import closed_loop_ramp
from microbench.measure.levels import level_row
from microbench.measure.stats import Distribution, summarize
from microbench.workloads.schedulers import parse_scheduler
from microbench.workloads.spec import WorkloadSpec

__all__ = ["ConfigEffect", "ConfigLevel", "GuardrailData", "config_effects", "run_guardrail"]


class ConfigLevel(StrictModel):
    config: str
    url: str
    load_fraction: float
    offered_rps: float | None = None
    achieved_rps: float | None = Field(default=None, description="completions/s in the measured window")
    ttft: Distribution
    e2e: Distribution


class ConfigEffect(Effect):
    """A configuration against the baseline at one load level on one figure (B: the configuration)."""

    config: str
    load_fraction: float
    figure: Literal["ttft", "e2e"]


FIGURES: tuple[Literal["ttft", "e2e"], ...] = ("ttft", "e2e")


def config_effects(samples: dict[tuple[str, float, str], list[float]], baseline: str) -> list[ConfigEffect]:
    """Every configuration against the baseline, per load level and figure, from the per-request values
    (``samples[(config, load_fraction, figure)]``), corrected together (``analysis.effects``); medians, as
    the requests of a mix differ by nature (the first quartile is for repetitions of one measurement)."""
    configs = sorted({c for c, _, _ in samples if c != baseline})
    fractions = sorted({f for _, f, _ in samples})
    keys = {
        (i, j, k): (c, f, fig)
        for i, c in enumerate(configs)
        for j, f in enumerate(fractions)
        for k, fig in enumerate(FIGURES)
    }
    a = {key: samples.get((baseline, f, fig), []) for key, (_, f, fig) in keys.items()}
    b = {key: samples.get(name, []) for key, name in keys.items()}
    return [
        ConfigEffect(config=keys[key][0], load_fraction=keys[key][1], figure=keys[key][2], **e.model_dump())
        for key, e in compare_samples(a, b, quantile=0.5).items()
    ]


@TEST_DATA.register("guardrail")
class GuardrailData(TestData):
    test: Literal["guardrail"] = "guardrail"
    configs: dict[str, str]
    max_throughput: dict[str, float]
    levels: list[ConfigLevel]
    effects: list[ConfigEffect] = Field(default_factory=list, description="config_effects of the levels")

    def tables(self) -> list[Table]:
        baseline = next(iter(self.configs))
        base = {lv.load_fraction: lv for lv in self.levels if lv.config == baseline}
        rows = []
        for lv in self.levels:
            b = base.get(lv.load_fraction)
            over = (
                None if b is None or b.ttft.p50 is None or lv.ttft.p50 is None else lv.ttft.p50 - b.ttft.p50
            )
            e2e_over = (
                None if b is None or b.e2e.p50 is None or lv.e2e.p50 is None else lv.e2e.p50 - b.e2e.p50
            )
            rows.append(
                [
                    lv.config,
                    f"{lv.load_fraction:.0%}",
                    num(lv.offered_rps, ".2f"),
                    num(lv.achieved_rps, ".2f"),
                    ms(lv.ttft.p50),
                    ms(lv.ttft.p99),
                    ms(lv.e2e.p50),
                    ms(lv.e2e.p99),
                    ms(over),
                    ms(e2e_over),
                ]
            )
        tp = self.max_throughput
        base_tp = tp.get(baseline)
        impact = [
            [name, num(v, ".1f", " tok/s"), "–" if name == baseline or not base_tp else pct(v / base_tp - 1)]
            for name, v in tp.items()
        ]
        return [
            Table(
                title="Guardrail Overhead (Table 13)",
                columns=[
                    "Configuration",
                    "Load",
                    "Offered (req/s)",
                    "Achieved (req/s)",
                    "TTFT P50",
                    "TTFT P99",
                    "E2E P50",
                    "E2E P99",
                    "TTFT overhead P50",
                    "E2E overhead P50",
                ],
                rows=rows,
            ),
            Table(
                title="Throughput Impact (Table 14)",
                columns=["Configuration", "Max Throughput", "Reduction"],
                rows=impact,
                note="Max Throughput per configuration: the best closed-loop ramp level meeting 5.5's "
                "criteria (concurrency doubled until two levels gained ≤ 10%). The battery's own maximum "
                "for the engine it launched is in 5.2.",
            ),
            Table(
                title="Effect against the baseline (analysis.effects)",
                columns=[
                    "Configuration",
                    "Load",
                    "Figure",
                    "n base/config",
                    "B/A",
                    "95% CI",
                    "p (BH)",
                    "Verdict",
                ],
                rows=[
                    [
                        e.config,
                        f"{e.load_fraction:.0%}",
                        e.figure.upper(),
                        f"{e.n_a}/{e.n_b}",
                        num(e.ratio, ".3f"),
                        "–" if e.ci_low is None or e.ci_high is None else f"{e.ci_low:.3f}–{e.ci_high:.3f}",
                        num(e.p_adjusted, ".2g"),
                        e.verdict.replace("B ", f"{e.config} "),
                    ]
                    for e in self.effects
                ],
                note="B/A: the configuration's median per-request value over the baseline's at the same "
                "load level (requests of a mix differ by nature: the typical one); 95% CI: seeded "
                "bootstrap; p: two-sided Mann–Whitney U, Benjamini–Hochberg across every row; a verdict "
                "needs both p < 0.05 and a CI excluding 1 ('no detectable difference': CI within ±10%).",
            ),
        ]


async def _target(ctx: BatteryContext, config: str | EngineOverrides, notes: list[str]) -> str:
    """The URL to load for ``config``: an endpoint's, or the engine's after restarting it as configured."""
    if not isinstance(config, EngineOverrides):
        return config
    if await ctx.engine.reconfigure(config):
        warmup = await warm_up(ctx)
        notes.append(f"engine restarted for {config} and warmed up ({warmup.requests} requests)")
    return ctx.engine.base_url


async def _probe(ctx: BatteryContext, name: str, url: str, spec: WorkloadSpec) -> tuple[float, float]:
    """The capacity measurement's closed-loop ramp against one configuration: (output tok/s, req/s).

    The maximum is the best level meeting 5.5's criteria (≥ 99% completed, TTFT P99 within the limit), or
    the best level at all when none met them; the same ramp 5.2 starts from, not a fixed-concurrency probe.
    """
    rows = await closed_loop_ramp(
        ctx.run, lambda: ctx.requests(spec), f"guardrail/{name}/closed", ctx.capacity_plan(), base_url=url
    )
    good = [r for r in rows if r.slo_met] or rows
    best = max(good, key=lambda r: r.output_tps)
    return best.output_tps, best.request_rps


async def _levels(
    ctx: BatteryContext,
    name: str,
    url: str,
    spec: WorkloadSpec,
    base_rps: float,
    samples: dict[tuple[str, float, str], list[float]],
) -> list[ConfigLevel]:
    """Open-loop Poisson runs at each load level (a share of the baseline's capacity)."""
    levels = []
    for i, f in enumerate(sorted(ctx.profile.guardrail_levels)):
        stage = Stage.scheduled(
            "level",
            parse_scheduler({"kind": "poisson", "rate": f * base_rps, "seed": ctx.seed + i}),
            ctx.requests(spec),
            duration_s=ctx.profile.level_duration_s,
        )
        window = (await ctx.run(f"guardrail/{name}/{f:g}", [stage], base_url=url)).stage("level")
        lat, achieved = window.latencies, level_row(window, f * base_rps).request_rps
        ok = lat[lat["ok"]]
        for figure in FIGURES:
            samples[(name, f, figure)] = [float(v) for v in ok[f"{figure}_s"]]
        levels.append(
            ConfigLevel(
                config=name,
                url=url,
                load_fraction=f,
                offered_rps=f * base_rps,
                achieved_rps=achieved,
                ttft=summarize(ok["ttft_s"]),
                e2e=summarize(ok["e2e_s"]),
            )
        )
    return levels


def _plan(i: PlanInputs) -> Estimate:
    """Each configuration's levels and a restart; nothing with fewer than two configurations."""
    if i.configs < 2:
        return Estimate(0, 0, 0.0)
    p, n = i.profile, 4 + len(i.profile.guardrail_levels)
    return Estimate(
        i.configs * n,
        int(i.configs * n * i.probe.rps * p.level_duration_s),
        i.configs * (n * i.level_s(p.level_duration_s) + i.restart_s),
    )


@register_test("guardrail", "5.10", "Guardrail Overhead", estimate=_plan)
async def run_guardrail(ctx: BatteryContext) -> Outcome:
    p = ctx.profile
    configs = ctx.guardrail_configs
    if len(configs) < 2:
        raise SkipTest(
            "needs two or more named configurations (--arm NAME=URL or NAME=engine:KEY=VALUE,..., "
            "baseline first); none were given, so there is no guardrail overhead to measure"
        )
    engine_configs = [name for name, config in configs.items() if isinstance(config, EngineOverrides)]
    if engine_configs and not ctx.engine.can_reconfigure:
        raise NotRestartable(
            f"configurations {', '.join(engine_configs)} restart the battery's engine with other settings, "
            f"but this {ctx.engine.kind} engine was not launched by the battery; engine-settings "
            "configurations need --engine vllm|sim"
        )
    spec = ctx.workload_spec()
    baseline = next(iter(configs))
    throughput: dict[str, float] = {}
    capacity: dict[str, float] = {}
    levels: list[ConfigLevel] = []
    samples: dict[tuple[str, float, str], list[float]] = {}
    notes: list[str] = []
    try:
        for name, config in configs.items():
            url = await _target(ctx, config, notes)
            throughput[name], capacity[name] = await _probe(ctx, name, url, spec)
            levels += await _levels(ctx, name, url, spec, capacity[baseline], samples)
    finally:
        if engine_configs and await ctx.engine.reconfigure(EngineOverrides()):
            notes.append("engine restarted as launched after the last configuration")
    data = GuardrailData(
        configs={name: str(config) for name, config in configs.items()},
        max_throughput=throughput,
        levels=levels,
        effects=config_effects(samples, baseline),
    )
    reqs = [
        must(
            "4.8.1",
            "guardrail configuration disclosed",
            True,
            ", ".join(f"{k} = {v}" for k, v in configs.items()),
        ),
        should(
            "5.10.2",
            "load levels 25%, 50% and 75% of capacity",
            sorted(p.guardrail_levels) == [0.25, 0.5, 0.75],
            ", ".join(f"{f:.0%}" for f in p.guardrail_levels),
        ),
    ]
    notes += [
        f"capacity of the baseline {capacity[baseline]:.2f} req/s (closed-loop ramp, as in 5.2's first "
        "phase); every configuration gets the same absolute rates",
        "refused requests count as failures in each configuration",
    ]
    return Outcome(data, reqs, notes)
