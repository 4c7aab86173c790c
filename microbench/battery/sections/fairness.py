"""5.6 Scheduling Fairness: short and long request classes, each alone, then mixed, at the same total load.

Classes (5.6.2): short = input U[64, 256], output U[32, 128]; long = input U[1024, 4096], output
U[256, 1024]; mixed 80/20. The total Poisson rate is ``fairness_load`` × the mixed workload's capacity
(the capacity measurement's closed-loop ramp, run on the mixed workload). The mixed stream interleaves
the classes in seeded shuffled blocks of 20 holding exactly 16 short and 4 long requests, so the mix
is 80/20 by construction (a per-request draw gave 88/12 in a 100-request run). Latency inflation =
mixed / isolated TTFT per class. Jain's index (5.6.4) is over the *classes*: x_c = class c's mixed TTFT
P50 / its isolated TTFT P50 (``jain_over_classes``); the same formula over every request's normalised
TTFT measures spread within classes, not unfairness between them, and is reported separately as such.
Starvation = share of a class's mixed requests waiting (TTFT) longer than 5× that class's median.
"""

from __future__ import annotations

import math
from typing import Any, Literal

import numpy as np
from pydantic import Field

from benchcore.schema import StrictModel
from microbench.battery.compliance import must, should
from microbench.battery.context import BatteryContext
from microbench.battery.disclosures import stand_in
from microbench.battery.plan import Estimate, PlanInputs
from microbench.battery.registry import Outcome, register_test
from microbench.battery.report import TEST_DATA, Table, TestData, ms, num, pct
from microbench.loadgen.stages import Stage
from microbench.measure.capacity import closed_loop_ramp
from microbench.measure.stats import Distribution, jain_index, starvation_rate, summarize
from microbench.workloads.schedulers import parse_scheduler
from microbench.workloads.spec import WorkloadSpec

__all__ = [
    "CLASSES",
    "ClassRow",
    "FairnessData",
    "class_workload",
    "jain_over_classes",
    "mixed_order",
    "run_fairness",
]

CLASSES: dict[str, dict[str, Any]] = {
    "short": {
        "input_length": {"type": "uniform", "min": 64, "max": 256},
        "output_length": {"type": "uniform", "min": 32, "max": 128},
        "rate_fraction": 0.8,
    },
    "long": {
        "input_length": {"type": "uniform", "min": 1024, "max": 4096},
        "output_length": {"type": "uniform", "min": 256, "max": 1024},
        "rate_fraction": 0.2,
    },
}


MIX_BLOCK = 20


def mixed_order(fractions: dict[str, float], count: int, seed: int) -> list[str]:
    """Class names for ``count`` requests: seeded shuffled blocks holding each class's exact share."""
    total = sum(fractions.values())
    block = [n for n, f in fractions.items() for _ in range(round(MIX_BLOCK * f / total))]
    rng = np.random.default_rng(seed)
    order: list[str] = []
    while len(order) < count:
        order += [block[i] for i in rng.permutation(len(block))]
    return order[:count]


def jain_over_classes(inflation: dict[str, float | None]) -> float | None:
    """Jain's index over the classes' normalised latencies (None unless every class has one)."""
    values = list(inflation.values())
    if len(values) < 2 or any(v is None or not math.isfinite(v) or v <= 0 for v in values):
        return None
    return jain_index([v for v in values if v is not None])


def class_workload(names: list[str], seed: int) -> WorkloadSpec:
    """The workload of the given classes (their requests carry the class in ``slo_class``)."""
    clients = [{"id": n, "slo_class": n, **CLASSES[n]} for n in names]
    return WorkloadSpec.model_validate(
        {"name": "fairness-" + "+".join(names), "seed": seed, "clients": clients}
    )


class ClassRow(StrictModel):
    name: str
    isolated_ttft: Distribution
    mixed_ttft: Distribution
    mixed_tpot: Distribution
    inflation_p50: float | None
    inflation_p99: float | None
    starvation: float | None


@TEST_DATA.register("fairness")
class FairnessData(TestData):
    test: Literal["fairness"] = "fairness"
    rate: float
    classes: list[ClassRow]
    jain: float | None = Field(default=None, description="over classes: x_c = inflation P50 of class c")
    jain_requests: float | None = Field(
        default=None, description="spread: the same formula over every mixed request's normalised TTFT"
    )
    mix_asked: dict[str, float] = Field(default_factory=dict)
    mix_sent: dict[str, int] = Field(default_factory=dict)

    def tables(self) -> list[Table]:
        per_class = [
            [
                c.name,
                str(c.mixed_ttft.count),
                ms(c.mixed_ttft.p50),
                ms(c.mixed_ttft.p99),
                ms(c.mixed_tpot.p50),
                ms(c.mixed_tpot.p99),
            ]
            for c in self.classes
        ]
        inflation = [
            [
                c.name,
                ms(c.isolated_ttft.p50),
                ms(c.mixed_ttft.p50),
                num(c.inflation_p50, ".2f", "×"),
                num(c.inflation_p99, ".2f", "×"),
            ]
            for c in self.classes
        ]
        total = sum(self.mix_sent.values()) or 1
        mix = ", ".join(
            f"{n} {c / total:.1%} (asked {self.mix_asked.get(n, 0):.0%})" for n, c in self.mix_sent.items()
        )
        metrics = [
            ["Jain's Fairness Index (over classes, x = inflation P50)", num(self.jain, ".3f")],
            [
                "Per-request spread (Jain over every request's normalised TTFT)",
                num(self.jain_requests, ".3f"),
            ],
            ["Class mix sent", mix or "–"],
        ]
        metrics += [[f"{c.name.title()} Class Starvation", pct(c.starvation)] for c in self.classes]
        return [
            Table(
                title="Per-Class Results, mixed workload (Table 8)",
                columns=["Class", "Count", "TTFT P50", "TTFT P99", "TPOT P50", "TPOT P99"],
                rows=per_class,
            ),
            Table(
                title="Latency inflation (mixed / isolated TTFT)",
                columns=["Class", "Isolated P50", "Mixed P50", "Inflation P50", "Inflation P99"],
                rows=inflation,
            ),
            Table(title="Fairness Metrics (Table 9)", columns=["Metric", "Value"], rows=metrics),
        ]

    def headline(self) -> dict[str, str]:
        return {"Jain's index (over classes)": num(self.jain, ".3f")}


