"""The corner-case batches of a batch-budget candidate (seed 001 §III-C.2) and the verdict on each (pure).

A candidate is an engine setting (``max_num_batched_tokens`` = budget B, ``max_num_seqs`` = S) and the
longest request the service admits (``context`` L: prompt + output tokens). Its worst-case batches:

- ``all-prefill``: one step's worth of prompt tokens at once: min(S, ⌈B / (L−1)⌉) prompts of
  min(L−1, ⌊B / n⌋) tokens, one output token each;
- ``decode-at-max-context``: S sequences decoding together at the full context: prompts of L − d tokens
  and d output tokens each (d = ``decode_tokens``), all sent at once;
- ``max-short-sequences``: S prompts of ``short_tokens`` tokens with d output tokens: the most sequences;
- ``one-max-prompt``: one prompt of L − 1 tokens, one output token.

A batch passes when every request succeeded, the engine is still alive, it preempted at most
``preemption_limit`` sequences, the decode batch ran as one batch (every sequence had its first token
before any finished: a batch the KV cache cannot hold is queued, not run; a sequence whose request reached
the engine — its response headers — only after another finished makes the batch inconclusive, and it is
run again), and the latency SLOs, where
given, hold (TTFT of the max-length prompt, ITL P99 of the decode batch). Every verdict says why.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from pydantic import Field

from benchcore.schema import StrictModel

__all__ = ["BatchOutcome", "CornerBatch", "ProbeLimits", "RequestOutcome", "corner_batches", "judge"]


class CornerBatch(StrictModel):
    """One worst-case batch: its requests' prompt and output lengths, all sent at once."""

    name: str
    prompt_tokens: list[int]
    output_tokens: list[int]

    @property
    def size(self) -> int:
        return len(self.prompt_tokens)


class ProbeLimits(StrictModel):
    """What a candidate's batches must meet (besides: no failed request, no dead engine)."""

    context: int = Field(..., ge=2, description="longest request the service admits (prompt + output tokens)")
    decode_tokens: int = Field(default=16, ge=2, description="output tokens of each decode-batch sequence")
    short_tokens: int = Field(default=8, ge=1, description="prompt tokens of the max-sequences batch")
    preemption_limit: int = Field(
        default=0,
        ge=0,
        description="most preemptions a batch may cause (0: a batch the KV cache cannot hold fails)",
    )
    ttft_slo_ms: float | None = Field(default=None, gt=0, description="TTFT of the max-length prompt")
    itl_slo_ms: float | None = Field(default=None, gt=0, description="ITL P99 of the decode batch")


