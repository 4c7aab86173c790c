"""The wake cost fitted from a sweep's wake probe: the extra time to first token after an idle spell.

A sweep run with ``wake_probe`` keeps, per chunk size, isolated cold requests each sent after the engine
idled a set gap (``microbench.measure.wake``). ``fit_wake`` takes the shortest gap as the warm reference
and gives, per gap, the median time to first token less the reference's, with a seeded bootstrap 95%
interval (both groups resampled); those medians, floored at 0, are the points of the ``WakeCost`` the
simulator charges the first step after an idle spell (``engine_harness.wake_model``). A sample that
failed, or whose prompt hit the prefix cache by a block or more (not cold), is left out and counted; a
gap with fewer than ``MIN_SAMPLES`` left is dropped and named.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from engine_harness.wake_model import WakeCost
from microbench.client.prompts import BLOCK_TOKENS
from microbench.results.wake import WakeProbeRecord

__all__ = ["MIN_SAMPLES", "WakeFit", "WakeRow", "fit_wake"]

MIN_SAMPLES = 3  # valid requests a gap needs to be kept


@dataclass(frozen=True)
class WakeRow:
    """One idle gap: its valid samples' median time to first token, and the extra over the reference."""

    gap_s: float
    n: int
    ttft_ms: float
    extra_ms: float
    extra_ci_ms: tuple[float, float]


@dataclass
class WakeFit:
    """The wake cost and the table it came from (``rows[0]`` is the reference gap: extra 0)."""

    rows: list[WakeRow]
    excluded: int
    dropped: list[float] = field(default_factory=list)

    @property
    def cost(self) -> WakeCost:
        return WakeCost(points=[(r.gap_s, max(0.0, r.extra_ms)) for r in self.rows])

    def text(self) -> str:
        """One line for the settings list: each gap's extra with its interval, and the reference."""
        ref = self.rows[0]
        parts = [
            f"{r.gap_s:g} s +{r.extra_ms:.3g} [{r.extra_ci_ms[0]:.3g}, {r.extra_ci_ms[1]:.3g}] ms"
            for r in self.rows[1:]
        ]
        tail = f"; {self.excluded} samples left out" if self.excluded else ""
        tail += f"; gaps {self.dropped} dropped (< {MIN_SAMPLES} valid)" if self.dropped else ""
        return (
            f"wake: {', '.join(parts)} (time to first token after idling, over {ref.ttft_ms:.3g} ms at "
            f"{ref.gap_s:g} s; medians of n={'/'.join(str(r.n) for r in self.rows)} probe requests, "
            f"bootstrap 95% CI{tail})"
        )


def fit_wake(probes: Sequence[WakeProbeRecord], seed: int = 0, resamples: int = 1000) -> WakeFit:
    """The wake table of ``probes`` (their samples pooled by gap). Raises ``ValueError`` when there is no
    probe, or when its shortest gap keeps fewer than ``MIN_SAMPLES`` valid samples (no reference)."""
    if not probes:
        raise ValueError("the run has no wake probe (a sweep with wake_probe set stores one)")
    by_gap: dict[float, list[float]] = {}
    excluded = 0
    for probe in probes:
        for s in probe.samples:
            cold = (s.cached_prompt_tokens or 0) < BLOCK_TOKENS
            if s.ttft_ms is None or s.error is not None or not cold:
                excluded += 1
                continue
            by_gap.setdefault(s.gap_s, []).append(s.ttft_ms)
    gaps = sorted(by_gap)
    dropped = [g for g in gaps if len(by_gap[g]) < MIN_SAMPLES]
    kept = [g for g in gaps if g not in dropped]
    shortest = min(p.config.gaps_s[0] for p in probes)  # the gaps asked for, sorted: the reference
    if not kept or kept[0] != shortest:
        raise ValueError(
            f"the wake probe's shortest gap ({shortest:g} s) has fewer than {MIN_SAMPLES} valid samples: "
            "no warm reference"
        )
    rng = np.random.default_rng(seed)
    ref = np.asarray(by_gap[kept[0]])
    ref_boot = np.median(rng.choice(ref, size=(resamples, ref.size)), axis=1)
    rows = []
    for gap in kept:
        x = np.asarray(by_gap[gap])
        extra = float(np.median(x) - np.median(ref))
        if gap == kept[0]:
            ci = (0.0, 0.0)
        else:
            boot = np.median(rng.choice(x, size=(resamples, x.size)), axis=1) - ref_boot
            ci = (float(np.percentile(boot, 2.5)), float(np.percentile(boot, 97.5)))
        rows.append(WakeRow(gap, int(x.size), float(np.median(x)), extra, ci))
    return WakeFit(rows, excluded, dropped)
