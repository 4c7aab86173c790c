"""5.7 Prefix Cache Effectiveness: cache disabled vs enabled-cold vs enabled-warm on the same workload.

Workload: Code Completion (shared repository contexts, Zipf-popular). The arms run the same requests by
length and prefix choice (the workload seed); each arm gets fresh non-prefix parts. Disabled: the engine
is restarted with prefix caching off (impossible for an external engine: that arm is then skipped and the
test is not compliant, as the draft asks for both configurations). Cold: caching on, after a restart (or
with fresh prefixes), so nothing is cached when it starts. Warm: the shared prefixes are sent once first.
Hit rates are /metrics deltas of the prefix-cache counters.
"""

from __future__ import annotations

from typing import Literal

from benchcore.schema import StrictModel
from engine_harness.handles import NotRestartable
from microbench.battery.compliance import must
from microbench.battery.context import BatteryContext
from microbench.battery.plan import Estimate, PlanInputs
from microbench.battery.registry import Outcome, register_test
from microbench.battery.report import TEST_DATA, Table, TestData, ms, num, pct
from microbench.battery.warmup import warm_up
from microbench.client.requests import RequestSpec
from microbench.loadgen.stages import Stage
from microbench.measure.stats import Distribution, summarize
from microbench.workloads.prompts import PromptFactory, TextRenderer
from microbench.workloads.schedulers import parse_scheduler

__all__ = ["CacheArm", "PrefixCacheData", "population_requests", "run_prefix_cache"]

WORKLOAD = "code-completion"


class CacheArm(StrictModel):
    name: str
    requests: int
    succeeded: int
    ttft: Distribution
    output_tps: float
    prefix_tokens: int
    hit_tokens: float | None
    query_tokens: float | None

    @property
    def token_hit_rate(self) -> float | None:
        return (
            None if self.hit_tokens is None or not self.query_tokens else self.hit_tokens / self.query_tokens
        )

    @property
    def prefix_hit_rate(self) -> float | None:
        if self.hit_tokens is None or not self.prefix_tokens:
            return None
        return min(self.hit_tokens / self.prefix_tokens, 1.0)


def _reduction(base: float | None, new: float | None) -> float | None:
    return None if base is None or new is None or base == 0 else (base - new) / base


@TEST_DATA.register("prefix_cache")
class PrefixCacheData(TestData):
    test: Literal["prefix_cache"] = "prefix_cache"
    workload: str
    arms: list[CacheArm]
    disabled_skipped: str = ""

    def arm(self, name: str) -> CacheArm | None:
        return next((a for a in self.arms if a.name == name), None)

    def tables(self) -> list[Table]:
        rows = [
            [
                a.name,
                ms(a.ttft.p50),
                ms(a.ttft.p95),
                ms(a.ttft.p99),
                pct(a.prefix_hit_rate),
                pct(a.token_hit_rate),
                num(a.output_tps, ".1f", " tok/s"),
            ]
            for a in self.arms
        ]
        if self.disabled_skipped:
            rows.insert(0, ["Cache Disabled", "not run", "", "", "", "", self.disabled_skipped])
        base = self.arm("Cache Disabled") or self.arm("Cache (Cold)")
        warm = self.arm("Cache (Warm)")
        derived = []
        if base is not None and warm is not None:
            label = base.name
            derived = [
                [f"TTFT P50 reduction, warm vs {label}", pct(_reduction(base.ttft.p50, warm.ttft.p50))],
                [f"TTFT P99 reduction, warm vs {label}", pct(_reduction(base.ttft.p99, warm.ttft.p99))],
                [
                    f"Throughput change, warm vs {label}",
                    pct(None if not base.output_tps else warm.output_tps / base.output_tps - 1),
                ],
            ]
        return [
            Table(
                title="Cache Effectiveness (Table 10)",
                columns=[
                    "Configuration",
                    "TTFT P50",
                    "TTFT P95",
                    "TTFT P99",
                    "Prefix tokens from cache",
                    "Prompt tokens from cache",
                    "Output throughput",
                ],
                rows=rows,
            ),
            Table(title="Cache benefit", columns=["Metric", "Value"], rows=derived),
        ]


