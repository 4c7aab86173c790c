"""Searches for the largest load that meets a criterion; each probe is one awaited call, so they are pure
of any engine and are unit-tested with a synthetic criterion.

``search_max`` doubles, halves, then bisects a load (5.5.3's concurrency search); ``rate_search`` walks
fractions of a closed-loop rate X in steps of 0.1 from 0.9, then bisects to ``RESOLUTION`` (5.2.3's
open-loop search: ``capacity.measure_capacity``).
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable

from benchcore.schema import StrictModel

__all__ = ["RESOLUTION", "SearchStep", "rate_search", "search_max"]

RESOLUTION = 0.05  # of the closed-loop rate X


class SearchStep(StrictModel):
    """One probe of a capacity search: the load tried and whether it met the criteria."""

    value: float
    passed: bool


async def search_max(
    passes: Callable[[float], Awaitable[bool]],
    *,
    initial: float,
    maximum: float,
    minimum: float,
    resolution: float,
    integer: bool = False,
    max_probes: int = 32,
) -> tuple[float | None, list[SearchStep]]:
    """The largest load in [minimum, maximum] for which ``passes`` holds, assuming it is monotone.

    Starts at ``initial``; doubles while it passes (capped at ``maximum``), halves while it fails (down to
    ``minimum``), then bisects between the last pass and the first failure until they are within
    ``resolution`` (5.5.3's "increase toward maximum / decrease / until convergence"). ``integer`` rounds
    probes (concurrency). Returns the best passing value (None if even ``minimum`` fails) and every probe.
    """
    if not minimum <= initial <= maximum or resolution <= 0:
        raise ValueError("search_max needs minimum <= initial <= maximum and resolution > 0")
    steps: list[SearchStep] = []
    seen: dict[float, bool] = {}

    async def probe(value: float) -> bool:
        value = float(round(value)) if integer else value
        if value not in seen:
            seen[value] = await passes(value)
            steps.append(SearchStep(value=value, passed=seen[value]))
        return seen[value]

    good: float | None = None
    bad: float | None = None
    value = initial
    for _ in range(max_probes):  # each turn probes a new value: doubling or halving never repeats one
        if await probe(value):
            good = float(round(value)) if integer else value
            if value >= maximum:
                return good, steps
            value = min(value * 2, maximum)
        else:
            bad = float(round(value)) if integer else value
            if value <= minimum:
                return None, steps
            value = max(value / 2, minimum)
        if good is not None and bad is not None:
            break
    while good is not None and bad is not None and bad - good > resolution and len(steps) < max_probes:
        mid = (good + bad) / 2
        mid = float(math.floor(mid)) if integer else mid
        if mid in (good, bad):
            break
        if await probe(mid):
            good = mid
        else:
            bad = mid
    return good, steps


async def rate_search(
    passes: Callable[[float], Awaitable[bool]], x: float, probes: int
) -> tuple[float | None, list[SearchStep]]:
    """Highest rate among fractions of ``x`` for which ``passes`` holds: from 0.9, +0.1 while it passes, −0.1
    while it fails, then bisection until a pass and a failure are within ``RESOLUTION`` of ``x``, within
    ``probes`` probes. Returns the rate (None when no probe passed) and every probe."""
    steps: list[SearchStep] = []
    good: float | None = None
    bad: float | None = None
    f = 0.9
    while len(steps) < probes:
        ok = await passes(f * x)
        steps.append(SearchStep(value=f * x, passed=ok))
        if ok:
            good = f if good is None else max(good, f)
        else:
            bad = f if bad is None else min(bad, f)
        if good is not None and bad is not None:
            if bad - good <= RESOLUTION + 1e-9:
                break
            f = (good + bad) / 2
        elif ok:
            f = round(f + 0.1, 6)
        else:
            f = round(f - 0.1, 6) if f > 0.15 else f / 2
    return (None if good is None else good * x), steps
