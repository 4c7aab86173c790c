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

A point can hold too few steps to judge (a bare prefill of one or two chunks: no peers), and one large
prefill step's bound is generous. The reference then comes from outside the point: the cell's other
repetitions (same chunk, D, P and engine), judged by ``judged``. A point whose prefill (send → first
token, ``prefill_duration_ms``: every engine's, with or without a step log) took more than
``CELL_FACTOR`` times the median of the other repetitions (one or more), and ``MIN_EXCESS_MS`` beyond it,
is invalid with a reason naming that reference (``IN_CELL``). Repetitions do the same work, so they agree
far closer than a step and its peers (CPU noise: ±30 %); ``CELL_FACTOR`` is the 3× beyond which
``analysis.table`` already leaves a repetition out of its cell. The sweep measures such a point again
within ``max_attempts`` (``RunFolder.judge_cell``, on every pass and on ``--resume``) and
``analysis.rederive`` applies the same function. Freezing only lengthens a prefill, so a frozen
repetition drags the median of the others of a cell up, never down: one slow reference hides a freeze at
worst, it never flags a sound point. So one other repetition is reference enough: of two repetitions the
frozen one is the slower, judged against the sound one, and the sound one is never 3x and a second slower
than the frozen one. (Asking for two others left the two-repetition grids unjudged: a two-chunk prefill
with decodes beside it, frozen for 3 s in its mixed step, has two prefill steps, too few peers, and its
decode steps scale to a bound of ten seconds for a 514-token step; CI of 2026-11-28 stored one such point
as valid.)

Not the engine's CPU counters: the sim engine and a GPU engine waiting on its device accrue little CPU
time while they work, so little CPU time over a window does not say "frozen"; and an external engine's
processes are not the suite's to read.

Pure: steps (or a cell's records) in, reasons out.
"""

from __future__ import annotations

import itertools
import statistics
from collections.abc import Sequence

from engine_harness.steps import EngineStep
from microbench.results.records import RunRecord

__all__ = [
    "CELL_FACTOR",
    "FACTOR",
    "IN_CELL",
    "MIN_EXCESS_MS",
    "implausible_steps",
    "judged",
    "stalled_between_steps",
    "stalled_in_cell",
]

FACTOR = 10.0
MIN_EXCESS_MS = 1000.0
_MIN_PEERS = 3
CELL_FACTOR = 3.0
_MIN_OTHER_REPS = 1
IN_CELL = "implausible against its cell: "  # how a reason of ``judged`` starts


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


def stalled_in_cell(
    took_ms: float | None,
    others_ms: Sequence[float],
    factor: float = CELL_FACTOR,
    min_excess_ms: float = MIN_EXCESS_MS,
) -> str | None:
    """The reason a point's prefill of ``took_ms`` is implausible against the same cell's other
    repetitions (``others_ms``, one or more); None when it is plausible or there is nothing to judge by."""
    if took_ms is None or len(others_ms) < _MIN_OTHER_REPS:
        return None
    expected = statistics.median(others_ms)
    if took_ms > factor * expected and took_ms - expected > min_excess_ms:
        return (
            f"{IN_CELL}its prefill took {took_ms:.0f} ms where the median of the cell's other "
            f"{len(others_ms)} repetitions is {expected:.0f} ms: the engine stalled (frozen, paused or "
            "swapped out), not interference"
        )
    return None


def _derived_valid(record: RunRecord) -> bool:
    """Valid by its own attempt's derivation (``derive``), whatever its cell said of it."""
    return all(r.startswith(IN_CELL) for r in record.validity.reasons)


def judged(record: RunRecord, cell: Sequence[RunRecord]) -> RunRecord:
    """``record`` (one attempt of a cell) judged against ``cell``, the cell's point records (one per
    repetition, as stored under runs/): invalid with ``stalled_in_cell``'s reason when its prefill was
    implausible against the other repetitions valid by their own derivation; as it is otherwise."""
    if not _derived_valid(record):
        return record
    rep = record.config.repetition
    others = [
        r.interference.prefill_duration_ms
        for r in cell
        if r.config.repetition != rep and _derived_valid(r) and r.interference.prefill_duration_ms is not None
    ]
    reason = stalled_in_cell(record.interference.prefill_duration_ms, others)
    reasons = [reason] if reason else []
    validity = record.validity.model_copy(update={"valid": reason is None, "reasons": reasons})
    return record.model_copy(update={"validity": validity})
