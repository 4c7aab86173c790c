"""One capacity per run: every load level any test runs is entered in one ledger, judged by one rule.

``capacity_from(entries)`` (pure) gives the figures the report shows wherever it names a maximum:

* **max sustainable output throughput**: the highest achieved output tok/s among levels judged
  sustainable (open loop: not saturated by ``saturation.SATURATION_RULE`` and within its test's SLOs;
  closed loop: 5.5's success criteria). Its 95% half-width comes from the completions' Poisson count.
* **max sustainable rate**: the highest open-loop *offered* rate judged sustainable (5.2's search result),
  the reference 5.1, 5.3, 5.4 and 5.6 scale their load levels by.
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

__all__ = ["Capacity", "LedgerEntry", "capacity_from"]


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
    def source(self) -> str:
        return f"{self.test} {self.label}"


class Capacity(StrictModel):
    """The figures every maximum in the report comes from."""

    rule: str
    max_output_tps: float | None = None
    max_output_tps_ci: float | None = None
    max_rps: float | None = Field(default=None, description="achieved requests/s at the max level")
    max_source: str | None = None
    sustainable_rate_rps: float | None = Field(default=None, description="highest sustainable open-loop rate")
    sustainable_rate_source: str | None = None
    peak_output_tps: float | None = None
    peak_source: str | None = None
    entries: list[LedgerEntry] = Field(default_factory=list)


def capacity_from(entries: Sequence[LedgerEntry], rule: str) -> Capacity:
    """Max sustainable throughput, max sustainable open-loop rate and peak throughput of ``entries``."""
    good = [e for e in entries if e.sustainable]
    best = max(good, key=lambda e: e.output_tps, default=None)
    open_good = [e for e in good if e.loop == "open"]
    rate = max(open_good, key=lambda e: e.offered, default=None)
    peak = max(entries, key=lambda e: e.output_tps, default=None)
    return Capacity(
        rule=rule,
        max_output_tps=None if best is None else best.output_tps,
        max_output_tps_ci=None if best is None else best.output_tps_ci,
        max_rps=None if best is None else best.achieved_rps,
        max_source=None if best is None else best.source,
        sustainable_rate_rps=None if rate is None else rate.offered,
        sustainable_rate_source=None if rate is None else rate.source,
        peak_output_tps=None if peak is None else peak.output_tps,
        peak_source=None if peak is None else peak.source,
        entries=list(entries),
    )
