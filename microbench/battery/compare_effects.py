"""The §6.3 rows of a battery comparison: per trace stage × metric × percentile, B against A.

- **One run per side** (``percentile_effects``): B/A of each percentile of the successful measured
  requests, a seeded bootstrap 95% CI of that ratio (requests resampled), the rank test across all requests,
  Benjamini–Hochberg across rows. Its interval covers request-to-request variation only: two runs of one
  configuration on a shared host differ by more than that (an A/A pair of sim runs flagged 99 of 252 rows),
  so such a comparison is always conditional.
- **Several runs per side** (``run_effects``): each run's percentile is one value, and
  ``analysis.effects.compare_samples`` compares the runs (the suite's one A/B statistics: B/A of the runs'
  first quartiles, a bootstrap CI resampling runs, the rank test on the runs' values, BH across rows, the
  minimum detectable effect), so run-to-run variation is inside the interval. A rank test on r_a and r_b
  runs cannot give a p below ``min_rank_pvalue(r_a, r_b)``: 0.1 at 3 and 3, so a "better"/"worse"
  verdict needs at least 4 runs per side; with 3 a row is "no detectable difference" (CI within ±10%) or
  "undecided".
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd
from pydantic import Field

from analysis.effects import (
    CORRECTION,
    LOCATION,
    Verdict,
    bootstrap_ratio_ci,
    compare_samples,
    correct_pvalues,
    min_rank_pvalue,
    rank_pvalue,
)
from analysis.effects import verdict as cell_verdict
from benchcore.schema import StrictModel
from microbench.loadgen.trace import read_trace
from microbench.measure.stats import request_latencies

__all__ = [
    "METRICS",
    "PERCENTILES",
    "Latencies",
    "TraceEffect",
    "method",
    "percentile_effects",
    "run_effects",
    "trace_latencies",
]

METRICS = {"ttft_s": "TTFT", "tpot_s": "TPOT", "e2e_s": "E2E"}
PERCENTILES = (50.0, 95.0, 99.0)
_SKIPPED_LABELS = ("plan-probe", "warmup", "capacity/e2e-probe")  # preparation, not a test's load

Latencies = dict[tuple[str, str], pd.DataFrame]  # (trace label, stage) -> one row per measured request


class TraceEffect(StrictModel):
    """One metric's percentile in one trace stage of both systems, and what the statistics say."""

    label: str
    stage: str
    metric: str
    q: float
    n_a: int = Field(..., description="successful requests of A (all its runs)")
    n_b: int
    runs_a: int = 1
    runs_b: int = 1
    a: float = Field(
        ..., description="A's percentile (one run) or the first quartile of its runs' percentiles"
    )
    b: float
    values_a: list[float] = Field(default_factory=list, description="each run's percentile (several runs)")
    values_b: list[float] = Field(default_factory=list)
    ratio: float | None
    ci: tuple[float | None, float | None]
    p_value: float | None
    p_adjusted: float | None = None
    mde: float | None = Field(None, description="relative change detectable (several runs); None: none is")
    verdict: Verdict = "undecided"


def trace_latencies(run: Path) -> Latencies:
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


def _ok(frame: pd.DataFrame, column: str) -> np.ndarray:
    x = frame.loc[frame["ok"], column].to_numpy(dtype=float)
    return x[np.isfinite(x)]


def _nan(x: float | None) -> float:
    return math.nan if x is None else x


def _none(x: float | None) -> float | None:
    return x if x is not None and math.isfinite(x) else None


