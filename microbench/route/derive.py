"""The route experiment's figures, each computed by one pure function from what the run folder stores.

Per replay (``replay_figures``: its ``ReplayRecord`` and per-request frame):

* decode ITL p50/p99: every gap between consecutive chunks of the long-running decode streams (ms);
  decode TPOT p50/p99: per stream, (last chunk − first chunk) / (tokens − 1), over the streams (ms);
* cold TTFT p50/p99: first chunk − send of the cold prompts (ms);
* goodput: requests per second of the replay that met the SLO (TTFT ≤ ``slo_ttft_ms`` and, for more than
  one token, TPOT ≤ ``slo_tpot_ms``), and the share of requests that met it;
* offload fraction: the cold prompts the router sent to the prefill worker;
* transfer time: the mean KV transfer time the engines counted (``/metrics`` delta), and the router's
  hand-off (decode-worker leg sent → its first token, offloaded requests: transfer + the first step);
* total latency: Σ over every request of its end-to-end latency (s) — the request-seconds the policy
  cost, the quantity the offload table trades (decode delay against transfer time);
* the router's decision time p50/p99 (µs).

Across replays (``policy_summary``) each figure's median per policy with the 95 % bootstrap CI of the
median; ``ab_effects`` compares the table policy (B) with each fixed policy (A) per figure with
``analysis.effects`` (ratio of medians, bootstrap CI, rank test, Benjamini–Hochberg across figures).
Only valid replays count; the baseline of every effect is named in its row.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
from pydantic import Field

from analysis.effects import bootstrap_ratio_ci, correct_pvalues, rank_pvalue, verdict
from benchcore.schema import StrictModel
from microbench.measure.stats import inter_chunk_gaps, request_latencies
from microbench.results.route import ReplayRecord
from microbench.route.workload import COLD, DECODE

__all__ = [
    "FIGURES",
    "Effect",
    "PolicySummary",
    "ReplayFigures",
    "ab_effects",
    "policy_summary",
    "replay_figures",
]

FIGURES = (
    "decode_itl_p50_ms", "decode_itl_p99_ms", "decode_tpot_p50_ms", "decode_tpot_p99_ms",
    "cold_ttft_p50_ms", "cold_ttft_p99_ms", "goodput_rps", "slo_met_fraction", "offload_fraction",
    "kv_xfer_mean_ms", "handoff_p50_ms", "total_latency_s", "decide_p50_us", "decide_p99_us",
)  # fmt: skip
HIGHER_IS_BETTER = frozenset({"goodput_rps", "slo_met_fraction"})


def _pct(values: np.ndarray, q: float) -> float | None:
    values = values[np.isfinite(values)]
    return float(np.percentile(values, q)) if values.size else None


class ReplayFigures(StrictModel):
    """The figures of one replay (None: nothing to compute it from)."""

    policy: str
    repetition: int
    position: int
    valid: bool
    decode_itl_p50_ms: float | None
    decode_itl_p99_ms: float | None
    decode_tpot_p50_ms: float | None
    decode_tpot_p99_ms: float | None
    cold_ttft_p50_ms: float | None
    cold_ttft_p99_ms: float | None
    goodput_rps: float | None
    slo_met_fraction: float | None
    offload_fraction: float | None
    kv_xfer_mean_ms: float | None
    handoff_p50_ms: float | None
    total_latency_s: float | None
    decide_p50_us: float | None
    decide_p99_us: float | None
    loadavg_1m: float | None
    engine_busy_pct: dict[str, float] = Field(default_factory=dict)


def replay_figures(
    record: ReplayRecord, frame: pd.DataFrame, slo_ttft_ms: float, slo_tpot_ms: float
) -> ReplayFigures:
    """One replay's figures (pure)."""
    lat = request_latencies(frame)
    decode = (frame["client_id"] == DECODE).to_numpy()
    cold = (frame["client_id"] == COLD).to_numpy()
    ok = lat["ok"].to_numpy()
    gaps = [inter_chunk_gaps(c) for c, d, g in zip(frame["chunk_ns"], decode, ok, strict=True) if d and g]
    itl = np.concatenate(gaps) * 1e3 if gaps else np.empty(0)
    tpot = lat["tpot_s"].to_numpy()[decode] * 1e3
    ttft = lat["ttft_s"].to_numpy()[cold] * 1e3
    met = ok & (lat["ttft_s"].to_numpy() * 1e3 <= slo_ttft_ms)
    tpot_all = lat["tpot_s"].to_numpy() * 1e3
    met &= np.where(np.isfinite(tpot_all), tpot_all <= slo_tpot_ms, True)
    offload = frame["offload"].to_numpy(dtype=float, na_value=np.nan) if "offload" in frame else np.empty(0)
    cold_offload = offload[cold] if offload.size else np.empty(0)
    handoff = np.empty(0)
    if "consumer_first_token_ns" in frame and offload.size:
        leg = (frame["consumer_first_token_ns"] - frame["consumer_send_ns"]).to_numpy(
            dtype=float, na_value=np.nan
        )
        handoff = leg[offload == 1.0] / 1e6
    decide = (
        frame["decide_ns"].to_numpy(dtype=float, na_value=np.nan) / 1e3
        if "decide_ns" in frame
        else np.empty(0)
    )
    e2e = lat["e2e_s"].to_numpy()
    xfer = (
        record.kv_xfer_sum_ms / record.kv_xfer_count
        if record.kv_xfer_count and record.kv_xfer_sum_ms is not None
        else None
    )
    return ReplayFigures(
        policy=record.policy,
        repetition=record.repetition,
        position=record.position,
        valid=record.valid,
        decode_itl_p50_ms=_pct(itl, 50),
        decode_itl_p99_ms=_pct(itl, 99),
        decode_tpot_p50_ms=_pct(tpot, 50),
        decode_tpot_p99_ms=_pct(tpot, 99),
        cold_ttft_p50_ms=_pct(ttft, 50),
        cold_ttft_p99_ms=_pct(ttft, 99),
        goodput_rps=float(met.sum()) / record.duration_s if record.duration_s > 0 else None,
        slo_met_fraction=float(met.mean()) if met.size else None,
        offload_fraction=float(np.nanmean(cold_offload)) if cold_offload.size else None,
        kv_xfer_mean_ms=xfer,
        handoff_p50_ms=_pct(handoff, 50),
        total_latency_s=float(np.nansum(e2e)) if np.isfinite(e2e).any() else None,
        decide_p50_us=_pct(decide, 50),
        decide_p99_us=_pct(decide, 99),
        loadavg_1m=record.loadavg_1m,
        engine_busy_pct={x.role: x.busy_pct for x in record.engine_load},
    )