def _plan(i: PlanInputs) -> Estimate:
    p = i.profile
    rate = p.fairness_load * i.probe.rps
    mixed = max(p.fairness_per_class / 0.2, rate * p.fairness_duration_s)
    reqs = 2 * p.fairness_per_class + mixed
    return Estimate(3, int(reqs), reqs / rate + 6 * i.probe.e2e_s)


@register_test("fairness", "5.6", "Scheduling Fairness", estimate=_plan)
async def run_fairness(ctx: BatteryContext) -> Outcome:
    p = ctx.profile
    mixed_spec = class_workload(["short", "long"], ctx.seed)
    key = "fairness_capacity_rps"
    if key not in ctx.estimates:  # the mixed workload's own service rate: the capacity search's ramp
        ramp = await closed_loop_ramp(
            ctx.run, lambda: ctx.requests(mixed_spec), "fairness/closed", ctx.capacity_plan()
        )
        ctx.estimates[key] = max(r.request_rps for r in ramp)
    rate = p.fairness_load * ctx.estimates[key]
    n_mixed = max(
        math.ceil(p.fairness_per_class / CLASSES["long"]["rate_fraction"]),
        math.ceil(rate * p.fairness_duration_s),
    )
    fractions = {n: float(CLASSES[n]["rate_fraction"]) for n in ("short", "long")}
    order = mixed_order(fractions, n_mixed, ctx.seed)
    streams = {n: ctx.requests(class_workload([n], ctx.seed)) for n in fractions}
    results = {}
    for label, requests, count in (
        ("short", ctx.requests(class_workload(["short"], ctx.seed)), p.fairness_per_class),
        ("long", ctx.requests(class_workload(["long"], ctx.seed)), p.fairness_per_class),
        ("mixed", (next(streams[n]) for n in order), n_mixed),
    ):
        stage = Stage.scheduled(
            label,
            parse_scheduler({"kind": "poisson", "rate": rate, "seed": ctx.seed}),
            requests,
            max_requests=count,
        )
        results[label] = (await ctx.run(f"fairness/{label}", [stage])).stage(label)
    mixed = results["mixed"].latencies
    rows, normalised = [], []
    for name in ("short", "long"):
        iso = results[name].latencies
        iso_ttft = iso.loc[iso["ok"], "ttft_s"]
        mine = mixed[(mixed["slo_class"] == name) & mixed["ok"]]
        iso_d, mix_d = summarize(iso_ttft), summarize(mine["ttft_s"])
        if iso_d.p50:
            normalised.extend((mine["ttft_s"] / iso_d.p50).tolist())
        rows.append(
            ClassRow(
                name=name,
                isolated_ttft=iso_d,
                mixed_ttft=mix_d,
                mixed_tpot=summarize(mine["tpot_s"]),
                inflation_p50=mix_d.p50 / iso_d.p50 if mix_d.p50 is not None and iso_d.p50 else None,
                inflation_p99=mix_d.p99 / iso_d.p99 if mix_d.p99 is not None and iso_d.p99 else None,
                starvation=starvation_rate(mine["ttft_s"]) if len(mine) else None,
            )
        )
    sent = mixed["slo_class"].value_counts()
    data = FairnessData(
        rate=rate,
        classes=rows,
        jain=jain_over_classes({r.name: r.inflation_p50 for r in rows}),
        jain_requests=jain_index(normalised) if normalised else None,
        mix_asked=fractions,
        mix_sent={n: int(sent.get(n, 0)) for n in fractions},
    )
    counts = [c.mixed_ttft.count for c in rows]
    duration = results["mixed"].issue_end_s - results["mixed"].start_s
    reqs = [
        must("5.6.2", "at least 500 requests per class", min(counts) >= 500, f"mixed counts {counts}"),
        must("5.6.3", "isolated baseline of each class at the same total load", True, f"{rate:.2f} req/s"),
        must("5.6.3", "mixed run of at least 300 s", duration >= 300, f"{duration:.1f} s"),
        should(
            "5.6.2",
            "load at 70–90% of saturation",
            0.7 <= p.fairness_load <= 0.9,
            f"{p.fairness_load:.0%} of the mixed workload's probed capacity",
        ),
        stand_in("5.6.2", "Synthetic-Skewed", "the 5.6.2 classes' spread, not the A.2 distributions"),
    ]
    notes = [
        "classes as defined in 5.6.2 (the draft's Synthetic-Skewed requirement is met by these classes' "
        "spread, not by the A.2 distributions)"
    ]
    if p.output_cap is not None:
        notes.append(
            f"outputs capped at {p.output_cap} tokens by the profile: long-class outputs are shortened"
        )
    return Outcome(data, reqs, notes)
