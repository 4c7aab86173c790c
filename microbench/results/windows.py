"""Cutting decode streams into windows: gaps before, during and after an injected prefill.

Pure functions over chunk stamps (``perf_counter_ns``) so the arithmetic of the protocol is testable
without an engine. A *gap* is the time between two consecutive content chunks of one stream, divided
by the tokens the later chunk carried (so a chunk that bundles two tokens counts as two token gaps of
half the time, and a per-token latency is always what is compared).
"""

from __future__ import annotations

import collections
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

__all__ = ["Gap", "SteadyTracker", "gaps_of", "is_steady", "percentile_ms", "split_window"]


@dataclass(frozen=True)
class Gap:
    start_ns: int
    end_ns: int
    tokens: int

    @property
    def ms(self) -> float:
        """Per-token gap in milliseconds."""
        return (self.end_ns - self.start_ns) / 1e6 / max(self.tokens, 1)


def gaps_of(stamps: Sequence[int], tokens: Sequence[int], skip_tokens: int = 0) -> list[Gap]:
    """The gaps of one stream, leaving out those that end within its first ``skip_tokens`` tokens.

    Chunks that arrived in the same read share a stamp; the client cannot tell their arrival times
    apart, so they form one gap carrying all their tokens (its per-token time is the burst's average),
    never a run of zero-length gaps.
    """
    out: list[Gap] = []
    if not stamps:
        return out
    seen = tokens[0]
    prev = stamps[0]
    i = 1
    while i < len(stamps):
        t, n = stamps[i], tokens[i]
        while i + 1 < len(stamps) and stamps[i + 1] == t:
            i += 1
            n += tokens[i]
        if t == prev:  # a burst sharing the very first stamp: no gap to measure
            seen += n
        else:
            seen += n
            if seen > skip_tokens:
                out.append(Gap(prev, t, n))
            prev = t
        i += 1
    return out


def is_steady(gaps: Sequence[Gap], window: int, max_ratio: float) -> bool:
    """Seed 002's rule: the last ``window`` gaps are within ``max_ratio``× of each other."""
    if len(gaps) < window:
        return False
    last = [g.ms for g in gaps[-window:]]
    lo = min(last)
    return lo > 0 and max(last) / lo <= max_ratio


class SteadyTracker:
    """Seed 002's steady rule on one stream, updated per chunk: the last ``steady_window`` gaps past the
    first ``discard_tokens`` tokens within ``steady_ratio``× of each other. Chunks read together (one
    stamp) form one gap, as in ``microbench.results.windows.gaps_of``; the newest read is the open gap."""

    def __init__(self, window: int, ratio: float, discard_tokens: int) -> None:
        self.window, self.ratio, self.discard = window, ratio, discard_tokens
        self.done: collections.deque[float] = collections.deque(maxlen=self.window)
        self.prev_t: int | None = None
        self.open_t: int | None = None
        self.open_tokens = 0
        self.seen = 0

    def _open_gap(self) -> float | None:
        if self.prev_t is None or self.open_t is None or self.seen <= self.discard:
            return None
        return (self.open_t - self.prev_t) / 1e6 / max(self.open_tokens, 1)

    def add(self, t: int, n: int) -> None:
        if t != self.open_t:
            if (gap := self._open_gap()) is not None:
                self.done.append(gap)
            self.prev_t, self.open_t, self.open_tokens = self.open_t, t, 0
        self.open_tokens += n
        self.seen += n

    def steady(self) -> bool:
        last = list(self.done)
        if (gap := self._open_gap()) is not None:
            last.append(gap)
        last = last[-self.window :]
        return len(last) >= self.window and min(last) > 0 and max(last) / min(last) <= self.ratio


@dataclass(frozen=True)
class WindowSplit:
    before: list[Gap]
    during: list[Gap]
    after: list[Gap]


def split_window(
    gaps: Sequence[Gap], t0_ns: int, t1_ns: int, slack_ns: int = 0, exclusive: bool = False
) -> WindowSplit:
    """Gaps before, during and after the prefill window [t0, t1].

    A gap belongs to the window when its token arrived in it: ``t0 < end ≤ t1 + slack``. The slack
    widens the window past ``t1`` to take in a decode token of the same engine step as the prefill's first
    token that the client happened to read just after it; without it, that token — delayed by the last
    prefill step — would count as recovery instead of interference.

    ``exclusive``: the prefill steps ran *instead of* the decode steps (SGLang without
    ``--enable-mixed-chunk``), so no decode token comes with the prefill's first token: the decodes
    resume one decode step after ``t1``, and the gap that straddles ``t1`` is the stalled one. Then a
    gap belongs to the window when it overlaps it: ``end > t0`` and ``start < t1``.
    """
    before = [g for g in gaps if g.end_ns <= t0_ns]
    if exclusive:
        during = [g for g in gaps if g.end_ns > t0_ns and g.start_ns < t1_ns]
        after = [g for g in gaps if g.end_ns > t0_ns and g.start_ns >= t1_ns]
        return WindowSplit(before, during, after)
    during = [g for g in gaps if t0_ns < g.end_ns <= t1_ns + slack_ns]
    after = [g for g in gaps if g.end_ns > t1_ns + slack_ns]
    return WindowSplit(before, during, after)


def percentile_ms(gaps: Sequence[Gap], q: float) -> float | None:
    """The ``q``-th percentile of per-token gaps in ms, every token weighted once (a gap carrying three
    tokens counts three times at its per-token time); None when there are none."""
    if not gaps:
        return None
    return float(np.percentile(np.repeat([g.ms for g in gaps], [max(g.tokens, 1) for g in gaps]), q))
