"""``python -m microbench.battery compare --a A1 A2 A3 --b B1 B2 B3``: battery runs of two systems side by
side (draft §6); ``compare REPORT_A REPORT_B`` is the one-run-per-system form.

- **Equivalence (6.1, 6.4)**: ``equivalence`` checks what makes the two runs comparable: the workload
  (its full spec, workload seed and arrival seed: the same requests in the same order), the prompt form
  and token space (token ids or chat text), the profile (durations, counts, levels), the warm-up, the SUT
  boundary.
  A difference in any of these refuses the comparison (exit 2, naming each), unless ``--allow-differences``
  is given: then every difference is a named condition and the comparison is *conditional*. Differences
  that §6 allows with a statement (hardware, engine, prompt salt) are conditions too.
- **Normalisation (6.2)**: each run's maximum sustainable output throughput (the report's one capacity,
  with its 95% half-width) per device and, from ``--price-a``/``--price-b`` (per device-hour, or per
  million output tokens), its cost per million output tokens with the interval the throughput's gives
  (``cost_per_mtok``). A CPU-only run counts its host as one device; the report says so.
- **Significance (6.3)**: per trace both systems stored under the same label and stage in every run (the
  tests' fixed loads; capacity-search levels at rates of their own are listed as unmatched), per metric
  (TTFT, TPOT, E2E) and percentile (P50, P95, P99), B/A with a 95% CI, a rank test, Benjamini–Hochberg
  across rows and the verdict (``compare_effects``, on ``analysis.effects``; lower is better). With at least
  2 runs per system the runs are the samples (each run's percentile is one value), so run-to-run variation
  is in the interval; with 3 or more per system and no stated difference the comparison is
  *unconditional*. One run per system compares requests and is always conditional ("single run"): an A/A
  pair of sim runs on this shared machine differed significantly in 99 of 252 rows that way.

One typed record (``BatteryComparison``) is written as ``comparison.json`` and rendered as Markdown and
HTML (``compare_pages``).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import re
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

from pydantic import Field

from analysis.effects import min_rank_pvalue
from benchcore.atomic import write_model
from benchcore.cli import BadInput
from benchcore.flags import add_out
from benchcore.schema import StrictModel
from microbench.battery.compare_effects import (
    TraceEffect,
    method,
    percentile_effects,
    run_effects,
    trace_latencies,
)
from microbench.battery.compare_pages import write_pages
from microbench.battery.report import BatteryReport
from microbench.results.layout import hold_folder

__all__ = [
    "BatteryComparison",
    "Check",
    "Price",
    "SystemCost",
    "compare_reports",
    "cost_per_mtok",
    "equivalence",
    "parse_price",
]

ONE_RUN = (
    "single run: one run per system (§6.3 asks at least 3 independent runs): the intervals and tests cover "
    "the request-to-request variation within each run, not the run-to-run variation of a shared machine"
)
FEW_RUNS = (
    "fewer than 3 runs per system (§6.3 asks at least 3 independent runs): the intervals cover run-to-run "
    "variation, estimated from {n} runs"
)


class Check(StrictModel):
    """One item of §6's equivalence list, as every run of both systems states it (distinct values joined)."""

    item: str
    ref: str = Field(..., description="6.1 (MUST: refuse) or 6.2/6.4 (stated as a condition)")
    same: bool
    a: str
    b: str
    refuses: bool = Field(..., description="a difference here makes the runs incomparable")


class Price(StrictModel):
    """A price input: per device-hour, or per million output tokens."""

    amount: float = Field(..., ge=0)
    unit: Literal["device-hour", "Mtok"]
    text: str


class SystemCost(StrictModel):
    """6.2 for one system: its maximum throughput, per device, and what a million output tokens cost."""

    name: str
    runs: int = 1
    max_output_tps: float | None = Field(..., description="one run's capacity, or the mean of the runs'")
    max_output_tps_ci: float | None = Field(..., description="95% half-width: the run's, or across runs (t)")
    devices: int
    device: str
    tps_per_device: float | None
    price: Price | None
    usd_per_mtok: float | None = None
    usd_per_mtok_range: tuple[float, float] | None = None


