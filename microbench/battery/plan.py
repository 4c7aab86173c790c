"""The battery's plan before it runs: tests, levels, requests and estimated time.

``estimate_plan(tests, profile, probe)`` is pure: from a short closed-loop probe (its completion rate and
mean end-to-end time) it estimates each test's levels, requests and seconds. Each test registers its own
estimate with itself (``registry.register_test(..., estimate=...)``: a ``PlanInputs`` → ``Estimate``
function next to the test), and whether it needs the capacity measurement, which is planned once before
the first test that does. The estimates are rough (5.9's long prompts are scaled linearly from the
probe's length, restarts count 60 s) and are printed as such.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import NamedTuple, Protocol

from pydantic import Field

from benchcore.flags import hms
from benchcore.schema import StrictModel
from microbench.battery.profiles import Profile

__all__ = [
    "CAPACITY_ROW",
    "RESTART_S",
    "Estimate",
    "PlanEstimate",
    "PlanInputs",
    "PlanRow",
    "Planned",
    "Probe",
    "capacity_estimate",
    "estimate_plan",
    "format_plan",
]

RESTART_S = 60.0  # an engine restart (5.7, 5.10 with engine settings) on the CPU engine
CAPACITY_ROW = "capacity measurement (5.2)"


class Probe(StrictModel):
    """What the short probe measured."""

    rps: float = Field(..., gt=0, description="closed-loop completions/s at probe_concurrency")
    e2e_s: float = Field(..., gt=0, description="mean end-to-end time")
    input_tokens: float = Field(default=512.0, gt=0, description="mean input length of the workload")


class PlanRow(StrictModel):
    name: str
    levels: int
    requests: int
    seconds: float


class Estimate(NamedTuple):
    """One test's (or the capacity measurement's) planned load levels, requests and seconds."""

    levels: int
    requests: int
    seconds: float


@dataclass(frozen=True)
class PlanInputs:
    """What every estimate is computed from: the profile, the probe, 5.10's configurations, a restart."""

    profile: Profile
    probe: Probe
    configs: int = 0
    restart_s: float = RESTART_S

    def level_s(self, duration_s: float) -> float:
        """A load level of ``duration_s``, then its drain."""
        return duration_s + 2 * self.probe.e2e_s


PlanEstimate = Callable[[PlanInputs], Estimate]


class Planned(Protocol):
    """A registered test as the plan sees it (``registry.BatteryTest``)."""

    @property
    def name(self) -> str: ...

    @property
    def estimate(self) -> PlanEstimate | None: ...

    @property
    def needs_capacity(self) -> bool: ...


def capacity_estimate(inputs: PlanInputs) -> Estimate:
    """The capacity measurement (``measure.capacity``): a closed-loop ramp, then the open-loop search."""
    p, probe = inputs.profile, inputs.probe
    ramp = max(1, int(math.log2(max(p.capacity_max / p.probe_concurrency, 1))) + 1)
    ramp = min(ramp, 4)  # the ramp stops once throughput stops rising; four doublings is typical
    levels = ramp + p.search_probes
    return Estimate(
        levels, int(levels * probe.rps * p.level_duration_s), levels * inputs.level_s(p.level_duration_s)
    )


def estimate_plan(
    tests: Sequence[Planned], p: Profile, probe: Probe, configs: int = 0, restart_s: float = RESTART_S
) -> list[PlanRow]:
    """Rows for the capacity measurement (before the first test that needs it) and each test."""
    inputs = PlanInputs(p, probe, configs, restart_s)
    rows = []
    if any(t.needs_capacity for t in tests):
        rows.append(PlanRow(name=CAPACITY_ROW, **capacity_estimate(inputs)._asdict()))
    for test in tests:
        levels, reqs, secs = Estimate(0, 0, 0.0) if test.estimate is None else test.estimate(inputs)
        rows.append(PlanRow(name=test.name, levels=levels, requests=reqs, seconds=secs))
    return rows


def format_plan(rows: list[PlanRow], probe: Probe, profile: str) -> str:
    lines = [
        f"battery plan (profile {profile}; probe: {probe.rps:.2f} req/s closed loop, "
        f"mean E2E {probe.e2e_s * 1e3:.0f} ms; estimates are rough)",
        f"  {'step':<28} {'levels':>6} {'requests':>9} {'est. time':>10}",
    ]
    lines += [f"  {r.name:<28} {r.levels:>6} {r.requests:>9} {hms(r.seconds):>10}" for r in rows]
    lines.append(
        f"  {'total':<28} {'':>6} {sum(r.requests for r in rows):>9} {hms(sum(r.seconds for r in rows)):>10}"
    )
    return "\n".join(lines)
