"""One capacity per run: every load level any test runs is entered in one ledger, judged by one rule.

``capacity_from(entries)`` (pure) gives the figures the report shows wherever it names a maximum:

* **max sustainable output throughput**: the highest achieved output tok/s among levels judged
  sustainable (open loop: not saturated by ``saturation.SATURATION_RULE`` and within its test's SLOs;
  closed loop: 5.5's success criteria). Its 95% half-width comes from the completions' Poisson count.
* **max sustainable rate**: the highest open-loop rate a sustainable level *put to the engine* (5.2's
  search result; ``tested_rate``: the offered rate, or the rate sent in the judged window when that was
  less), the reference 5.1, 5.3, 5.4 and 5.6 scale their load levels by.
* **peak**: the highest output tok/s achieved anywhere, sustainable or not (a saturated level can
  deliver the engine's full throughput while its queue grows).

So "max" is at least every sustainable level's throughput by construction; ``gate.check_report`` verifies
it against what the tests report, so a level that escaped the ledger shows up as a failed gate.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from pydantic import Field

from benchcore.schema import StrictModel

__all__ = ["Capacity", "LedgerEntry", "capacity_from", "tested_rate"]


def tested_rate(offered: float, sent_rps: float | None) -> float:
    """The open-loop rate a level vouches for: what it offered, or what it sent in its judged window when
    that was less. A Poisson level of a few seconds sends ±12% of its offered rate (one σ of a 70-request
    count), and a generator that falls behind sends less still; a level at 27 req/s offered that sent 23
    shows the engine keeping up with 23, not 27 (a real CI run: the sim's capacity was 23.7 req/s)."""
    return offered if sent_rps is None else min(offered, sent_rps)


class LedgerEntry(StrictModel):
    """One load level as the capacity ledger sees it."""

    test: str = Field(..., description="section that ran it, e.g. 5.2")
    label: str
    loop: Literal["open", "closed"]
    offered: float = Field(..., description="requests/s (open) or concurrency (closed)")
    sent_rps: float | None = None
    achieved_rps: float
    output_tps: float
    output_tps_ci: float | None = None
    sustainable: bool
    why: str = ""

    @property
    def tested_rps(self) -> float:
        """Open loop: the rate this level vouches for (``tested_rate``)."""
        return tested_rate(self.offered, self.sent_rps)

    @property
    def source(self) -> str:
        return f"{self.test} {self.label}"


class Capacity(StrictModel):
    """The figures every maximum in the report comes from."""

    rule: str
    max_output_tps: float | None = None
    max_output_tps_ci: float | None = None
    max_rps: float | None = Field(default=None, description="achieved requests/s at the max level")
    max_source: str | None = None
    sustainable_rate_rps: float | None = Field(
        default=None, description="highest open-loop rate a sustainable level sent (``tested_rate``)"
    )
    sustainable_rate_source: str | None = None
    peak_output_tps: float | None = None
    peak_source: str | None = None
    entries: list[LedgerEntry] = Field(default_factory=list)


def capacity_from(entries: Sequence[LedgerEntry], rule: str) -> Capacity:
    """Max sustainable throughput, max sustainable open-loop rate and peak throughput of ``entries``."""
    good = [e for e in entries if e.sustainable]
    best = max(good, key=lambda e: e.output_tps, default=None)
    open_good = [e for e in good if e.loop == "open"]
    rate = max(open_good, key=lambda e: e.tested_rps, default=None)
    peak = max(entries, key=lambda e: e.output_tps, default=None)
    return Capacity(
        rule=rule,
        max_output_tps=None if best is None else best.output_tps,
        max_output_tps_ci=None if best is None else best.output_tps_ci,
        max_rps=None if best is None else best.achieved_rps,
        max_source=None if best is None else best.source,
        sustainable_rate_rps=None if rate is None else rate.tested_rps,
        sustainable_rate_source=None if rate is None else rate.source,
        peak_output_tps=None if peak is None else peak.output_tps,
        peak_source=None if peak is None else peak.source,
        entries=list(entries),
    )
