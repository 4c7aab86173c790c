"""The sweep's remaining time, predicted from the points measured so far by decode batch D and prefill P.

Points finish in bursts (a fresh decode batch waits for steady state, then its points come quickly), so a
rate over the last seconds says nothing for minutes at a time ("ETA –" for whole runs). A point's cost
grows with P (its window spans the prefill) and with D: on ``results/reference-cpu`` a bare point (D = 0)
took 0.1-1 s and a point of a decode batch 0.3-7 s, the batch's start and steady-state wait included. So
every measured point's time (since the previous one ended) is kept with its (D, P), and a least-squares
line ``t = c0 + c1·[D>0] + c2·D + c3·P + c4·D·P`` over them (the terms whose inputs varied so far; a D
only once it was measured at every P) predicts each remaining point, never below the cheapest time
seen. Engine starts ahead (one per chunk size not yet begun) cost what the starts so far cost.
"""

from __future__ import annotations

import statistics
import time
from collections import Counter
from collections.abc import Iterable, Sequence

import numpy as np

__all__ = ["MIN_POINTS", "Point", "PointClock", "remaining_s"]

MIN_POINTS = 3  # no estimate before this many points were measured in this process

Point = tuple[int, int]  # D, P


def _features(points: Sequence[Point], terms: tuple[bool, bool, bool]) -> np.ndarray:
    batched, by_d, by_p = terms
    d = np.array([pt[0] for pt in points], dtype=float)
    p = np.array([pt[1] for pt in points], dtype=float) / 4096
    cols = [np.ones_like(d)]
    if batched:
        cols.append((d > 0).astype(float))
    if by_d:
        cols.append(d)
    if by_p:
        cols.append(p)
    if by_d and by_p:
        cols.append(d * p)
    return np.column_stack(cols)


def remaining_s(measured: Sequence[tuple[Point, float]], remaining: Iterable[Point]) -> float | None:
    """Seconds the ``remaining`` points (one (D, P) each) will take, from the ``measured`` ((D, P),
    seconds) so far; None before ``MIN_POINTS`` points were measured."""
    if len(measured) < MIN_POINTS:
        return None
    todo = Counter(remaining)
    if not todo:
        return 0.0
    keys = list(todo)
    # A decode batch size enters the fit once it has been measured at every P (its first point carries
    # the batch's start: alone, it would steepen the line in D far beyond what the level costs).
    n_p = len({p for (_, p), _ in measured} | {p for _, p in keys})
    per_d = Counter(d for (d, _), _ in measured)
    complete = [m for m in measured if per_d[m[0][0]] >= n_p]
    fitted = complete if len(complete) >= MIN_POINTS else list(measured)
    points = [pt for pt, _ in fitted]
    secs = np.array([s for _, s in fitted], dtype=float)
    ds = {d for d, _ in points}
    terms = (len(ds & {0}) == 1 and len(ds) > 1, len(ds - {0}) >= 2, len({p for _, p in points}) >= 2)
    coef, *_ = np.linalg.lstsq(_features(points, terms), secs, rcond=None)
    predicted = np.maximum(_features(keys, terms) @ coef, secs.min())
    return float(sum(todo[k] * t for k, t in zip(keys, predicted, strict=True)))


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