class PolicySummary(StrictModel):
    """One figure of one policy over its valid replays: the median and the 95 % bootstrap CI of it."""

    policy: str
    figure: str
    replays: int
    median: float | None
    ci_low: float | None
    ci_high: float | None


def _median_ci(values: np.ndarray, seed: int = 0, n_boot: int = 4000) -> tuple[float | None, float | None]:
    if values.size < 2:
        return None, None
    rng = np.random.default_rng(seed)
    meds = np.median(values[rng.integers(0, values.size, size=(n_boot, values.size))], axis=1)
    low, high = np.quantile(meds, [0.025, 0.975])
    return float(low), float(high)


def _values(figures: list[ReplayFigures], policy: str, figure: str) -> np.ndarray:
    vals = [getattr(f, figure) for f in figures if f.policy == policy and f.valid]
    return np.asarray([v for v in vals if v is not None and math.isfinite(v)], dtype=float)


def policy_summary(figures: list[ReplayFigures], policies: list[str]) -> list[PolicySummary]:
    """Per policy and figure: the median over valid replays and its CI (pure)."""
    out = []
    for policy in policies:
        for figure in FIGURES:
            x = _values(figures, policy, figure)
            low, high = _median_ci(x)
            median = float(np.median(x)) if x.size else None
            out.append(
                PolicySummary(
                    policy=policy, figure=figure, replays=int(x.size), median=median, ci_low=low, ci_high=high
                )
            )
    return out


class Effect(StrictModel):
    """B/A of one figure's medians over valid replays, with ``analysis.effects``' statistics and verdict
    (read for lower-is-better; for goodput and SLO share ``better`` says which way is better)."""

    figure: str
    baseline: str = Field(description="A: the fixed policy compared against")
    policy: str = Field(description="B: the table policy")
    ratio: float | None
    ci_low: float | None
    ci_high: float | None
    p_value: float | None
    p_adjusted: float | None
    verdict: str
    better: str | None = Field(description="which policy is better on this figure, when the verdict decides")


def _finite(x: float) -> float | None:
    return float(x) if math.isfinite(x) else None


def ab_effects(
    figures: list[ReplayFigures],
    policy: str = "table",
    baselines: tuple[str, ...] = ("colocated", "disaggregated"),
) -> list[Effect]:
    """The table policy against each fixed policy, per figure compared (pure); BH across every row."""
    compared = [f for f in FIGURES if f not in ("offload_fraction", "decide_p50_us", "decide_p99_us")]
    rows = []
    for base in baselines:
        for figure in compared:
            a, b = _values(figures, base, figure), _values(figures, policy, figure)
            ratio = float(np.median(b) / np.median(a)) if a.size and b.size and np.median(a) > 0 else math.nan
            rows.append(
                (base, figure, ratio, bootstrap_ratio_ci(list(a), list(b)), rank_pvalue(list(a), list(b)))
            )
    adjusted = correct_pvalues([r[4] for r in rows])
    out = []
    for (base, figure, ratio, ci, p), p_adj in zip(rows, adjusted, strict=True):
        v = str(verdict(ratio, ci, p_adj))
        flip = figure in HIGHER_IS_BETTER
        better = {"B better": base if flip else policy, "B worse": policy if flip else base}.get(v)
        out.append(
            Effect(
                figure=figure,
                baseline=base,
                policy=policy,
                ratio=_finite(ratio),
                ci_low=_finite(ci[0]),
                ci_high=_finite(ci[1]),
                p_value=_finite(p),
                p_adjusted=_finite(p_adj),
                verdict=v,
                better=better,
            )
        )
    return out
