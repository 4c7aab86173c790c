"""The per-P TTFT breakdown and the contention factor, derived from the records' table (pure).

Disaggregated TTFT splits into parts that add up by construction (all in one clock, the client's and
the proxy's ``perf_counter_ns``, except the transfer, which is the consumer's own NIXL time inside the
consumer leg):

    total = producer (prefill + 1 token) + proxy gap + KV transfer (connector) + consumer rest
            + client ↔ proxy

``consumer rest`` is the consumer leg minus the connector's transfer time: its scheduling, the
connector's handshake and bookkeeping, and its first decode step over the whole context. A connector
that reports no transfer time leaves the consumer leg undivided (``kv_xfer_ms`` NaN, never 0).

The stacked parts shown per P are those of the *median repetition* (the one whose total TTFT is the
median; the lower of the two middle ones for an even count), so the stack adds up to the total it
stands for; ``*_median_ms`` columns keep each part's own median beside it (those need not add up).

Contention: ``colocated`` is the producer serving alone while its connector peer idles on the other
core; ``alone`` is the same engine started with no connector and no peer. ``contention_factor`` is
colocated ÷ alone (median TTFT), ``prefill_factor`` the disaggregated producer leg ÷ alone.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

__all__ = ["STACK", "breakdown_table", "median_row"]

STACK = ["producer_ms", "proxy_gap_ms", "kv_xfer_ms", "consumer_rest_ms", "client_overhead_ms"]
_NUMERIC = [
    "total_ttft_ms",
    "producer_ms",
    "proxy_gap_ms",
    "consumer_ttft_ms",
    "handoff_ms",
    "client_overhead_ms",
    "kv_xfer_ms",
]


def _parts(dis: pd.DataFrame) -> pd.DataFrame:
    out = dis.copy()
    for col in _NUMERIC:
        out[col] = pd.to_numeric(out[col], errors="coerce") if col in out else np.nan
    out["consumer_rest_ms"] = out["consumer_ttft_ms"] - out["kv_xfer_ms"]
    return out


def median_row(rows: pd.DataFrame, col: str = "total_ttft_ms") -> pd.Series:
    """The row whose ``col`` is the median (the lower middle one for an even count)."""
    ordered = rows.sort_values(col, kind="stable")
    return ordered.iloc[(len(ordered) - 1) // 2]


def _mode_stats(valid: pd.DataFrame, mode: str) -> pd.DataFrame:
    ttft = pd.to_numeric(valid[valid["mode"] == mode]["total_ttft_ms"], errors="coerce")
    g = ttft.groupby(valid[valid["mode"] == mode]["prefill_tokens"])
    return pd.DataFrame(
        {
            f"{mode}_ttft_ms": g.median(),
            f"{mode}_min_ms": g.min(),
            f"{mode}_max_ms": g.max(),
            f"n_{mode}": g.size(),
        }
    )


def breakdown_table(table: pd.DataFrame) -> pd.DataFrame:
    """Per P: the median repetition's stacked parts, each part's median, every mode's median TTFT with
    its min–max, and the contention factors (NaN where a side is missing)."""
    valid = table[table["valid"].astype(bool)]
    dis = _parts(valid[valid["mode"] == "disaggregated"])
    rows = []
    for p, group in dis.groupby("prefill_tokens"):
        mid = median_row(group)
        row: dict[str, float] = {"prefill_tokens": p, "total_ttft_ms": float(mid["total_ttft_ms"])}
        row |= {col: float(mid[col]) for col in [*STACK, "consumer_ttft_ms"]}
        row |= {f"{col}_median_ms": float(group[col].median()) for col in [*STACK, "handoff_ms"]}
        row["kv_xfer_reported"] = float(group["kv_xfer_ms"].notna().mean())
        rows.append(row)
    out = pd.DataFrame(rows).set_index("prefill_tokens") if rows else pd.DataFrame()
    for mode in ("disaggregated", "colocated", "alone"):
        stats = _mode_stats(valid, mode)
        out = stats if out.empty else out.join(stats, how="outer")
    if out.empty:
        return out
    out.index.name = "prefill_tokens"
    if "producer_ms" in out:  # kv transfer + consumer rest = the consumer leg, known or not
        legs = ["producer_ms", "proxy_gap_ms", "consumer_ttft_ms", "client_overhead_ms"]
        out["stack_sum_ms"] = out[legs].sum(axis=1, min_count=len(legs))
    out["contention_factor"] = out["colocated_ttft_ms"] / out["alone_ttft_ms"]
    producer = out.get("producer_ms_median_ms", np.nan)
    out["prefill_factor"] = producer / out["alone_ttft_ms"]
    return out.sort_index()
