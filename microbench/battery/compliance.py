"""Methodology compliance as data: the MUST and SHOULD requirements of a test, each met or not, and why.

The draft (§2): a test that misses a MUST is "not compliant"; one that meets every MUST but misses a
SHOULD is "conditionally compliant"; meeting all of both is "unconditionally compliant". Requirements
that do not apply to a run (e.g. P99.9 sample counts where P99.9 is not claimed) are left out, not faked.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from benchcore.schema import StrictModel

__all__ = ["Level", "Requirement", "Verdict", "must", "should", "verdict"]

Level = Literal["MUST", "SHOULD"]
Verdict = Literal["unconditionally compliant", "conditionally compliant", "not compliant", "not run"]


class Requirement(StrictModel):
    """One requirement of the draft as applied to this run."""

    ref: str = Field(..., description="section of the draft, e.g. '5.1.2.1'")
    level: Level
    text: str = Field(..., description="what the draft asks")
    met: bool
    detail: str = Field(default="", description="the measured value or the reason it was not met")


def must(ref: str, text: str, met: bool, detail: str = "") -> Requirement:
    return Requirement(ref=ref, level="MUST", text=text, met=bool(met), detail=detail)


def should(ref: str, text: str, met: bool, detail: str = "") -> Requirement:
    return Requirement(ref=ref, level="SHOULD", text=text, met=bool(met), detail=detail)


def verdict(requirements: list[Requirement]) -> Verdict:
    """The draft's compliance wording for a test given its requirements."""
    if any(r.level == "MUST" and not r.met for r in requirements):
        return "not compliant"
    if any(r.level == "SHOULD" and not r.met for r in requirements):
        return "conditionally compliant"
    return "unconditionally compliant"