def percentile_effects(a: Latencies, b: Latencies, n_boot: int = 2000) -> list[TraceEffect]:
    """One run per side: every metric × percentile of every (label, stage) both runs hold (lower is better),
    corrected across the rank tests of all (label, stage, metric)."""
    effects: list[TraceEffect] = []
    tests: list[float] = []
    for key in sorted(set(a) & set(b)):
        for column, metric in METRICS.items():
            xa, xb = _ok(a[key], column), _ok(b[key], column)
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
                        ratio=pb / pa if pa > 0 else None, ci=(_none(low), _none(high)), p_value=_none(p),
                    )
                )  # fmt: skip
    adjusted = iter(correct_pvalues(tests))
    by_test: dict[tuple[str, str, str], float] = {}
    for e in effects:
        key3 = (e.label, e.stage, e.metric)
        if key3 not in by_test:
            by_test[key3] = next(adjusted)
        e.p_adjusted = _none(by_test[key3])
        ci = (e.ci[0] if e.ci[0] is not None else math.nan, e.ci[1] if e.ci[1] is not None else math.nan)
        e.verdict = cell_verdict(
            e.ratio or math.nan, ci, e.p_adjusted if e.p_adjusted is not None else math.nan
        )
    return effects


def shared_keys(runs: Sequence[Latencies]) -> list[tuple[str, str]]:
    """The (label, stage) pairs every run holds."""
    return sorted(set.intersection(*(set(r) for r in runs))) if runs else []


def run_effects(a: Sequence[Latencies], b: Sequence[Latencies], seed: int = 0) -> list[TraceEffect]:
    """Several runs per side: per (label, stage) every run holds, each metric × percentile of each run is one
    value; ``compare_samples`` on those values (run-level bootstrap, rank test, BH across all rows)."""
    rows: list[tuple[tuple[str, str], str, float, int, int]] = []
    values_a: dict[tuple[int, ...], list[float]] = {}
    values_b: dict[tuple[int, ...], list[float]] = {}
    for key in shared_keys([*a, *b]):
        for column, metric in METRICS.items():
            per_a, per_b = [_ok(run[key], column) for run in a], [_ok(run[key], column) for run in b]
            if min(x.size for x in [*per_a, *per_b]) < 2:
                continue
            for q in PERCENTILES:
                index = (len(rows),)
                values_a[index] = [float(np.percentile(x, q)) for x in per_a]
                values_b[index] = [float(np.percentile(x, q)) for x in per_b]
                rows.append((key, metric, q, sum(x.size for x in per_a), sum(x.size for x in per_b)))
    found = compare_samples(values_a, values_b, seed=seed)
    return [
        TraceEffect(
            label=key[0], stage=key[1], metric=metric, q=q, n_a=n_a, n_b=n_b, runs_a=len(a), runs_b=len(b),
            a=_nan(e.location_a), b=_nan(e.location_b), values_a=values_a[(i,)],
            values_b=values_b[(i,)], ratio=e.ratio, ci=(e.ci_low, e.ci_high), p_value=e.p_value,
            p_adjusted=e.p_adjusted, mde=e.mde, verdict=e.verdict,
        )
        for i, (key, metric, q, n_a, n_b) in enumerate(rows)
        for e in [found[(i,)]]
    ]  # fmt: skip


def method(runs_a: int, runs_b: int) -> str:
    """How the rows were computed for these run counts, and what they cannot decide."""
    if runs_a == runs_b == 1:
        return (
            "single run per system: per trace stage both runs hold, B/A of each percentile of the successful "
            "measured requests, 95% CI by a seeded percentile bootstrap of that ratio; p: two-sided "
            f"Mann–Whitney U over all requests, {CORRECTION}"
        )
    floor = min_rank_pvalue(runs_a, runs_b)
    power = (
        f"; with {runs_a} and {runs_b} runs the smallest p the rank test can give is {floor:.2g}, so no row "
        "can be called better or worse (at least 4 runs per system can): a row is 'no detectable "
        "difference' when its CI lies within ±10%, else undecided"
        if floor >= 0.05
        else ""
    )
    return (
        f"{runs_a} runs of A, {runs_b} of B: per trace stage every run holds, each run's percentile is one "
        f"value; B/A of the {LOCATION}s of the runs' values, 95% CI by a seeded bootstrap resampling runs; "
        f"p: two-sided Mann–Whitney U on the runs' values, {CORRECTION} across rows{power}"
    )
