"""The sweep's remaining time, predicted from the points measured so far, by prefill length P.

A point's cost grows with P (its window spans the prefill) and points finish in bursts (a fresh decode
batch waits for steady state, then its points come quickly), so a rate over the last seconds says nothing
for minutes at a time. Instead: each measured point's time (since the previous one finished) is kept under
its P; a remaining point of a measured P is predicted by the mean of that P's latest ``recent`` times (the
latest decode batch size's, which are the closest to the points still ahead); a P not measured yet by a
straight line in P through those per-P means (at least the cheapest one's), or by their mean while only
one P is known.
"""

from __future__ import annotations

import statistics
import time
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence

__all__ = ["MIN_POINTS", "PointClock", "remaining_s"]

MIN_POINTS = 3  # no estimate before this many points were measured in this process


def _line(xs: Sequence[float], ys: Sequence[float]) -> tuple[float, float]:
    """Least-squares intercept and slope of ys on xs (at least two distinct xs)."""
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sum((x - mx) ** 2 for x in xs)
    return my - slope * mx, slope


def remaining_s(
    times_by_p: Mapping[int, Sequence[float]], remaining: Iterable[int], recent: int = 5
) -> float | None:
    """Seconds the points of prefill lengths ``remaining`` (one entry per point) will take, from the
    measured seconds per point by P; None before ``MIN_POINTS`` points were measured."""
    if sum(len(t) for t in times_by_p.values()) < MIN_POINTS:
        return None
    means = {p: statistics.fmean(t[-recent:]) for p, t in times_by_p.items() if t}
    ps = sorted(means)
    if len(ps) >= 2:
        intercept, slope = _line(ps, [means[p] for p in ps])
    else:
        intercept, slope = means[ps[0]], 0.0
    floor = min(means.values())
    total = 0.0
    for p, n in Counter(remaining).items():
        per_point = means.get(p)
        if per_point is None:
            per_point = max(intercept + slope * p, floor)
        total += n * per_point
    return total


class PointClock:
    """Each finished point's time under its P, and the points still to come (their P)."""

    def __init__(self, remaining: Iterable[int]) -> None:
        self.left = Counter(remaining)
        self.times: dict[int, list[float]] = defaultdict(list)
        self.last: float | None = None

    def restart(self) -> None:
        """Measuring (re)starts now: the engine start and warm-up before it belong to no point."""
        self.last = time.monotonic()

    def finished(self, p: int) -> None:
        now = time.monotonic()
        if self.last is not None:
            self.times[p].append(now - self.last)
        self.last = now
        if self.left[p] > 0:
            self.left[p] -= 1

    def eta_s(self) -> float | None:
        return remaining_s(self.times, self.left.elements())