class BatteryComparison(StrictModel):
    """Everything ``compare`` found: equivalence, normalisation, effects, and its verdict."""

    version: Literal[2] = 2
    runs_a: list[str]
    runs_b: list[str]
    status: Literal["conditional", "unconditional"] = Field(
        ..., description="unconditional: at least 3 runs per system (§6.3) and no stated difference"
    )
    conditions: list[str] = Field(default_factory=list, description="each difference, named")
    checks: list[Check]
    costs: list[SystemCost]
    effects: list[TraceEffect]
    unmatched: dict[str, list[str]] = Field(default_factory=dict, description="trace labels not in every run")
    method: str = ""


_PRICE = re.compile(
    r"^\s*\$?([0-9]*\.?[0-9]+(?:e-?[0-9]+)?)\s*/\s*(device-hour|h|hour|Mtok|1M|token)\s*$", re.I
)


def parse_price(text: str) -> Price:
    """'2.49/device-hour' (or /h), '0.60/Mtok' (per million output tokens) or '6e-7/token'."""
    m = _PRICE.match(text)
    if m is None:
        raise ValueError(
            f"price {text!r}: write AMOUNT/device-hour (or /h), AMOUNT/Mtok or AMOUNT/token, "
            "e.g. 2.49/device-hour"
        )
    amount, unit = float(m.group(1)), m.group(2).lower()
    if unit == "token":
        return Price(amount=amount * 1e6, unit="Mtok", text=text)
    return Price(amount=amount, unit="Mtok" if unit in ("mtok", "1m") else "device-hour", text=text)


def cost_per_mtok(
    tps: float | None, tps_ci: float | None, devices: int, price: Price | None
) -> tuple[float | None, tuple[float, float] | None]:
    """US$ per million output tokens at ``tps`` on ``devices`` at ``price``, and its range over tps ± ci.

    A per-device-hour price pays ``devices`` device-hours for ``tps`` × 3600 tokens; a per-token price is
    the cost itself (no interval: it does not depend on the throughput)."""
    if price is None:
        return None, None
    if price.unit == "Mtok":
        return price.amount, None
    if not tps or tps <= 0:
        return None, None
    per = lambda rate: price.amount * devices / (rate * 3600.0) * 1e6  # noqa: E731
    ci = tps_ci or 0.0
    high = per(tps - ci) if tps - ci > 0 else math.inf
    return per(tps), (per(tps + ci), high)


def _text(value: Any) -> str:
    return json.dumps(value, sort_keys=True) if isinstance(value, dict | list | tuple) else str(value)


def _spec_id(name: str, spec: dict[str, Any]) -> str:
    digest = hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:12]
    return f"{name} (spec sha256 {digest})"


def _items(r: BatteryReport) -> list[tuple[str, str, Any, bool]]:
    """§6's equivalence list as one report states it: (item, section, value, a difference refuses)."""
    d = r.disclosures
    return [
        ("workload (name and full spec)", "6.1", _spec_id(r.workload, r.workload_spec), True),
        ("workload seed", "6.1", d and d.workload_seed, True),
        ("arrival seed", "6.1", r.seed, True),
        ("load model and durations (profile)", "6.1", r.profile, True),
        ("prompt form and token space", "6.1",
         d and {k: v for k, v in d.prompts.items() if k in ("form", "token_space")}, True),
        ("SUT boundary", "6.1", r.system.sut_boundary, True),
        ("warm-up procedure", "6.4", r.warmup.cold_start, True),
        ("tests run", "6.4", sorted(t.name for t in r.tests), False),
        ("prompt salt (token contents; lengths and order are the seed's)", "6.1",
         d and d.prompts.get("salt"), False),
        ("hardware", "6.2", (r.system.hardware, r.system.accelerators), False),
        ("engine", "6.4", (r.system.engine_kind, r.system.engine_version, r.system.model), False),
        ("engine settings", "6.4", r.system.engine_settings, False),
        ("guardrails", "6.4", r.system.guardrails, False),
    ]  # fmt: skip


def _runs(x: BatteryReport | Sequence[BatteryReport]) -> list[BatteryReport]:
    return [x] if isinstance(x, BatteryReport) else list(x)


def equivalence(
    a: BatteryReport | Sequence[BatteryReport], b: BatteryReport | Sequence[BatteryReport]
) -> list[Check]:
    """§6's equivalence list over every run of A and of B: an item is the same when every run states one
    value (the MUSTs refuse when they do not, also between two runs of one system)."""
    items_a, items_b = [_items(r) for r in _runs(a)], [_items(r) for r in _runs(b)]
    checks = []
    for i, (item, ref, _, refuses) in enumerate(items_a[0]):
        va = list(dict.fromkeys(_text(items[i][2]) for items in items_a))
        vb = list(dict.fromkeys(_text(items[i][2]) for items in items_b))
        same = len(set(va) | set(vb)) == 1
        checks.append(
            Check(item=item, ref=ref, same=same, a=" | ".join(va), b=" | ".join(vb), refuses=refuses)
        )
    return checks


