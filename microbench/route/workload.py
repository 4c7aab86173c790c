"""The route experiment's workload: long-running decode streams plus bursts of cold long prompts, seeded.

One draw of the seed fixes the shape — when each request is sent, how long its prompt is, how many
tokens it asks for — so every policy replays the same workload. The token ids are drawn fresh for every
replay (``microbench.client.prompts.cold_prompt``): a replay never warms the next one's prefix cache, and
the engines' prefix-cache counters verify it. Each request carries a tag (the body's ``user`` field) that
the router takes as its request id, so the client's stamps and the router's decision meet per request.
"""

from __future__ import annotations

import random
import uuid

from pydantic import Field, field_validator

from benchcore.schema import StrictModel
from microbench.client.prompts import TokenSpace, cold_prompt
from microbench.client.requests import RequestSpec

__all__ = ["COLD", "DECODE", "RouteWorkload", "Shape", "replay_plan", "shapes"]

DECODE, COLD = "decode", "cold"


class RouteWorkload(StrictModel):
    """Long-running decodes started together, then ``bursts`` of cold prompts drawn from ``cold_tokens``."""

    decode_streams: int = Field(4, ge=0, le=256, description="long-running decode streams (started at 0)")
    decode_prompt_tokens: int = Field(64, ge=1, description="prompt length of a decode stream")
    decode_tokens: int = Field(400, ge=2, description="tokens each decode stream generates")
    cold_tokens: list[int] = Field(
        default_factory=lambda: [256, 4096], min_length=1, description="P of a cold prompt, drawn uniformly"
    )
    cold_output_tokens: int = Field(4, ge=1, description="tokens each cold prompt generates")
    bursts: int = Field(3, ge=1, le=1000, description="bursts of cold prompts")
    burst_size: int = Field(2, ge=1, le=1000, description="cold prompts per burst")
    first_burst_s: float = Field(0.5, ge=0, description="first burst after the decodes start (s)")
    burst_gap_s: float = Field(1.0, gt=0, description="time between bursts (s)")
    burst_spread_s: float = Field(0.1, ge=0, description="a burst's prompts arrive within this window (s)")

    @field_validator("cold_tokens")
    @classmethod
    def _positive(cls, v: list[int]) -> list[int]:
        if any(p <= 0 for p in v):
            raise ValueError(f"cold prompt lengths must be > 0, got {v}")
        return v


class Shape(StrictModel):
    """One request of the drawn shape: its kind, send offset, prompt length and output length."""

    kind: str
    offset_s: float
    prompt_tokens: int
    max_tokens: int


def shapes(workload: RouteWorkload, seed: int) -> list[Shape]:
    """The seeded shape (pure): decode streams at 0, then each burst's cold prompts, in send order."""
    rng = random.Random(f"route-workload:{seed}")
    out = [
        Shape(
            kind=DECODE,
            offset_s=0.0,
            prompt_tokens=workload.decode_prompt_tokens,
            max_tokens=workload.decode_tokens,
        )
        for _ in range(workload.decode_streams)
    ]
    for b in range(workload.bursts):
        start = workload.first_burst_s + b * workload.burst_gap_s
        for _ in range(workload.burst_size):
            out.append(
                Shape(
                    kind=COLD,
                    offset_s=start + rng.uniform(0, workload.burst_spread_s),
                    prompt_tokens=rng.choice(workload.cold_tokens),
                    max_tokens=workload.cold_output_tokens,
                )
            )
    return sorted(out, key=lambda s: s.offset_s)


def replay_plan(
    workload: RouteWorkload, seed: int, space: TokenSpace, replay: str
) -> list[tuple[int, RequestSpec]]:
    """The load generator's plan of one replay: ``(offset ns, request)`` with fresh cold token ids and a
    unique tag per request (``<replay>-<index>-<random>``, in ``sampling['user']``)."""
    plan = []
    for i, s in enumerate(shapes(workload, seed)):
        tag = f"{replay}-{i:03d}-{uuid.uuid4().hex[:8]}"
        spec = RequestSpec(
            prompt=cold_prompt(s.prompt_tokens, space),
            prompt_tokens=s.prompt_tokens,
            max_tokens=s.max_tokens,
            client_id=s.kind,
            session_id=tag,
            sampling={"user": tag},
        )
        plan.append((int(s.offset_s * 1e9), spec))
    return plan
