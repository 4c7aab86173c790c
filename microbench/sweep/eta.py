"""The sweep's remaining time, predicted from the points measured so far by prefill length P.

Points finish in bursts (a fresh decode batch waits for steady state, then its points come quickly), so a
rate over the last seconds says nothing for minutes at a time ("ETA –" for whole runs). A point's cost
grows with P (its window spans the prefill) and differs between bare points (D = 0: 0.1-1 s on
``results/reference-cpu``) and points of a decode batch (D > 0: 0.3-7 s, batch starts included). It does
not follow D in any way a line can extrapolate: on two 245-point ``--chunk 8192`` runs on the CPU engine
(2026-11-25) the seven D levels took 48, 104, 141, 99, 137, 75 and 72 s, and a least-squares line in D and
D·P, fitted on the first two batched levels, predicted up to 7.6× the real remaining time. So each
remaining point costs the mean time of the measured points of its kind (bare or batched) at its P, every
batch's start included since every batch ahead pays one; a P not yet measured of that kind comes from the
line in P through that kind's per-P means (never below the cheapest mean), and a kind not yet measured
from all points. Replayed on those two runs, the estimate at 50% was +15% and +4% off the truth (the
line in D: −37% and −46%). Engine starts ahead (one per chunk size not yet begun) cost what the starts
so far cost.
"""

from __future__ import annotations

import statistics
import time
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence

import numpy as np

__all__ = ["MIN_POINTS", "Point", "PointClock", "remaining_s"]

MIN_POINTS = 3  # no estimate before this many points were measured in this process

Point = tuple[int, int]  # D, P


def _per_kind(measured: Sequence[tuple[Point, float]]) -> dict[bool, dict[int, float]]:
    """Mean seconds per point by kind (batched: D > 0) and P."""
    times: dict[bool, dict[int, list[float]]] = defaultdict(lambda: defaultdict(list))
    for (d, p), secs in measured:
        times[d > 0][p].append(secs)
    return {kind: {p: statistics.fmean(v) for p, v in by_p.items()} for kind, by_p in times.items()}


def _predict(means: dict[int, float], p: int) -> float:
    """Seconds of a point at ``p`` from its kind's per-P means: measured, or the line in P through them."""
    if p in means:
        return means[p]
    if len(means) < 2:
        return next(iter(means.values()))
    ps = np.array(sorted(means), dtype=float)
    slope, intercept = np.polyfit(ps, [means[int(x)] for x in ps], 1)
    return max(float(intercept + slope * p), min(means.values()))


def remaining_s(measured: Sequence[tuple[Point, float]], remaining: Iterable[Point]) -> float | None:
    """Seconds the ``remaining`` points (one (D, P) each) will take, from the ``measured`` ((D, P),
    seconds) so far; None before ``MIN_POINTS`` points were measured."""
    if len(measured) < MIN_POINTS:
        return None
    kinds = _per_kind(measured)
    everything = _per_kind([((1, p), s) for (_, p), s in measured])[True]
    return float(sum(_predict(kinds.get(d > 0, everything), p) for d, p in remaining))


class PointClock:
    """Each finished point's time with its (D, P), the engine starts, and the points still to come."""

    def __init__(self, remaining: Iterable[tuple[int, int, int]]) -> None:
        self.left = Counter(remaining)  # (chunk, D, P)
        self.measured: list[tuple[Point, float]] = []
        self.starts: list[float] = []
        self.started: set[int] = set()
        self.last = time.monotonic()

    def measuring(self, chunk: int) -> None:
        """Points of ``chunk`` start (again): the engine start and warm-up before belong to no point."""
        now = time.monotonic()
        self.starts.append(now - self.last)
        self.started.add(chunk)
        self.last = now

    def finished(self, chunk: int, d: int, p: int) -> None:
        now = time.monotonic()
        self.measured.append(((d, p), now - self.last))
        self.last = now
        if self.left[(chunk, d, p)] > 0:
            self.left[(chunk, d, p)] -= 1

    def eta_s(self) -> float | None:
        points = remaining_s(self.measured, ((d, p) for _, d, p in self.left.elements()))
        if points is None:
            return None
        chunks_ahead = {c for c, _, _ in self.left.elements()} - self.started
        return points + len(chunks_ahead) * (statistics.fmean(self.starts) if self.starts else 0.0)
