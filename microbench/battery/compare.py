"""``python -m microbench.battery compare REPORT_A REPORT_B``: two battery runs side by side (draft §6).

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
- **Significance (6.3)**: one report per system is one run, so a comparison is always conditional on
  that (§6.3 asks at least 3 independent runs; an A/A pair of sim runs on this shared machine differed
  significantly in over a third of the rows). Per trace both runs stored under the same label and stage
  (the tests' fixed loads; capacity-search levels at rates of their own are listed as unmatched), per
  metric (TTFT, TPOT, E2E) and percentile (P50, P95, P99): B/A with a seeded bootstrap 95% CI of the
  percentile ratio, the rank test across all requests with Benjamini–Hochberg across rows, and the
  verdict (``analysis.effects``: the statistics of the suite's one A/B comparison; lower is better).

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
from pathlib import Path
from typing import Any, Literal

import numpy as np
import pandas as pd
from pydantic import Field

from analysis.effects import CORRECTION, Verdict, bootstrap_ratio_ci, correct_pvalues, rank_pvalue, verdict
from benchcore.atomic import write_model
from benchcore.cli import BadInput
from benchcore.flags import add_out
from benchcore.schema import StrictModel
from microbench.battery.compare_pages import write_pages
from microbench.battery.report import BatteryReport
from microbench.loadgen.trace import read_trace
from microbench.measure.stats import request_latencies
from microbench.results.layout import hold_folder

__all__ = [
    "METRICS",
    "PERCENTILES",
    "BatteryComparison",
    "Check",
    "Price",
    "SystemCost",
    "TraceEffect",
    "compare_reports",
    "cost_per_mtok",
    "equivalence",
    "parse_price",
    "percentile_effects",
]

METRICS = {"ttft_s": "TTFT", "tpot_s": "TPOT", "e2e_s": "E2E"}
PERCENTILES = (50.0, 95.0, 99.0)
ONE_RUN = (
    "one run per system (§6.3 asks at least 3 independent runs): the intervals and tests cover the "
    "request-to-request variation within each run, not the run-to-run variation of a shared machine"
)
_SKIPPED_LABELS = ("plan-probe", "warmup", "capacity/e2e-probe")  # preparation, not a test's load


class Check(StrictModel):
    """One item of §6's equivalence list, as the two reports state it."""

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
    """6.2 for one run: its maximum throughput, per device, and what a million output tokens cost."""

    name: str
    max_output_tps: float | None
    max_output_tps_ci: float | None
    devices: int
    device: str
    tps_per_device: float | None
    price: Price | None
    usd_per_mtok: float | None = None
    usd_per_mtok_range: tuple[float, float] | None = None


class TraceEffect(StrictModel):
    """One metric's percentile in one trace stage of both runs, and what the statistics say."""

    label: str
    stage: str
    metric: str
    q: float
    n_a: int
    n_b: int
    a: float
    b: float
    ratio: float | None
    ci: tuple[float | None, float | None]
    p_value: float | None
    p_adjusted: float | None = None
    verdict: Verdict = "undecided"


class BatteryComparison(StrictModel):
    """Everything ``compare`` found: equivalence, normalisation, effects, and its verdict."""

    version: Literal[1] = 1
    run_a: str
    run_b: str
    status: Literal["conditional"] = Field(
        default="conditional", description="one run per system is never unconditional (§6.3: ≥ 3 runs)"
    )
    conditions: list[str] = Field(default_factory=list, description="each difference, named")
    checks: list[Check]
    costs: list[SystemCost]
    effects: list[TraceEffect]
    unmatched: dict[str, list[str]] = Field(default_factory=dict, description="trace labels of one run only")
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


