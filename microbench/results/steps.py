"""The injection's prefill steps as the engine recorded them: full chunks, a partial last chunk, the
decode-only step they are compared with, and the step count the client-side identity may divide by.

Pure functions over ``EngineStep`` lists; ``microbench.results.derive`` calls them.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from engine_harness.step_model import Scheduling, extra_wait_ms
from engine_harness.steps import EngineStep

__all__ = [
    "ChunkCount", "PrefillSteps", "attempt_decode_steps", "count_chunks", "prefill_steps", "window_steps",
]  # fmt: skip


def window_steps(steps: Sequence[EngineStep]) -> list[EngineStep]:
    """Steps from the first to the last prefill-carrying one (the injection is the only prefill)."""
    idx = [i for i, st in enumerate(steps) if st.prefill_tokens > 0]
    return list(steps[idx[0] : idx[-1] + 1]) if idx else []


@dataclass(frozen=True)
class PrefillSteps:
    """The engine's own account of the injection's prefill."""

    full: list[EngineStep]  # steps that spent the whole token budget (chunk); a prompt that fits one step:
    # that step (nothing dilutes it)
    last_partial: EngineStep | None  # the last step of a multi-step prefill when it carried less
    decode_step_ms: float | None  # median decode-only step of the batch right before the prefill (local)
    prefill: list[EngineStep]  # every prefill-carrying step, in order
    # exclusive: the prefill steps ran instead of the decode steps (SGLang without --enable-mixed-chunk), so
    # a decode token waits the whole step, not the step less the decode step it would have taken anyway
    scheduling: Scheduling | None = "mixed"

    @property
    def prefill_ms(self) -> float | None:
        """Σ prefill steps; None when the engine did not report one of them (SGLang: a step after idle)."""
        times = [s.elapsed_ms for s in self.prefill]
        return sum(t for t in times if t is not None) if None not in times else None

    @property
    def full_ms(self) -> float | None:
        times = [s.elapsed_ms for s in self.full if s.elapsed_ms is not None]
        return statistics.median(times) if times else None

    def _extra(self, step_ms: float | None) -> float | None:
        """A decode token's extra wait on a prefill step of ``step_ms``."""
        if step_ms is None or self.decode_step_ms is None:
            return None
        return extra_wait_ms(step_ms, self.decode_step_ms, self.scheduling)

    def penalty_full_ms(self) -> float | None:
        """Median full-chunk step − decode-only step (exclusive: the whole step): the extra wait of a
        decode token on such a step."""
        return self._extra(self.full_ms)

    def penalty_last_ms(self) -> float | None:
        return self._extra(self.last_partial.elapsed_ms) if self.last_partial is not None else None

    def total_penalty_ms(self) -> float | None:
        """Σ over every prefill step of the extra wait: the delay one decode stream took."""
        extras = [self._extra(s.elapsed_ms) for s in self.prefill]
        if not extras or None in extras:
            return None
        return sum(e for e in extras if e is not None)


def prefill_steps(
    steps: Sequence[EngineStep], chunk: int, d: int, scheduling: Scheduling | None = "mixed"
) -> PrefillSteps:
    """Classify the logged steps of one injection (``steps``: every step of the attempt, in order) run in
    ``scheduling`` (see ``PrefillSteps``)."""
    window = window_steps(steps)
    prefill = [s for s in window if s.prefill_tokens > 0]
    full = [s for s in prefill if s.prefill_tokens + s.decode_tokens >= chunk]
    last = None
    if full and prefill[-1].prefill_tokens + prefill[-1].decode_tokens < chunk:
        last = prefill[-1]
    if not full:
        full = prefill
    # the engine's local baseline: decode-only steps right before the first prefill step, the same stretch
    # as the client's local baseline (steps after the window may already run at another context or load)
    first = next((i for i, s in enumerate(steps) if s.prefill_tokens > 0), len(steps))
    decode = _decode_only_ms(steps[:first], d)
    return PrefillSteps(
        full=full,
        last_partial=last,
        decode_step_ms=statistics.median(decode) if decode else None,
        prefill=prefill,
        scheduling=scheduling,
    )


def attempt_decode_steps(steps: Sequence[EngineStep], d: int) -> tuple[float | None, int]:
    """The median of every decode-only step of the attempt at the batch's ``d`` decodes (before, between
    and after the prefill steps) and how many there were; ``(None, 0)`` without any (``d`` 0, no log, an
    engine that left them untimed).

    The step-model fit's decode-only row. The decode-only step is most of a serving trace's steps (410 of
    453 in the calibration Poisson trace), so its error adds up over a busy period: the step grid, which
    says which step a request joins, drifts by the steps times the error. Over the 36 attempts with
    decodes of three sim fit sweeps (2026-11-29), the local baseline before the prefill
    (``PrefillSteps.decode_step_ms``, 10-19 steps) was more than 0.1 ms off the sim's true step in 8 (up
    to 2.1 ms), the median of the attempt's 27-36 decode steps in 3 (0.2, 0.3, 1.5 ms: stretches the box
    ran late as a whole) and within 0.02 ms in the other 33."""
    times = _decode_only_ms(steps, d)
    return (statistics.median(times) if times else None), len(times)


def _decode_only_ms(steps: Sequence[EngineStep], d: int) -> list[float]:
    """The durations of the timed decode-only steps of ``d`` decodes in ``steps`` (none when ``d`` is 0)."""
    return [
        s.elapsed_ms
        for s in steps
        if d > 0 and s.prefill_tokens == 0 and s.decode_tokens == d and s.elapsed_ms is not None
    ]


@dataclass(frozen=True)
class ChunkCount:
    """Prefill-carrying steps as measured, and the count the identity divides by (with why, if not it)."""

    actual: int | None
    source: Literal["engine_log", "histogram", "none"]
    used: int
    note: str | None


def count_chunks(logged: int | None, histogram: int | None, expected: int) -> ChunkCount:
    """The engine's step log is exact. vLLM's tokens-per-step histogram folds a last chunk of ≤ 8 tokens
    into the decode-only bucket (one short), so a histogram count that disagrees with the schedule is not
    divided by: the schedule's count is, and the note says so."""
    if logged:
        return ChunkCount(logged, "engine_log", logged, None)
    if histogram is not None:
        if histogram == expected:
            return ChunkCount(histogram, "histogram", histogram, None)
        note = f"the tokens-per-step histogram counted {histogram} prefill steps, the schedule {expected}"
        note += f": used {expected}"
        return ChunkCount(histogram, "histogram", expected, note)
    return ChunkCount(
        None, "none", expected, f"no step count from the engine: used the schedule's {expected}"
    )