def _cost(name: str, reports: list[BatteryReport], price: Price | None) -> SystemCost:
    # imported here: scipy.stats takes ≈ 1.5 s, which --help or a refused flag never needs
    from scipy import stats

    caps = [r.capacity for r in reports if r.capacity is not None and r.capacity.max_output_tps is not None]
    tps = ci = None
    if len(reports) == 1 and caps:
        tps, ci = caps[0].max_output_tps, caps[0].max_output_tps_ci
    elif len(caps) >= 2:
        values = [c.max_output_tps for c in caps if c.max_output_tps is not None]
        tps = sum(values) / len(values)
        sd = math.sqrt(sum((v - tps) ** 2 for v in values) / (len(values) - 1))
        ci = float(stats.t.ppf(0.975, len(values) - 1)) * sd / math.sqrt(len(values))
    gpus = reports[0].system.accelerators
    devices = gpus or 1
    usd, span = cost_per_mtok(tps, ci, devices, price)
    return SystemCost(
        name=name,
        runs=len(reports),
        max_output_tps=tps,
        max_output_tps_ci=ci,
        devices=devices,
        device="GPU" if gpus else "host (CPU only: counted as one device)",
        tps_per_device=None if tps is None else tps / devices,
        price=price,
        usd_per_mtok=usd,
        usd_per_mtok_range=span,
    )


def _read(run: Path) -> BatteryReport:
    path = run / "report.json"
    if not path.is_file():
        raise BadInput(f"{run}: no report.json there; give the --out folder of a finished battery run")
    try:
        return BatteryReport.model_validate_json(path.read_text(encoding="utf-8"))
    except ValueError as exc:
        raise BadInput(
            f"{path} is not a battery report this suite reads: {str(exc).splitlines()[0]}"
        ) from None


def compare_reports(
    runs_a: Path | Sequence[Path],
    runs_b: Path | Sequence[Path],
    price_a: Price | None = None,
    price_b: Price | None = None,
    allow_differences: bool = False,
) -> BatteryComparison:
    """Compare the battery folders of two systems (one or several runs each); ``BadInput`` naming each
    difference that makes them incomparable, or a run count the statistics cannot use."""
    paths_a = [runs_a] if isinstance(runs_a, Path) else list(runs_a)
    paths_b = [runs_b] if isinstance(runs_b, Path) else list(runs_b)
    if not paths_a or not paths_b or (min(len(paths_a), len(paths_b)) == 1 < max(len(paths_a), len(paths_b))):
        raise BadInput(
            f"A has {len(paths_a)} run(s), B {len(paths_b)}: give one report per system (a conditional "
            "single-run comparison) or at least 2 per system (§6.3 asks 3), e.g. --a A1 A2 A3 --b B1 B2 B3"
        )
    repeated = sorted({str(p) for p in paths_a + paths_b if (paths_a + paths_b).count(p) > 1})
    if repeated:
        raise BadInput(f"{', '.join(repeated)} given more than once: each run is one independent sample")
    a, b = [_read(p) for p in paths_a], [_read(p) for p in paths_b]
    checks = equivalence(a, b)
    refusing = [c for c in checks if c.refuses and not c.same]
    if refusing and not allow_differences:
        named = "; ".join(f"{c.item} (A: {c.a[:80]}, B: {c.b[:80]})" for c in refusing)
        raise BadInput(
            "the runs are not comparable (§6.1: same workload, seeds, load model, SUT boundary in every run "
            f"of both systems): {named}. "
            "Re-run with the first run's --workload/--seed/--profile (and --salt for identical prompts), or "
            "pass --allow-differences for a comparison that is conditional on them"
        )
    conditions = [f"{c.item}: the runs differ (§{c.ref})" for c in checks if not c.same]
    fewest = min(len(a), len(b))
    if fewest == 1:
        conditions.append(ONE_RUN)
    elif fewest < 3:
        conditions.append(FEW_RUNS.format(n=fewest))
    lat_a, lat_b = [trace_latencies(p) for p in paths_a], [trace_latencies(p) for p in paths_b]
    effects = percentile_effects(lat_a[0], lat_b[0]) if fewest == 1 else run_effects(lat_a, lat_b)
    shared = {key[0] for key in set.intersection(*(set(r) for r in [*lat_a, *lat_b]))}
    return BatteryComparison(
        runs_a=[str(p) for p in paths_a],
        runs_b=[str(p) for p in paths_b],
        status="conditional" if conditions else "unconditional",
        conditions=conditions,
        checks=checks,
        costs=[_cost("A", a, price_a), _cost("B", b, price_b)],
        effects=effects,
        unmatched={
            side: sorted({k[0] for r in lat for k in r} - shared)
            for side, lat in (("A", lat_a), ("B", lat_b))
        },
        method=method(len(a), len(b))
        + (
            "; a verdict of better/worse needs both p < 0.05 and a CI excluding 1. Tests that scale their "
            "load by each run's own capacity (5.1, 5.3, 5.4) compare at the same relative load, not the same "
            "rate"
        ),
    )