def equivalence(a: BatteryReport, b: BatteryReport) -> list[Check]:
    """§6's equivalence list for two reports: which items match (the MUSTs refuse when they do not)."""
    da, db = a.disclosures, b.disclosures
    items: list[tuple[str, str, Any, Any, bool]] = [
        ("workload (name and full spec)", "6.1", _spec_id(a.workload, a.workload_spec),
         _spec_id(b.workload, b.workload_spec), True),
        ("workload seed", "6.1", da and da.workload_seed, db and db.workload_seed, True),
        ("arrival seed", "6.1", a.seed, b.seed, True),
        ("load model and durations (profile)", "6.1", a.profile, b.profile, True),
        ("prompt form and token space", "6.1",
         da and {k: v for k, v in da.prompts.items() if k in ("form", "token_space")},
         db and {k: v for k, v in db.prompts.items() if k in ("form", "token_space")}, True),
        ("SUT boundary", "6.1", a.system.sut_boundary, b.system.sut_boundary, True),
        ("warm-up procedure", "6.4", a.warmup.cold_start, b.warmup.cold_start, True),
        ("tests run", "6.4", sorted(t.name for t in a.tests), sorted(t.name for t in b.tests), False),
        ("prompt salt (token contents; lengths and order are the seed's)", "6.1",
         da and da.prompts.get("salt"), db and db.prompts.get("salt"), False),
        ("hardware", "6.2", (a.system.hardware, a.system.accelerators),
         (b.system.hardware, b.system.accelerators), False),
        ("engine", "6.4", (a.system.engine_kind, a.system.engine_version, a.system.model),
         (b.system.engine_kind, b.system.engine_version, b.system.model), False),
        ("engine settings", "6.4", a.system.engine_settings, b.system.engine_settings, False),
        ("guardrails", "6.4", a.system.guardrails, b.system.guardrails, False),
    ]  # fmt: skip
    return [
        Check(item=item, ref=ref, same=_text(va) == _text(vb), a=_text(va), b=_text(vb), refuses=refuses)
        for item, ref, va, vb, refuses in items
    ]


def _cost(name: str, report: BatteryReport, price: Price | None) -> SystemCost:
    cap = report.capacity
    tps = None if cap is None else cap.max_output_tps
    ci = None if cap is None else cap.max_output_tps_ci
    gpus = report.system.accelerators
    devices = gpus or 1
    usd, span = cost_per_mtok(tps, ci, devices, price)
    return SystemCost(
        name=name,
        max_output_tps=tps,
        max_output_tps_ci=ci,
        devices=devices,
        device="GPU" if gpus else "host (CPU only: counted as one device)",
        tps_per_device=None if tps is None else tps / devices,
        price=price,
        usd_per_mtok=usd,
        usd_per_mtok_range=span,
    )


def trace_latencies(run: Path) -> dict[tuple[str, str], pd.DataFrame]:
    """Per (trace label, stage) of a battery folder: the latencies of its measured (not warm-up) requests."""
    found = {}
    for header in sorted((run / "traces").rglob("header.json")):
        label = header.parent.relative_to(run / "traces").as_posix()
        if label.startswith(_SKIPPED_LABELS):
            continue
        _, frame = read_trace(header.parent)
        frame = frame[~frame["warmup"].astype(bool)]
        lat = request_latencies(frame)
        for stage in frame["stage"].unique():
            found[(label, str(stage))] = lat[(frame["stage"] == stage).to_numpy()].reset_index(drop=True)
    return found


