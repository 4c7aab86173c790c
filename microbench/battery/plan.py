"""The battery's plan before it runs (tests, levels, requests, estimated time) and its progress with ETA.

``estimate_plan(names, profile, probe)`` is pure: from a short closed-loop probe (its completion rate and
mean end-to-end time) it estimates each test's levels, requests and seconds. The estimates are rough
(5.9's long prompts are scaled linearly from the probe's length, restarts count 60 s) and are printed as
such; ``Progress`` rescales the remaining estimates by how the finished tests compared with theirs.
``progress_line`` (pure) is the line a long load run prints every minute while it goes (5.1 conformant
alone runs for about half an hour).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

from pydantic import Field

from benchcore.flags import hms
from benchcore.schema import StrictModel
from microbench.battery.profiles import Profile

__all__ = ["RESTART_S", "PlanRow", "Probe", "Progress", "estimate_plan", "format_plan", "progress_line"]

RESTART_S = 60.0  # an engine restart (5.7, 5.10 with engine settings) on the CPU engine


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


def _level_s(p: Profile, probe: Probe, duration: float) -> float:
    return duration + 2 * probe.e2e_s  # the level, then its drain


def _capacity_plan(p: Profile, probe: Probe) -> tuple[int, int, float]:
    ramp = max(1, int(math.log2(max(p.capacity_max / p.probe_concurrency, 1))) + 1)
    ramp = min(ramp, 4)  # the ramp stops once throughput stops rising; four doublings is typical
    levels = ramp + p.search_probes
    return (
        levels,
        int(levels * probe.rps * p.level_duration_s),
        levels * _level_s(p, probe, p.level_duration_s),
    )


def _one(name: str, p: Profile, probe: Probe, configs: int, restart_s: float) -> tuple[int, int, float]:
    x = probe.rps
    lvl = _level_s
    if name == "ttft":
        return 1, p.ttft_requests, p.ttft_requests / (p.ttft_load * x) + probe.e2e_s
    if name == "tradeoff":
        n = len(p.tradeoff_levels)
        reqs = sum(f * x * p.level_duration_s for f in p.tradeoff_levels)
        return n, int(reqs), n * lvl(p, probe, p.level_duration_s)
    if name == "itl":
        secs = sum(p.itl_requests / (f * x) + 2 * probe.e2e_s for f in p.itl_levels)
        return len(p.itl_levels), p.itl_requests * len(p.itl_levels), secs
    if name == "capacity":
        n = max(1, int(math.log2(p.capacity_max / p.capacity_initial)) + 3)
        return n, int(n * x * p.capacity_duration_s), n * lvl(p, probe, p.capacity_duration_s)
    if name == "fairness":
        rate = p.fairness_load * x
        mixed = max(p.fairness_per_class / 0.2, rate * p.fairness_duration_s)
        reqs = 2 * p.fairness_per_class + mixed
        return 3, int(reqs), reqs / rate + 6 * probe.e2e_s
    if name == "prefix_cache":
        reqs = 3 * p.prefix_requests
        return 3, reqs, reqs * probe.e2e_s / p.prefix_concurrency + 2 * restart_s
    if name == "memory_pressure":
        n = len(p.pressure_levels)
        return n, int(n * x * p.pressure_duration_s), n * lvl(p, probe, p.pressure_duration_s)
    if name == "long_context":
        reqs = len(p.context_lengths) * p.context_requests
        secs = sum(p.context_requests * probe.e2e_s * n / probe.input_tokens for n in p.context_lengths)
        return len(p.context_lengths), reqs, secs
    if name == "guardrail":
        if configs < 2:
            return 0, 0, 0.0
        n = 4 + len(p.guardrail_levels)
        return (
            configs * n,
            int(configs * n * x * p.level_duration_s),
            configs * (n * lvl(p, probe, p.level_duration_s) + restart_s),
        )
    return 0, 0, 0.0


def estimate_plan(
    names: list[str], p: Profile, probe: Probe, configs: int = 0, restart_s: float = RESTART_S
) -> list[PlanRow]:
    """Rows for the capacity measurement (before the first test that needs it) and each test."""
    rows = []
    needs_capacity = {"ttft", "throughput", "tradeoff", "itl"}
    if needs_capacity & set(names):
        levels, reqs, secs = _capacity_plan(p, probe)
        rows.append(PlanRow(name="capacity measurement (5.2)", levels=levels, requests=reqs, seconds=secs))
    for name in names:
        levels, reqs, secs = _one(name, p, probe, configs, restart_s)
        rows.append(PlanRow(name=name, levels=levels, requests=reqs, seconds=secs))
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


class Progress:
    """Prints one line per finished test: elapsed time and an ETA rescaled by the estimates so far."""

    def __init__(self, rows: list[PlanRow], emit: Callable[[str], None] = print) -> None:
        self.estimates = {r.name: r.seconds for r in rows}
        self.total = sum(r.seconds for r in rows)
        self.t0 = time.monotonic()
        self.done_est = 0.0
        self.emit = emit
        self.count = 0

    def finished(self, name: str, status: str, planned: int) -> None:
        self.count += 1
        self.done_est += self.estimates.get(name, 0.0)
        if self.count == 1 and "capacity measurement (5.2)" in self.estimates:
            self.done_est += self.estimates["capacity measurement (5.2)"]
        elapsed = time.monotonic() - self.t0
        scale = elapsed / self.done_est if self.done_est > 0 else 1.0
        eta = max(self.total - self.done_est, 0.0) * scale
        self.emit(f"[{self.count}/{planned}] {name}: {status}; elapsed {hms(elapsed)}, ETA {hms(eta)}")


def progress_line(
    label: str, done: int, elapsed_s: float, planned_requests: int | None, planned_s: float | None
) -> str:
    """One progress line of a running load run: requests finished so far and the time left.

    A run bounded by a request count extrapolates from its completion rate so far; one bounded by a
    duration (or both) counts down its issuing time; with neither, no ETA is given.
    """
    parts = [f"  {label}: {done:,}" + (f"/{planned_requests:,}" if planned_requests else "") + " requests"]
    parts.append(f"{hms(elapsed_s)} in")
    left = []
    if planned_requests and done > 0:
        left.append(elapsed_s / done * max(planned_requests - done, 0))
    if planned_s is not None:
        left.append(max(planned_s - elapsed_s, 0.0))
    if left:
        parts.append(f"about {hms(min(left))} left")
    return ", ".join(parts)