def population_requests(requests: list[RequestSpec], text: TextRenderer | None = None) -> list[RequestSpec]:
    """One single-token request per distinct shared prefix (to pre-populate the cache); a text prompt's
    prefix is its first ``prefix_tokens`` tokens as ``text``'s tokenizer (the model's) splits it."""
    seen: dict[str, RequestSpec] = {}
    for draft in requests:
        if not draft.prefix_group or draft.prefix_group in seen:
            continue
        r = draft.built()
        prefix: list[int] | str
        if isinstance(r.prompt, list):
            prefix = r.prompt[: r.prefix_tokens]
        elif text is not None:
            prefix = text.tokenizer.decode(text.tokenizer.encode(r.prompt)[: r.prefix_tokens])
        else:
            raise ValueError("a text prompt's prefix needs the tokenizer that made it")
        seen[r.prefix_group] = RequestSpec(prompt=prefix, prompt_tokens=r.prefix_tokens, max_tokens=1)
    return list(seen.values())


async def _arm(ctx: BatteryContext, name: str, requests: list[RequestSpec]) -> CacheArm:
    p = ctx.profile
    scheduler = parse_scheduler({"kind": "concurrency", "concurrency": p.prefix_concurrency})
    stage = Stage.scheduled("arm", scheduler, iter(requests), max_requests=len(requests))
    before = await ctx.scrape()
    window = (await ctx.run(f"prefix-cache/{name.lower().replace(' ', '-')}", [stage])).stage("arm")
    after = await ctx.scrape()
    hits = queries = None
    if before is not None and after is not None:
        hits = after.delta(before, ctx.engine.metrics.prefix_cache_hits)
        queries = after.delta(before, ctx.engine.metrics.prefix_cache_queries)
    lat = window.latencies
    return CacheArm(
        name=name,
        requests=len(lat),
        succeeded=int(lat["ok"].sum()),
        ttft=summarize(lat.loc[lat["ok"], "ttft_s"]),
        output_tps=window.output_tokens_per_s,
        prefix_tokens=sum(r.prefix_tokens for r in requests),
        hit_tokens=hits,
        query_tokens=queries,
    )


def _plan(i: PlanInputs) -> Estimate:
    reqs = 3 * i.profile.prefix_requests
    return Estimate(3, reqs, reqs * i.probe.e2e_s / i.profile.prefix_concurrency + 2 * i.restart_s)


@register_test("prefix_cache", "5.7", "Prefix Cache Effectiveness", estimate=_plan)
async def run_prefix_cache(ctx: BatteryContext) -> Outcome:
    p = ctx.profile
    spec = ctx.workload_spec(WORKLOAD)
    prompts = PromptFactory(ctx.prompts.space)  # its own salt: the arms never share a cold part

    def draw() -> list[RequestSpec]:
        source = ctx.requests(spec, prompts)
        return [next(source) for _ in range(p.prefix_requests)]

    arms, skipped, notes, warmups = [], "", [], []
    try:
        for enabled, arm in ((False, "Cache Disabled"), (True, "")):
            await ctx.engine.set_prefix_caching(enabled)
            warmups.append(await warm_up(ctx))  # a restarted engine is cold (1248 vs 1855 tok/s once)
            notes.append(
                f"engine restarted with prefix caching {'on' if enabled else 'off'} (the cache starts "
                f"empty), then warmed up: {warmups[-1].requests} requests, variation "
                f"{'–' if warmups[-1].variation is None else f'{warmups[-1].variation:.1%}'}"
            )
            if arm:
                arms.append(await _arm(ctx, arm, draw()))
    except NotRestartable as exc:
        skipped = str(exc)
        notes.append(f"Cache Disabled arm not run: {exc}")
    arms.append(await _arm(ctx, "Cache (Cold)", draw()))
    warm = draw()
    await _arm(ctx, "pre-populate", population_requests(warm, ctx.text))
    arms.append(await _arm(ctx, "Cache (Warm)", warm))
    data = PrefixCacheData(workload=spec.name, arms=arms, disabled_skipped=skipped)
    reqs = [
        must(
            "5.7.2",
            "run with cache disabled and with cache enabled",
            not skipped,
            skipped or "disabled, cold and warm",
        ),
        must(
            "5.7.3", "warm-up does not populate the prefix cache", True, "warm-up prompts are unique and cold"
        ),
        must(
            "5.7.3",
            "each configuration is warmed up after its restart",
            bool(skipped) or len(warmups) == 2,
            f"{len(warmups)} warm-ups after restarts" if not skipped else "no restart (one configuration)",
        ),
        must(
            "5.7.3",
            "the configurations run an identical workload",
            True,
            "same seed: same lengths and prefix choices; fresh non-prefix parts",
        ),
    ]
    if any(a.hit_tokens is None for a in arms):
        notes.append("the engine exposes no prefix-cache counters: hit rates are not measured")
    return Outcome(data, reqs, notes)