def percentile_effects(
    a: dict[tuple[str, str], pd.DataFrame], b: dict[tuple[str, str], pd.DataFrame], n_boot: int = 2000
) -> list[TraceEffect]:
    """Every metric × percentile of every (label, stage) both runs hold (lower is better), corrected across
    the rank tests of all (label, stage, metric)."""
    effects: list[TraceEffect] = []
    tests: list[float] = []
    for key in sorted(set(a) & set(b)):
        for column, metric in METRICS.items():
            xa = a[key].loc[a[key]["ok"], column].to_numpy(dtype=float)
            xb = b[key].loc[b[key]["ok"], column].to_numpy(dtype=float)
            xa, xb = xa[np.isfinite(xa)], xb[np.isfinite(xb)]
            if xa.size < 2 or xb.size < 2:
                continue
            p = rank_pvalue(xa, xb)
            tests.append(p)
            for q in PERCENTILES:
                pa, pb = float(np.percentile(xa, q)), float(np.percentile(xb, q))
                low, high = bootstrap_ratio_ci(
                    xa, xb, seed=[len(effects), int(q)], n_boot=n_boot, quantile=q / 100
                )
                effects.append(
                    TraceEffect(
                        label=key[0], stage=key[1], metric=metric, q=q, n_a=xa.size, n_b=xb.size, a=pa, b=pb,
                        ratio=pb / pa if pa > 0 else None,
                        ci=(low if math.isfinite(low) else None, high if math.isfinite(high) else None),
                        p_value=p if math.isfinite(p) else None,
                    )
                )  # fmt: skip
    adjusted = iter(correct_pvalues(tests))
    by_test: dict[tuple[str, str, str], float] = {}
    for e in effects:
        key3 = (e.label, e.stage, e.metric)
        if key3 not in by_test:
            by_test[key3] = next(adjusted)
        e.p_adjusted = by_test[key3] if math.isfinite(by_test[key3]) else None
        ci = (e.ci[0] if e.ci[0] is not None else math.nan, e.ci[1] if e.ci[1] is not None else math.nan)
        e.verdict = verdict(e.ratio or math.nan, ci, e.p_adjusted if e.p_adjusted is not None else math.nan)
    return effects


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
    run_a: Path,
    run_b: Path,
    price_a: Price | None = None,
    price_b: Price | None = None,
    allow_differences: bool = False,
) -> BatteryComparison:
    """Compare two battery folders; ``BadInput`` naming each difference that makes them incomparable."""
    a, b = _read(run_a), _read(run_b)
    checks = equivalence(a, b)
    refusing = [c for c in checks if c.refuses and not c.same]
    if refusing and not allow_differences:
        named = "; ".join(f"{c.item} (A: {c.a[:80]}, B: {c.b[:80]})" for c in refusing)
        raise BadInput(
            "the two runs are not comparable (§6.1: same workload, seeds, load model, SUT boundary): "
            f"{named}. "
            "Re-run B with A's --workload/--seed/--profile (and --salt for identical prompts), or pass "
            "--allow-differences for a comparison that is conditional on them"
        )
    conditions = [f"{c.item}: A and B differ (§{c.ref})" for c in checks if not c.same]
    conditions.append(ONE_RUN)
    lat_a, lat_b = trace_latencies(run_a), trace_latencies(run_b)
    labels_a, labels_b = {k[0] for k in lat_a}, {k[0] for k in lat_b}
    return BatteryComparison(
        run_a=str(run_a),
        run_b=str(run_b),
        status="conditional",
        conditions=conditions,
        checks=checks,
        costs=[_cost("A", a, price_a), _cost("B", b, price_b)],
        effects=percentile_effects(lat_a, lat_b),
        unmatched={"A": sorted(labels_a - labels_b), "B": sorted(labels_b - labels_a)},
        method=(
            "per trace stage both runs hold: B/A of each percentile of the successful measured requests, "
            "95% CI by a seeded percentile bootstrap of that ratio; p: two-sided Mann–Whitney U over all "
            f"requests, {CORRECTION}; a verdict of better/worse needs both p < 0.05 and a CI excluding 1. "
            "Tests that scale their load by each run's own capacity (5.1, 5.3, 5.4) compare at the same "
            "relative load, not the same rate"
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
        help="compare two battery runs (§6): equivalence checked, cost normalised, CIs on percentiles",
        description="Compare two battery runs as the draft's §6 asks: refuses runs whose workload, seeds, "
        "load model or SUT boundary differ (or states each difference with --allow-differences), normalises "
        "throughput per device and by price, and gives B/A of each latency percentile with a bootstrap 95%% "
        "CI, a rank test and a Benjamini-Hochberg correction. Exit 0 when written, 2 on bad input.",
    )
    p.add_argument("report_a", type=Path, metavar="REPORT_A", help="the --out folder of run A (baseline)")
    p.add_argument("report_b", type=Path, metavar="REPORT_B", help="the --out folder of run B")
    for arm in ("a", "b"):
        p.add_argument(
            f"--price-{arm}",
            type=_price_flag,
            metavar="PRICE",
            help=f"run {arm.upper()}'s price: AMOUNT/device-hour or AMOUNT/Mtok (output tokens)",
        )
    p.add_argument(
        "--allow-differences",
        action="store_true",
        help="compare runs whose workload, seeds, profile or boundary differ: a conditional comparison",
    )
    add_out(p, "results/battery-compare-<time>: comparison.json, .md, .html")


def run_compare(args: argparse.Namespace) -> int:
    """``compare``: write the comparison into ``args.out`` (locked); 0 when written."""
    c = compare_reports(args.report_a, args.report_b, args.price_a, args.price_b, args.allow_differences)
    out = args.out or Path("results") / f"battery-compare-{time.strftime('%Y%m%d-%H%M%S')}"
    with hold_folder(out):
        write_model(out / "comparison.json", c)
        write_pages(c, out)
    print(f"{c.status}: {len(c.effects)} percentile rows, {len(c.conditions)} condition(s); wrote {out}")
    for line in c.conditions:
        print(f"  condition: {line}")
    return 0
