"""The three routing policies as one pure decision: where a request prefills, and on what inputs.

* ``colocated``: every request prefills and decodes on the decode worker;
* ``disaggregated``: every request prefills on the prefill worker, its KV moves to the decode worker;
* ``table``: the offload table (``analysis.policy.OffloadPolicy``) answers ``(D, P, chunk)``: D = the decode
  worker's running requests as the router knows them, P = the prompt's uncached tokens, chunk = the decode
  worker's token budget. Offload iff the interference cost exceeds the transfer cost.

A query outside the table's measured range is clamped onto its edge (``clamped`` says so, with the
queried inputs kept); with no running decode (D = 0) there is nothing to disturb, so the prompt stays
local whatever the table holds.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from analysis.policy import OffloadPolicy
from benchcore.schema import StrictModel

__all__ = ["POLICIES", "PolicyName", "RouteDecision", "decide"]

PolicyName = Literal["colocated", "disaggregated", "table"]
POLICIES: tuple[PolicyName, ...] = ("colocated", "disaggregated", "table")


class RouteDecision(StrictModel):
    """One request's routing decision and every input it rested on."""

    policy: PolicyName
    decode_running: int = Field(ge=0, description="D: requests on the decode worker as the router knows them")
    prompt_tokens: int = Field(ge=0, description="P: the prompt's uncached tokens")
    chunk: int = Field(gt=0, description="the decode worker's token budget")
    offload: bool
    interference_ms: float | None = Field(None, description="table: the interference cost it read")
    transfer_ms: float | None = Field(None, description="table: the transfer cost it read")
    clamped: bool = Field(False, description="table: the query lay outside the measured range")
    reason: str = ""


def _clamp(value: float, lo: float, hi: float) -> float:
    return min(max(value, lo), hi)


def decide(
    policy: PolicyName, table: OffloadPolicy | None, decode_running: int, prompt_tokens: int, chunk: int
) -> RouteDecision:
    """The decision of ``policy`` for one request (pure: the table is read, never changed)."""
    base = {"policy": policy, "decode_running": decode_running, "prompt_tokens": prompt_tokens}
    base["chunk"] = chunk
    if policy != "table":
        return RouteDecision(**base, offload=policy == "disaggregated", reason=f"always {policy}")
    if table is None:
        raise ValueError("the table policy needs an offload table (analysis.policy JSON)")
    if decode_running == 0 or prompt_tokens == 0:
        reason = "no running decode to disturb"
        return RouteDecision(**base, offload=False, interference_ms=0.0, reason=reason)
    chunks = sorted(int(x) for x in table.cells["chunk_size"].unique())
    c = int(_clamp(chunk, chunks[0], chunks[-1]))
    _, (d_lo, d_hi), (p_lo, p_hi) = table.measured_range(c)
    d, p = _clamp(decode_running, d_lo, d_hi), _clamp(prompt_tokens, p_lo, p_hi)
    clamped = (d, p, c) != (decode_running, prompt_tokens, chunk)
    answer = table.decide(d, p, c)
    return RouteDecision(
        **base,
        offload=answer.offload,
        interference_ms=answer.interference_ms,
        transfer_ms=answer.transfer_ms,
        clamped=clamped,
        reason=f"interference {answer.interference_ms:.1f} ms {'>' if answer.offload else '<='} transfer "
        f"{answer.transfer_ms:.1f} ms" + (f" (asked at D={d:g}, P={p:g}, chunk={c})" if clamped else ""),
    )
