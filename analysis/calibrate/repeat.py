"""The engine against itself: the floor a deterministic prediction cannot be expected to get under.

A real trace run again on the same engine with the same seeded schedule (same request ids, prompt and
answer lengths, send times; the load generator's new prompt salt keeps the prompts cold) differs from the
first run by what the box and the engine do differently from one run to the next: CPU noise, the engine's
speed drifting within minutes, a request joining one step earlier or later. A prediction is one fixed
sequence, so its per-request error against a real run cannot be expected below the repeat's error against
that run. ``repeat_floor`` computes, per paired metric (TTFT, TPOT, E2E) and on the same requests (compared
in the report and completed in the repeat), the prediction's error beside the repeat's; its statistics are
``analysis.calibrate.stats``'s, the repeat taking the place of the prediction.

``same_schedule`` refuses a "repeat" of another workload: its measured requests (warm-up aside) must be
the real trace's, by id, with the same prompt and answer lengths and the same send schedule (intended send
times relative to the first measured one; a warm-up that took longer only moves the whole schedule).
"""

from __future__ import annotations

from typing import Literal

import pandas as pd
from pydantic import Field, model_validator

from analysis.calibrate import stats
from analysis.calibrate.metrics import request_metrics, split_requests
from benchcore.schema import StrictModel

__all__ = [
    "SCHEDULE_TOLERANCE_NS",
    "RepeatFloor",
    "RepeatRow",
    "floor_verdict",
    "repeat_floor",
    "same_schedule",
]

SCHEDULE_TOLERANCE_NS = 1_000  # one seeded schedule gives equal intended offsets to the nanosecond


class RepeatRow(StrictModel):
    """One paired metric on the requests both comparisons share: the prediction's error and the repeat's
    (both against the real run, in %)."""

    metric: Literal["ttft", "tpot", "e2e"]
    n: int = Field(ge=2)
    model_median_ape_pct: float
    repeat_median_ape_pct: float
    model_mape_pct: float
    repeat_mape_pct: float
    repeat_mape_ci_pct: tuple[float, float]
    repeat_bias_pct: float = Field(description="mean signed error of the repeat; > 0: the repeat ran slower")
    repeat_pearson_r: float | None

    @property
    def ratio(self) -> float | None:
        """The prediction's median error over the repeat's (≤ 1: the prediction is within the floor)."""
        return self.model_median_ape_pct / self.repeat_median_ape_pct if self.repeat_median_ape_pct else None


class RepeatFloor(StrictModel):
    """The repeat run and, per paired metric, the prediction's error beside the engine's own."""

    repeat: str = Field(description="the repeat trace folder")
    n_compared: int = Field(ge=0, description="requests compared in the report that completed in the repeat")
    not_in_repeat: int = Field(ge=0, description="compared in the report, failed or missing in the repeat")
    rows: list[RepeatRow]

    @model_validator(mode="after")
    def _within(self) -> RepeatFloor:
        if any(r.n > self.n_compared for r in self.rows):
            raise ValueError(f"a metric counts more requests than the {self.n_compared} compared")
        return self


def _measured(frame: pd.DataFrame) -> pd.DataFrame:
    rows = frame[~frame["warmup"].astype(bool)]
    return rows.set_index(rows["request_id"].astype(str))


def same_schedule(real: pd.DataFrame, repeat: pd.DataFrame) -> None:
    """``ValueError`` naming the first difference unless ``repeat`` ran ``real``'s measured requests on
    its schedule (see the module)."""
    a, b = _measured(real), _measured(repeat)
    if set(a.index) != set(b.index):
        only = sorted(set(a.index) ^ set(b.index), key=lambda s: (len(s), s))[:3]
        raise ValueError(
            f"its measured requests are not the real trace's ({len(a)} against {len(b)}; e.g. id "
            f"{', '.join(only)} in one only): run the same workload spec, seed and duration"
        )
    b = b.loc[a.index]
    for column in ("prompt_tokens", "max_tokens"):
        differ = a[column].astype("Int64").ne(b[column].astype("Int64")).fillna(True)
        if differ.any():
            rid = differ.idxmax()
            raise ValueError(
                f"request {rid} has {column} {a.at[rid, column]} in the real trace and "
                f"{b.at[rid, column]} in the repeat: run the same workload spec and seed"
            )
    sa = a["intended_ns"].astype(float) - float(a["intended_ns"].min())
    sb = b["intended_ns"].astype(float) - float(b["intended_ns"].min())
    off = (sa - sb).abs()
    if len(off) and off.max() > SCHEDULE_TOLERANCE_NS:
        rid = off.idxmax()
        raise ValueError(
            f"request {rid} was due {sa[rid] / 1e6:.3f} ms into the real schedule and {sb[rid] / 1e6:.3f} ms "
            "into the repeat's: run the same workload spec and arrival seed"
        )


def repeat_floor(
    real: pd.DataFrame,
    predicted: pd.DataFrame,
    repeat: pd.DataFrame,
    compared: list[str],
    repeat_dir: str,
    n_boot: int,
    seed: int,
) -> RepeatFloor:
    """The prediction's and the repeat's errors against ``real`` on the ``compared`` requests that
    completed in ``repeat`` (``same_schedule`` checked first)."""
    same_schedule(real, repeat)
    completed = set(split_requests(real, repeat).compared)  # the report's rule of "completed in both"
    shared = [i for i in compared if i in completed]
    rm, pm = request_metrics(real).loc[shared], request_metrics(predicted).loc[shared]
    qm = request_metrics(repeat).loc[shared]
    rows = []
    for name in ("ttft", "tpot", "e2e"):
        col = f"{name}_ms"
        ok = rm[col].notna() & pm[col].notna() & qm[col].notna() & (rm[col] > 0)
        if ok.sum() < 2:
            continue
        r, p, q = (f.loc[ok, col].to_numpy(float) for f in (rm, pm, qm))
        rows.append(
            RepeatRow(
                metric=name,
                n=int(ok.sum()),
                model_median_ape_pct=stats.median_ape(r, p),
                repeat_median_ape_pct=stats.median_ape(r, q),
                model_mape_pct=stats.mape(r, p),
                repeat_mape_pct=stats.mape(r, q),
                repeat_mape_ci_pct=stats.bootstrap_ci(r, q, stats.mape, n_boot, seed),
                repeat_bias_pct=stats.signed_bias(r, q),
                repeat_pearson_r=stats.pearson_r(r, q),
            )
        )
    return RepeatFloor(
        repeat=repeat_dir, n_compared=len(shared), not_in_repeat=len(compared) - len(shared), rows=rows
    )


def floor_verdict(row: RepeatRow) -> str:
    """Where the prediction stands against the floor, in words."""
    ratio = row.ratio
    if ratio is None:
        return "the repeat matched the real run exactly: no floor"
    return "within the floor" if ratio <= 1 else f"{ratio:.2f}× the floor"
