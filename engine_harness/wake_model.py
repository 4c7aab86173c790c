"""The wake cost: what the first step after an idle spell costs beyond its step model, by how long the
engine was idle.

An engine that has had nothing to do for a while serves its next request slower than the step model says:
its host cores (and a GPU's clocks) have dropped to an idle state, caches are cold, threads sleep. On the
2-core CPU VMs this suite runs on it is large. Isolated 300-token requests to CPU vLLM (worker on its own
core), 8 per idle gap, 2026-11-30 01:25 UTC (send → first token, medians): 33 ms after 0.02 s idle, 72 ms
after 0.2 s, 150 ms after 1 s, 240 ms after 3 s. Both halves grew: the hand-off (send → the step's start:
10 / 30 / 70 / 130 ms) and the prefill step itself (22 / 37 / 70 / 105 ms); the decode steps right after
ran 4–8 ms against 2.4 and were back within 50 ms. A sweep never lets the engine idle before the steps it
fits, so its step model lacks this; a workload at moderate load idles between requests all the time (the
first calibration Poisson trace: half of its requests reached an idle engine, 48% after more than 50 ms).

``WakeCost`` is a table measured by the sweep's wake probe (``microbench.measure.wake``) and fitted by
``analysis.calibrate.wake``: ``(idle seconds, extra ms)`` points, the extra added to the first step after an
idle spell. Between points it is interpolated linearly in log(idle); below the first point it falls
linearly to 0 at no idle time; past the last it stays at the last point's. No points: no wake cost (the
default). The sim's engine and the calibration replay both apply it.
"""

from __future__ import annotations

import itertools
import math

from pydantic import Field, field_validator

from benchcore.schema import StrictModel

__all__ = ["WakeCost"]


class WakeCost(StrictModel):
    """Extra time of the first step after an idle spell, by the spell's length (see the module)."""

    points: list[tuple[float, float]] = Field(
        default_factory=list,
        description="(idle s, extra ms) pairs, idle strictly ascending and > 0, extra ≥ 0; none: no cost",
    )

    @field_validator("points")
    @classmethod
    def _check(cls, v: list[tuple[float, float]]) -> list[tuple[float, float]]:
        idles = [idle for idle, _ in v]
        if any(not math.isfinite(idle) or idle <= 0 for idle in idles):
            raise ValueError(f"idle times must be finite and > 0 s, got {idles}")
        if any(b <= a for a, b in itertools.pairwise(idles)):
            raise ValueError(f"idle times must be strictly ascending, got {idles}")
        if any(not math.isfinite(extra) or extra < 0 for _, extra in v):
            raise ValueError(f"extra times must be finite and ≥ 0 ms, got {[e for _, e in v]}")
        return v

    def extra_ms(self, idle_s: float) -> float:
        """The extra time (ms) of a step that starts after ``idle_s`` seconds with nothing to do."""
        pts = self.points
        if not pts or idle_s <= 0:
            return 0.0
        (first_idle, first_extra), (last_idle, last_extra) = pts[0], pts[-1]
        if idle_s <= first_idle:
            return first_extra * idle_s / first_idle
        if idle_s >= last_idle:
            return last_extra
        for (a, ea), (b, eb) in itertools.pairwise(pts):
            if idle_s <= b:
                share = math.log(idle_s / a) / math.log(b / a)
                return ea + share * (eb - ea)
        return last_extra  # not reached: idle_s < last_idle
