"""The engine's speed during a trace against the fit's: its decode-only steps, priced by the step model.

A prediction is only as fast as the engine the fit measured; a 2-core box moves an engine's speed by tens of
percent within minutes. The engine's own log tells how far: each decode-only step of the trace (``D``
decodes, no prompt tokens) has a duration, and the fitted step model prices that shape (``α + β_d·D``:
exact where the fit has no decode-context cost δ, which the log cannot give; with δ > 0 nothing is priced).
Their median ratio over the trace says whether the engine ran at the fit's speed (1) or a factor off it;
the median per window of the trace's most common decode-only step (its modal batch ``D``: one shape, so a
mispriced batch size cannot part the windows) says whether the engine's speed held within the trace or
drifted (then no one factor rescales a fit). Decode-only steps only: a vLLM log's prefill steps lack each
chunk's cached context, which the model prices.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from pydantic import Field

from benchcore.schema import StrictModel
from engine_harness.step_model import StepModel, StepShape

__all__ = ["EngineSpeed", "SpeedWindow", "engine_speed"]

WINDOW_S = 10.0
MIN_STEPS = 20  # a window with fewer decode-only steps gives no median


class SpeedWindow(StrictModel):
    """One window of the trace: its steps of the modal batch, median duration over the model's price."""

    start_s: float = Field(description="seconds after the trace's first logged step")
    steps: int
    median_ms: float
    median_ratio: float = Field(description="median of (logged duration / step model's price)")


class EngineSpeed(StrictModel):
    """Logged decode-only step time over the fit's price, over the whole trace and per window."""

    window_s: float
    steps: int = Field(description="decode-only steps priced")
    median_ratio: float = Field(description="over every decode-only step")
    batch: int = Field(description="the modal batch: the decodes of the most common decode-only step")
    batch_price_ms: float = Field(description="the step model's price of a decode-only step of that batch")
    windows: list[SpeedWindow] = Field(description=f"windows with {MIN_STEPS} or more steps of that batch")

    @property
    def spread(self) -> tuple[float, float] | None:
        """The lowest and highest window median (None: no window had enough steps)."""
        ratios = [w.median_ratio for w in self.windows]
        return (min(ratios), max(ratios)) if ratios else None


def engine_speed(steps: pd.DataFrame, model: StepModel, window_s: float = WINDOW_S) -> EngineSpeed | None:
    """The speed of the logged steps (``prefill_tokens``, ``decode_tokens``, ``elapsed_ms``, ``t_end_s``;
    untimed steps NaN) against ``model``; None where nothing can be priced (the model has a decode-context
    cost, or the log has no timed decode-only step)."""
    if model.delta_ns > 0:
        return None
    timed = np.isfinite(steps["elapsed_ms"].to_numpy(float, na_value=np.nan))
    decode = steps[
        timed & (steps["prefill_tokens"] == 0).to_numpy() & (steps["decode_tokens"] > 0).to_numpy()
    ]
    if decode.empty:
        return None
    d, ms = decode["decode_tokens"].to_numpy(int), decode["elapsed_ms"].to_numpy(float)
    sizes, which, counts = np.unique(d, return_inverse=True, return_counts=True)
    ratio = ms / np.array([model.step_ms(StepShape(int(n))) for n in sizes])[which]  # one price per batch
    batch = int(sizes[np.argmax(counts)])  # the smallest of the most common, on a tie
    of_batch = d == batch
    window = ((decode["t_end_s"].to_numpy(float) - float(steps["t_end_s"].min())) // window_s).astype(int)
    windows = [
        SpeedWindow(
            start_s=float(w * window_s),
            steps=int(mask.sum()),
            median_ms=float(np.median(ms[mask])),
            median_ratio=float(np.median(ratio[mask])),
        )
        for w in np.unique(window[of_batch])
        if (mask := of_batch & (window == w)).sum() >= MIN_STEPS
    ]
    return EngineSpeed(
        window_s=window_s,
        steps=len(ratio),
        median_ratio=float(np.median(ratio)),
        batch=batch,
        batch_price_ms=model.step_ms(StepShape(batch)),
        windows=windows,
    )