def corner_batches(budget: int, max_seqs: int, limits: ProbeLimits) -> list[CornerBatch]:
    """The four corner-case batches of (``budget``, ``max_seqs``) at ``limits.context``."""
    longest = limits.context - 1
    n_prefill = max(1, min(max_seqs, math.ceil(budget / longest)))
    prefill_len = max(1, min(longest, budget // n_prefill))
    decode_prompt = max(1, limits.context - limits.decode_tokens)
    d = limits.context - decode_prompt
    return [
        CornerBatch(
            name="all-prefill", prompt_tokens=[prefill_len] * n_prefill, output_tokens=[1] * n_prefill
        ),
        CornerBatch(
            name="decode-at-max-context",
            prompt_tokens=[decode_prompt] * max_seqs,
            output_tokens=[d] * max_seqs,
        ),
        CornerBatch(
            name="max-short-sequences",
            prompt_tokens=[min(limits.short_tokens, longest)] * max_seqs,
            output_tokens=[limits.decode_tokens] * max_seqs,
        ),
        CornerBatch(name="one-max-prompt", prompt_tokens=[longest], output_tokens=[1]),
    ]


class RequestOutcome(StrictModel):
    """What one request of a batch did (seconds on the client's clock, from the batch's send)."""

    ok: bool
    error: str | None = None
    accepted_s: float | None = Field(default=None, description="response headers: the engine has it")
    first_token_s: float | None = None
    done_s: float | None = None
    gaps_s: list[float] = Field(default_factory=list, description="inter-token gaps")


class BatchOutcome(StrictModel):
    """A batch as run, and its verdict."""

    name: str
    sequences: int
    prompt_tokens: int = Field(..., description="longest prompt of the batch")
    output_tokens: int
    failed: int
    preemptions: float | None = Field(..., description="engine counter delta (None: not reported)")
    alive: bool
    concurrent: bool = Field(..., description="every sequence had its first token before any finished")
    late_sends: bool = Field(
        default=False,
        description="not concurrent only because some requests reached the engine after "
        "others had finished (the client sent them late): inconclusive, the batch is run again",
    )
    ttft_max_ms: float | None = None
    itl_p99_ms: float | None = None
    wall_s: float
    attempts: int = Field(default=1, ge=1, description="runs of the batch (inconclusive ones run again)")
    passed: bool = False
    why: str = ""


def _concurrency(outcomes: Sequence[RequestOutcome]) -> tuple[bool, bool]:
    """(every first token before any finish, the only late ones reached the engine after that finish)."""
    dones = [o.done_s for o in outcomes if o.done_s is not None]
    late = [o for o in outcomes if o.first_token_s is not None and dones and o.first_token_s > min(dones)]
    if not late:
        return True, False
    queued = [o for o in late if o.accepted_s is None or o.accepted_s <= min(dones)]
    return False, not queued


def judge(
    batch: CornerBatch,
    outcomes: Sequence[RequestOutcome],
    *,
    preemptions: float | None,
    alive: bool,
    wall_s: float,
    limits: ProbeLimits,
) -> BatchOutcome:
    """The verdict on one batch, with every reason it failed (or what it met)."""
    failed = [o for o in outcomes if not o.ok]
    ttfts = [o.first_token_s for o in outcomes if o.first_token_s is not None]
    gaps = [g for o in outcomes for g in o.gaps_s]
    concurrent, late_sends = (
        _concurrency(outcomes) if batch.name == "decode-at-max-context" else (True, False)
    )
    out = BatchOutcome(
        name=batch.name,
        sequences=batch.size,
        prompt_tokens=max(batch.prompt_tokens),
        output_tokens=max(batch.output_tokens),
        failed=len(failed),
        preemptions=preemptions,
        alive=alive,
        concurrent=concurrent,
        late_sends=late_sends,
        ttft_max_ms=max(ttfts) * 1e3 if ttfts else None,
        itl_p99_ms=float(np.percentile(gaps, 99)) * 1e3 if gaps else None,
        wall_s=wall_s,
    )
    reasons: list[str] = []
    if not alive:
        reasons.append("the engine died")
    if failed:
        first = next((o.error for o in failed if o.error), "no error text")
        reasons.append(f"{len(failed)}/{batch.size} requests failed (first: {first[:160]})")
    if preemptions is not None and preemptions > limits.preemption_limit:
        reasons.append(
            f"{preemptions:.0f} preemptions > limit {limits.preemption_limit}: the KV cache cannot hold it"
        )
    if late_sends:
        reasons.append("inconclusive: some requests reached the engine only after others had finished")
    elif not concurrent:
        reasons.append(
            f"the {batch.size} sequences did not run as one batch (some finished before others started): "
            "the KV cache cannot hold them at this context"
        )
    ttft_slo, itl_slo = limits.ttft_slo_ms, limits.itl_slo_ms
    if (
        batch.name == "one-max-prompt"
        and ttft_slo
        and out.ttft_max_ms is not None
        and out.ttft_max_ms > ttft_slo
    ):
        reasons.append(f"TTFT {out.ttft_max_ms:.0f} ms > SLO {limits.ttft_slo_ms:g} ms")
    if (
        batch.name == "decode-at-max-context"
        and itl_slo
        and out.itl_p99_ms is not None
        and out.itl_p99_ms > itl_slo
    ):
        reasons.append(f"ITL P99 {out.itl_p99_ms:.1f} ms > SLO {limits.itl_slo_ms:g} ms")
    out.passed = not reasons
    out.why = "; ".join(reasons) if reasons else _met(out)
    return out


def _met(out: BatchOutcome) -> str:
    parts = [f"{out.sequences} × {out.prompt_tokens}+{out.output_tokens} tokens ok in {out.wall_s:.2f} s"]
    if out.preemptions is not None:
        parts.append(f"{out.preemptions:.0f} preemptions")
    if out.ttft_max_ms is not None:
        parts.append(f"TTFT max {out.ttft_max_ms:.0f} ms")
    if out.itl_p99_ms is not None:
        parts.append(f"ITL P99 {out.itl_p99_ms:.1f} ms")
    return ", ".join(parts)
