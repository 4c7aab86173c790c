"""Per-request latencies of a trace, as seed 003 §11 defines them (ms, the client's clock).

- TTFT: first chunk − send;
- E2E: last chunk − send;
- TPOT (mean ITL of the request): (last chunk − first chunk) / (output tokens − 1), for output > 1;
- ITL distribution: every gap between consecutive chunks of a request, divided by the tokens the later
  chunk carried (an engine may put two tokens in one chunk), pooled over the requests compared.

Compared are the requests that completed in both traces and are not warm-up; ``split_requests`` counts
what it leaves out, by reason.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

__all__ = ["METRICS", "RequestSplit", "itl_values", "request_metrics", "split_requests"]

METRICS = {
    "ttft": "time to first token",
    "tpot": "time per output token (mean ITL of a request)",
    "e2e": "end-to-end latency",
    "itl": "inter-token latency (every gap, pooled)",
}


def request_metrics(frame: pd.DataFrame) -> pd.DataFrame:
    """One row per request id: ``ttft_ms``, ``e2e_ms``, ``tpot_ms`` (NaN where undefined)."""
    send = frame["send_ns"].astype("Float64")
    first = frame["first_chunk_ns"].astype("Float64")
    last = frame["last_chunk_ns"].astype("Float64")
    out_tokens = frame["output_tokens"].astype("Float64")
    tpot = (last - first) / (out_tokens - 1)
    tpot = tpot.where(out_tokens > 1)
    return pd.DataFrame(
        {
            "ttft_ms": ((first - send) / 1e6).to_numpy(float, na_value=np.nan),
            "e2e_ms": ((last - send) / 1e6).to_numpy(float, na_value=np.nan),
            "tpot_ms": (tpot / 1e6).to_numpy(float, na_value=np.nan),
        },
        index=frame["request_id"].astype(str).to_numpy(),
    )


def itl_values(frame: pd.DataFrame, request_ids: list[str]) -> np.ndarray:
    """Every inter-chunk gap (ms) per token of the later chunk, of the requests named, pooled."""
    rows = frame.set_index(frame["request_id"].astype(str)).loc[request_ids]
    gaps: list[np.ndarray] = []
    for stamps, tokens in zip(rows["chunk_ns"], rows["chunk_tokens"], strict=True):
        t = np.asarray(stamps, float)
        if t.size < 2:
            continue
        k = np.maximum(np.asarray(tokens, float)[1:], 1)
        gaps.append(np.diff(t) / k / 1e6)
    return np.concatenate(gaps) if gaps else np.array([])


@dataclass(frozen=True)
class RequestSplit:
    """Which requests are compared, and how many were left out for each reason."""

    compared: list[str]
    total: int
    warmup: int
    failed_real: int
    not_predicted: int


def split_requests(real: pd.DataFrame, predicted: pd.DataFrame) -> RequestSplit:
    """The requests completed in both traces, warm-up excluded (warm-up counted first, then real
    failures, then requests the prediction lacks or did not complete)."""
    ids = real["request_id"].astype(str)
    warm = real["warmup"].astype(bool).to_numpy()
    ok_real = (real["status"] == "ok").to_numpy() & real["first_chunk_ns"].notna().to_numpy()
    pred_ok = set(
        predicted.loc[
            (predicted["status"] == "ok") & predicted["first_chunk_ns"].notna(), "request_id"
        ].astype(str)
    )
    in_pred = ids.isin(pred_ok).to_numpy()
    return RequestSplit(
        compared=list(ids[~warm & ok_real & in_pred]),
        total=len(real),
        warmup=int(warm.sum()),
        failed_real=int((~warm & ~ok_real).sum()),
        not_predicted=int((~warm & ok_real & ~in_pred).sum()),
    )
