"""The wake probe's stored form: isolated cold requests, each sent after the engine idled a set time.

``microbench.measure.wake`` measures it (a sweep's ``wake_probe``), the run folder keeps it as
``wake/<chunk>.json`` (``RunFolder.write_wake``), and ``analysis.calibrate.wake`` turns it into the wake
cost the simulator charges the first step after an idle spell (``engine_harness.wake_model``).
"""

from __future__ import annotations

from pydantic import Field, field_validator

from benchcore.schema import StrictModel
from microbench.results.records import SCHEMA_VERSION

__all__ = ["WakeProbeConfig", "WakeProbeRecord", "WakeSample"]


class WakeProbeConfig(StrictModel):
    """What a sweep's wake probe sends (``SweepConfig.wake_probe``): after the grid, on the same engine."""

    gaps_s: list[float] = Field(
        description="idle times before a request (s); the shortest is the warm reference every other gap's "
        "extra time is measured against, so keep it short (0.02 s: the engine has not yet gone idle)",
        min_length=2,
    )
    prompt_tokens: int = Field(256, ge=16, le=1 << 20, description="a probe request's cold prompt")
    repetitions: int = Field(6, ge=3, le=100, description="requests per gap (the gaps taken in turn)")

    @field_validator("gaps_s")
    @classmethod
    def _gaps(cls, v: list[float]) -> list[float]:
        if any(not 0 < g <= 60 for g in v):
            raise ValueError(f"idle gaps must be in (0, 60] s, got {v}")
        return sorted(set(v))


class WakeSample(StrictModel):
    """One probe request: how long the engine idled before it, and what it took."""

    gap_s: float = Field(description="the gap asked for")
    idle_s: float = Field(description="from the previous request's last byte to this one's send (s)")
    ttft_ms: float | None = Field(description="send → first token (ms); None: the request failed")
    cached_prompt_tokens: int | None = Field(
        None, description="prefix-cache hit the engine reported (a probe prompt is cold: 0, or under 16)"
    )
    error: str | None = None


class WakeProbeRecord(StrictModel):
    """Every sample of one chunk size's wake probe, in the order sent."""

    schema_version: int = SCHEMA_VERSION
    chunk_size: int
    config: WakeProbeConfig
    samples: list[WakeSample]
