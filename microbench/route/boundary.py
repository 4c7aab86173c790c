"""The table's predicted boundary beside what the experiment shows, per cold prompt length (pure).

For each P of the workload's cold prompts:

* **predicted** (the table policy's replays): the share it offloaded, and the median interference and
  transfer costs it read at the D it saw;
* **measured, local** (the colocated replays): the decodes' aggregate delay while the prompt prefilled on
  the decode worker — per decode stream, Σ (gap − the replay's median gap) over the gaps that end between
  the prompt's send and its first token, summed over streams: the measured counterpart of the table's
  interference cost (a gap inside the windows of several prompts is shared in proportion to their P);
* **measured, offloaded** (the disaggregated replays): the hand-off the prompt paid — decode-worker leg
  sent → its first token (KV transfer + the decode worker's first step) — the counterpart of the table's
  transfer cost.

The experiment says "offload" for a P where the measured delay exceeds the measured hand-off.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from benchcore.schema import StrictModel
from microbench.route.workload import COLD, DECODE

__all__ = ["BoundaryRow", "boundary_rows", "local_decode_delay_ms"]


class BoundaryRow(StrictModel):
    prompt_tokens: int
    table_offload_share: float | None
    table_decode_running: float | None
    table_interference_ms: float | None
    table_transfer_ms: float | None
    measured_decode_delay_ms: float | None
    measured_handoff_ms: float | None
    experiment_says: str


def local_decode_delay_ms(frame: pd.DataFrame) -> pd.Series:
    """Per cold request of one replay: the decodes' aggregate delay during its prefill window (ms). Each
    decode gap's excess over the replay's median gap is shared among the cold prompts whose window (send →
    first token) holds the gap's end, in proportion to their prompt tokens (the prefill work beside it)."""
    decode = frame[(frame["client_id"] == DECODE) & (frame["status"] == "ok")]
    streams = [np.asarray(c, dtype=float) for c in decode["chunk_ns"] if len(c) > 1]
    if not streams:
        return pd.Series(dtype=float)
    ends = np.concatenate([s[1:] for s in streams])
    gaps = np.concatenate([np.diff(s) for s in streams])
    excess = np.clip(gaps - np.median(gaps), 0, None)
    cold = frame[(frame["client_id"] == COLD) & frame["send_ns"].notna() & frame["first_chunk_ns"].notna()]
    if cold.empty:
        return pd.Series(dtype=float)
    lo, hi = cold["send_ns"].to_numpy(dtype=float), cold["first_chunk_ns"].to_numpy(dtype=float)
    weight = cold["prompt_tokens"].to_numpy(dtype=float)
    inside = (ends[:, None] > lo[None, :]) & (ends[:, None] <= hi[None, :])  # gap × cold request
    shares = inside * weight[None, :]
    totals = shares.sum(axis=1, keepdims=True)
    charged = np.divide(shares, totals, out=np.zeros_like(shares), where=totals > 0) * excess[:, None]
    return pd.Series(charged.sum(axis=0) / 1e6, index=cold.index)


def _median(values: pd.Series) -> float | None:
    values = values.dropna()
    return float(values.median()) if len(values) else None


def boundary_rows(replays: list[tuple[str, bool, pd.DataFrame]]) -> list[BoundaryRow]:
    """From ``(policy, valid, frame)`` per replay: one row per cold P (valid replays only)."""
    cold = {p: [] for p in ("table", "colocated", "disaggregated")}  # type: dict[str, list[pd.DataFrame]]
    for policy, valid, frame in replays:
        if valid and policy in cold:
            part = frame[frame["client_id"] == COLD].copy()
            if policy == "colocated":
                part["decode_delay_ms"] = local_decode_delay_ms(frame)
            if policy == "disaggregated" and "consumer_first_token_ns" in part:
                part["handoff_ms"] = (part["consumer_first_token_ns"] - part["consumer_send_ns"]).astype(
                    float
                ) / 1e6
            cold[policy].append(part)
    frames = {k: pd.concat(v) if v else pd.DataFrame() for k, v in cold.items()}
    sizes = sorted({int(p) for f in frames.values() if len(f) for p in f["prompt_tokens"]})
    rows = []
    for p in sizes:
        t, c, d = (f[f["prompt_tokens"] == p] if len(f) else f for f in frames.values())
        delay = _median(c["decode_delay_ms"]) if "decode_delay_ms" in c else None
        handoff = _median(d["handoff_ms"]) if "handoff_ms" in d else None
        says = "unknown" if delay is None or handoff is None else ("offload" if delay > handoff else "local")
        rows.append(
            BoundaryRow(
                prompt_tokens=p,
                table_offload_share=float(t["offload"].astype(float).mean())
                if "offload" in t and len(t)
                else None,
                table_decode_running=_median(t["decode_running"].astype(float))
                if "decode_running" in t
                else None,
                table_interference_ms=_median(t["interference_ms"].astype(float))
                if "interference_ms" in t
                else None,
                table_transfer_ms=_median(t["transfer_ms"].astype(float)) if "transfer_ms" in t else None,
                measured_decode_delay_ms=delay,
                measured_handoff_ms=handoff,
                experiment_says=says,
            )
        )
    return rows