def _price_flag(text: str) -> Price:
    try:
        return parse_price(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_compare_parser(sub: Any) -> None:
    """The ``compare`` subcommand's flags."""
    p = sub.add_parser(
        "compare",
        help="compare battery runs of two systems (§6): equivalence, cost per token, CIs on percentiles",
        description="Compare battery runs of two systems as the draft's §6 asks: refuses runs whose "
        "workload, seeds, load model or SUT boundary differ (or states each difference with "
        "--allow-differences), normalises throughput per device and by price, and gives B/A of each "
        "latency percentile with a bootstrap 95% CI, a rank test and a Benjamini-Hochberg correction. "
        "Give --a and --b several runs each (§6.3 asks at least 3) so the intervals hold run-to-run "
        "variation; REPORT_A REPORT_B compares one run each (conditional). Exit 0 when written, 2 on bad "
        "input.",
    )
    p.add_argument("reports", type=Path, nargs="*", metavar="REPORT", help="REPORT_A REPORT_B: one run each")
    for arm in ("a", "b"):
        p.add_argument(
            f"--{arm}", type=Path, nargs="+", metavar="DIR",
            help=f"the --out folders of system {arm.upper()}'s runs{' (the baseline)' if arm == 'a' else ''}",
        )  # fmt: skip
        p.add_argument(
            f"--price-{arm}",
            type=_price_flag,
            metavar="PRICE",
            help=f"system {arm.upper()}'s price: AMOUNT/device-hour or AMOUNT/Mtok (output tokens)",
        )
    p.add_argument(
        "--allow-differences",
        action="store_true",
        help="compare runs whose workload, seeds, profile or boundary differ: a conditional comparison",
    )
    add_out(p, "results/battery-compare-<time>: comparison.json, .md, .html")


def _sides(args: argparse.Namespace) -> tuple[list[Path], list[Path]]:
    if bool(args.reports) == bool(args.a or args.b) or bool(args.a) != bool(args.b):
        raise BadInput("give the runs as REPORT_A REPORT_B (one each) or as --a DIR... --b DIR..., not both")
    if args.reports:
        if len(args.reports) != 2:
            raise BadInput(
                f"{len(args.reports)} positional report(s): give exactly REPORT_A REPORT_B, or --a/--b"
            )
        return [args.reports[0]], [args.reports[1]]
    return list(args.a), list(args.b)


def run_compare(args: argparse.Namespace) -> int:
    """``compare``: write the comparison into ``args.out`` (locked); 0 when written."""
    runs_a, runs_b = _sides(args)
    c = compare_reports(runs_a, runs_b, args.price_a, args.price_b, args.allow_differences)
    out = args.out or Path("results") / f"battery-compare-{time.strftime('%Y%m%d-%H%M%S')}"
    with hold_folder(out):
        write_model(out / "comparison.json", c)
        write_pages(c, out)
    flagged = sum(e.verdict in ("B better", "B worse") for e in c.effects)
    print(
        f"{c.status}: {len(c.effects)} percentile rows ({flagged} better/worse), {len(c.runs_a)} run(s) of "
        f"A, {len(c.runs_b)} of B, {len(c.conditions)} condition(s); wrote {out}"
    )
    for line in c.conditions:
        print(f"  condition: {line}")
    if len(c.runs_a) > 1 and min_rank_pvalue(len(c.runs_a), len(c.runs_b)) >= 0.05:
        print("  note: with so few runs no row can be called better or worse (4 runs per system can)")
    return 0
