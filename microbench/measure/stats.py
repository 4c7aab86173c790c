"""Pure statistics of load runs: distributions, per-request latencies, and the draft's derived points.

Everything here takes arrays or trace frames and returns numbers, so each rule of the IETF draft is
unit-tested on synthetic data with a known answer: percentile summaries (5.1.4.1), input-length buckets
(5.1.4.2), knee / saturation / optimal points (5.3.4), ITL gaps and modality (5.4.4), Jain's index and
starvation (5.6.4). The context-scaling fit is ``scaling``; the searches for a maximum are ``search``.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence

import numpy as np
import pandas as pd
from pydantic import Field

from benchcore.schema import StrictModel

__all__ = [
    "LENGTH_BUCKETS",
    "Distribution",
    "inter_chunk_gaps",
    "jain_index",
    "knee_point",
    "length_bucket_label",
    "modality",
    "optimal_point",
    "request_latencies",
    "saturation_point",
    "starvation_rate",
    "summarize",
]

LENGTH_BUCKETS = (0, 256, 512, 1024, 2048, 4096)  # 5.1.4.2's recommended input-length buckets
_NS = 1e9


class Distribution(StrictModel):
    """Summary of one sample (seconds or any unit the caller uses); percentiles by linear interpolation."""

    count: int = Field(..., ge=0)
    mean: float | None = None
    std: float | None = None
    min: float | None = None
    max: float | None = None
    p50: float | None = None
    p90: float | None = None
    p95: float | None = None
    p99: float | None = None
    p999: float | None = None


def summarize(values: Sequence[float] | np.ndarray) -> Distribution:
    """Count, mean, std, min, max and P50/P90/P95/P99/P99.9 of the finite values (empty: count 0)."""
    data = np.asarray(values, dtype=float)
    data = data[np.isfinite(data)]
    if data.size == 0:
        return Distribution(count=0)
    p50, p90, p95, p99, p999 = (float(v) for v in np.percentile(data, [50, 90, 95, 99, 99.9]))
    return Distribution(
        count=int(data.size),
        mean=float(data.mean()),
        std=float(data.std(ddof=1)) if data.size > 1 else 0.0,
        min=float(data.min()),
        max=float(data.max()),
        p50=p50,
        p90=p90,
        p95=p95,
        p99=p99,
        p999=p999,
    )


def request_latencies(frame: pd.DataFrame) -> pd.DataFrame:
    """Per request of a trace frame: ``ttft_s``, ``tpot_s``, ``e2e_s``, tokens, class and success.

    TTFT is first content chunk − actual send (T_submit, 5.1.3); TPOT is (last chunk − first chunk) /
    (output tokens − 1); end-to-end is completion − send. Failed requests keep NaN latencies.
    """
    ok = (frame["status"] == "ok").to_numpy()
    send = frame["send_ns"].astype("Float64").to_numpy(dtype=float, na_value=np.nan)
    first = frame["first_chunk_ns"].astype("Float64").to_numpy(dtype=float, na_value=np.nan)
    last = frame["last_chunk_ns"].astype("Float64").to_numpy(dtype=float, na_value=np.nan)
    done = frame["done_ns"].astype("Float64").to_numpy(dtype=float, na_value=np.nan)
    out = frame["output_tokens"].astype("Float64").to_numpy(dtype=float, na_value=np.nan)
    inp = frame["input_tokens"].astype("Float64").to_numpy(dtype=float, na_value=np.nan)
    inp = np.where(np.isnan(inp), frame["prompt_tokens"].to_numpy(dtype=float), inp)
    with np.errstate(invalid="ignore", divide="ignore"):
        tpot = np.where(out > 1, (last - first) / (out - 1) / _NS, np.nan)
    result = pd.DataFrame(
        {
            "ok": ok,
            "slo_class": frame["slo_class"].to_numpy(),
            "client_id": frame["client_id"].to_numpy(),
            "input_tokens": inp,
            "output_tokens": out,
            "send_s": send / _NS,
            "done_s": done / _NS,
            "ttft_s": np.where(ok, (first - send) / _NS, np.nan),
            "tpot_s": np.where(ok, tpot, np.nan),
            "e2e_s": np.where(ok, (done - send) / _NS, np.nan),
            "error": frame["error"].to_numpy(),
        }
    )
    return result


def length_bucket_label(tokens: float) -> str:
    """The 5.1.4.2 bucket of an input length: ``0-256`` … ``2048-4096`` or ``4096+``."""
    for lo, hi in itertools.pairwise(LENGTH_BUCKETS):
        if lo <= tokens < hi:
            return f"{lo}-{hi}"
    return f"{LENGTH_BUCKETS[-1]}+"


def inter_chunk_gaps(chunk_ns: Sequence[int]) -> np.ndarray:
    """Gaps (s) between consecutive chunks of one stream; the TTFT interval is never among them (5.4.3)."""
    stamps = np.asarray(chunk_ns, dtype=float)
    return np.diff(stamps) / _NS if stamps.size > 1 else np.empty(0)


def modality(values: Sequence[float] | np.ndarray, bins: int = 40) -> str:
    """``unimodal`` or ``multimodal (k peaks)`` from a smoothed histogram of log values.

    Peaks are local maxima of the 5-bin moving average at least 10% as high as the highest; two
    neighbouring peaks count separately only when the valley between them falls below half of the lower
    one (otherwise they are one mode). Fewer than 20 samples: ``undetermined``.
    """
    data = np.asarray(values, dtype=float)
    data = data[np.isfinite(data) & (data > 0)]
    if data.size < 20:
        return "undetermined (fewer than 20 samples)"
    if np.ptp(np.log(data)) < 1e-9:
        return "unimodal"
    counts, _ = np.histogram(np.log(data), bins=bins)
    smooth = np.convolve(counts, np.ones(5) / 5, mode="same")
    padded = np.concatenate(([-1.0], smooth, [-1.0]))
    peaks = [
        i
        for i in range(bins)
        if padded[i + 1] > padded[i] and padded[i + 1] >= padded[i + 2] and smooth[i] >= 0.1 * smooth.max()
    ]
    modes = peaks[:1]
    for i in peaks[1:]:
        last = modes[-1]
        if smooth[last : i + 1].min() < 0.5 * min(smooth[last], smooth[i]):
            modes.append(i)
        elif smooth[i] > smooth[last]:
            modes[-1] = i
    return "unimodal" if len(modes) <= 1 else f"multimodal ({len(modes)} peaks)"


def knee_point(levels: Sequence[float], p99: Sequence[float | None]) -> float | None:
    """First load level whose P99 latency exceeds 2× the smallest P99 observed (5.3.4); None if none."""
    values = [v for v in p99 if v is not None and math.isfinite(v)]
    if not values:
        return None
    floor = min(values)
    for level, value in zip(levels, p99, strict=True):
        if value is not None and value > 2 * floor:
            return level
    return None


def saturation_point(
    levels: Sequence[float], achieved: Sequence[float | None], ci: Sequence[float | None] | None = None
) -> float | None:
    """First load level whose achieved throughput falls below the previous level's (5.3.4).

    With ``ci`` (95% half-widths of each level's throughput) a fall counts only when it exceeds the two
    half-widths combined in quadrature, so Poisson noise between two equal throughputs is not a "fall".
    """
    for i in range(1, len(levels)):
        prev, cur = achieved[i - 1], achieved[i]
        if prev is None or cur is None:
            continue
        margin = 0.0
        if ci is not None and ci[i - 1] is not None and ci[i] is not None:
            margin = math.hypot(ci[i - 1], ci[i])  # type: ignore[arg-type]
        if cur < prev - margin:
            return levels[i]
    return None


def optimal_point(
    levels: Sequence[float], achieved: Sequence[float | None], meets_slo: Sequence[bool]
) -> float | None:
    """Load level with the highest achieved throughput among those meeting the SLO (5.3.4)."""
    best: tuple[float, float] | None = None
    for level, value, ok in zip(levels, achieved, meets_slo, strict=True):
        if ok and value is not None and (best is None or value > best[1]):
            best = (level, value)
    return None if best is None else best[0]


def jain_index(values: Sequence[float] | np.ndarray) -> float:
    """Jain's fairness index (Σx)² / (n·Σx²): 1 is perfectly fair, 1/n maximally unfair (5.6.4)."""
    x = np.asarray(values, dtype=float)
    x = x[np.isfinite(x)]
    if x.size == 0 or not np.any(x):
        raise ValueError("Jain's index needs at least one finite, non-zero value")
    return float(x.sum() ** 2 / (x.size * np.square(x).sum()))


def starvation_rate(waits: Sequence[float] | np.ndarray, factor: float = 5.0) -> float:
    """Fraction of requests waiting longer than ``factor`` × the median wait of their class (5.6.4)."""
    w = np.asarray(waits, dtype=float)
    w = w[np.isfinite(w)]
    if w.size == 0:
        raise ValueError("starvation rate needs at least one wait")
    return float(np.mean(w > factor * np.median(w)))
