"""Plausibility of a point's own engine steps: a step the engine could not have taken for its work.

An engine frozen in the middle of a point (``SIGSTOP`` then ``SIGCONT``, a swapped-out process, a VM
pause) reports one step tens of seconds long. That step is not interference: a point holding it is
invalid with its reason (``derive``), so no fit of the step model sees it. A step is judged against the
point's other steps, scaled by the tokens it computed:

- against the decode-only steps (three or more): their median time, times the step's tokens over their
  median tokens (a prefill step computes more tokens; per token it is cheaper than a decode step, so
  this bound is generous);
- against the point's prefill-carrying steps (three or more): their median time per token, times the
  step's tokens.

It is implausible when it took more than ``FACTOR`` times the tightest of those expectations and more
than ``MIN_EXCESS_MS`` beyond it (a scheduling hiccup of a loaded machine is neither).

An engine can also freeze *between* steps: where the engine times its own steps (vLLM's iteration
field, synchronous scheduling) every step looks normal, but the stamps of two consecutive step lines lie
further apart than the later step took. While requests are running the engine is never idle, so such a
gap beyond the same bounds (against the median step) is a stall too (``stalled_between_steps``).
Pure: steps in, reasons out.
"""

from __future__ import annotations

import itertools
import statistics
from collections.abc import Sequence

from engine_harness.steps import EngineStep

__all__ = ["FACTOR", "MIN_EXCESS_MS", "implausible_steps", "stalled_between_steps"]

FACTOR = 10.0
MIN_EXCESS_MS = 1000.0
_MIN_PEERS = 3


def _tokens(step: EngineStep) -> int:
    return step.prefill_tokens + step.decode_tokens


def _expected_ms(
    step: EngineStep, decode: Sequence[EngineStep], prefill: Sequence[EngineStep]
) -> float | None:
    """The tightest expectation of ``step``'s time from its peers; None without enough peers."""
    bounds = []
    if len(decode) >= _MIN_PEERS:
        per_step = statistics.median(s.elapsed_ms or 0.0 for s in decode)
        tokens = statistics.median(_tokens(s) for s in decode) or 1
        bounds.append(per_step * max(1.0, _tokens(step) / tokens))
    if len(prefill) >= _MIN_PEERS and step.prefill_tokens > 0:
        per_token = statistics.median((s.elapsed_ms or 0.0) / max(_tokens(s), 1) for s in prefill)
        bounds.append(per_token * _tokens(step))
    return min(bounds) if bounds else None


def implausible_steps(
    steps: Sequence[EngineStep], factor: float = FACTOR, min_excess_ms: float = MIN_EXCESS_MS
) -> list[str]:
    """One reason per step of ``steps`` (every step of one attempt) its peers say it could not take."""
    timed = [s for s in steps if s.elapsed_ms is not None and _tokens(s) > 0]
    decode = [s for s in timed if s.prefill_tokens == 0]
    prefill = [s for s in timed if s.prefill_tokens > 0]
    reasons = []
    for i, step in enumerate(timed):
        expected = _expected_ms(step, decode, prefill)
        took = step.elapsed_ms or 0.0
        if expected is not None and took > factor * expected and took - expected > min_excess_ms:
            reasons.append(
                f"engine step {i} took {took:.0f} ms for {_tokens(step)} tokens where its point's other "
                f"steps say about {expected:.0f} ms: the engine stalled (frozen, paused or swapped out), "
                "not interference"
            )
    return reasons


def stalled_between_steps(
    steps: Sequence[EngineStep], factor: float = FACTOR, min_excess_ms: float = MIN_EXCESS_MS
) -> list[str]:
    """One reason per gap between two consecutive stamped steps of ``steps``, both running requests, in
    which no step ran for longer than ``factor`` times the median step and ``min_excess_ms`` beyond it."""
    timed = [s for s in steps if s.elapsed_ms is not None and s.t_end_s is not None]
    if len(timed) < _MIN_PEERS:
        return []
    typical = statistics.median(s.elapsed_ms or 0.0 for s in timed)
    reasons = []
    for i, (prev, step) in enumerate(itertools.pairwise(timed), start=1):
        busy = _tokens(prev) > 0 and step.decode_requests + step.prefill_requests > 0
        idle_ms = ((step.t_end_s or 0.0) - (prev.t_end_s or 0.0)) * 1000 - (step.elapsed_ms or 0.0)
        if busy and idle_ms > factor * typical and idle_ms - typical > min_excess_ms:
            reasons.append(
                f"no engine step ran for {idle_ms:.0f} ms before step {i} while requests were running "
                f"(its steps take about {typical:.0f} ms): the engine stalled (frozen, paused or swapped "
                "out), not interference"
            )
    return reasons
