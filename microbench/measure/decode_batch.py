"""D streaming decodes on warm prompts (one shared prefix, or one each), stamped live, with seed 002's
steady rule per stream (``DecodeBatch``), and Phase 1 of the protocol on it: steady state, then the
baseline gaps (``measure_baseline``).
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import time
from typing import Any

from microbench.client.streams import StreamError, StreamRecord, stream_request
from microbench.measure.engine_client import EngineClient, NotSteady, ProtocolError
from microbench.results.records import Baseline, ProtocolRules
from microbench.results.windows import Gap, SteadyTracker, gaps_of, percentile_ms

__all__ = ["MAX_TOKENS_PER_READ", "DecodeBatch", "measure_baseline"]

# More tokens than this in one read of a decode stream means the client or the engine's API server
# stalled (the tokens were produced on time but delivered together). A baseline with such a read is
# refused (it would set the reference of every point of its batch); in a measurement window the stall
# is what the decode clients saw, so it is kept and its size recorded (``max_tokens_per_read``).
MAX_TOKENS_PER_READ = 4


class DecodeBatch:
    """D streaming completions, one per prompt of ``prompts`` (the same list D times: one shared
    prefix), stamped live; cancel with ``close()``."""

    def __init__(
        self, client: EngineClient, prompts: list[list[int]], max_tokens: int, rules: ProtocolRules
    ) -> None:
        self.client = client
        self.prompts = prompts
        self.size = len(prompts)
        self.max_tokens = max_tokens
        self.records = [StreamRecord() for _ in range(self.size)]
        self.tasks: list[asyncio.Task[StreamRecord]] = []
        self.t_start_ns = 0
        self._progress = asyncio.Event()
        # seed 002's steady rule kept per stream as chunks arrive: O(1) per chunk, not O(tokens) per check
        self._steady = {
            id(r): SteadyTracker(rules.steady_window, rules.steady_ratio, rules.discard_tokens)
            for r in self.records
        }

    def _on_chunk(self, record: StreamRecord) -> None:
        tracker = self._steady.get(id(record))
        if tracker is not None:
            tracker.add(record.chunk_t_ns[-1], record.chunk_tokens[-1])
        self._progress.set()

    async def start(self) -> None:
        self.t_start_ns = time.perf_counter_ns()
        self.tasks = [
            asyncio.create_task(
                stream_request(
                    self.client.session,
                    self.client.completions_url,
                    self.client.payload(prompt, self.max_tokens, ignore_eos=True, min_tokens=self.max_tokens),
                    rec,
                    self.client.headers,
                    self._on_chunk,
                )
            )
            for prompt, rec in zip(self.prompts, self.records, strict=True)
        ]

    def gaps(self, i: int, skip_tokens: int = 0) -> list[Gap]:
        rec = self.records[i]
        return gaps_of(rec.chunk_t_ns, rec.chunk_tokens, skip_tokens)

    def tokens_left(self) -> int:
        return min((self.max_tokens - r.completion_tokens for r in self.records), default=self.max_tokens)

    def failure(self) -> str | None:
        """Why a stream is no longer decoding (finished, broken), or None while all run."""
        for i, task in enumerate(self.tasks):
            if task.done():
                exc = task.exception() if not task.cancelled() else None
                if isinstance(exc, StreamError):
                    return f"decode stream {i} broke: {exc}"
                if exc is not None:
                    return f"decode stream {i} failed: {exc!r}"
                return f"decode stream {i} ended after {self.records[i].completion_tokens} tokens"
        return None

    async def wait_for(self, predicate: Any, timeout_s: float, what: str) -> None:
        """Wake on every new chunk until ``predicate()``; raise ``ProtocolError`` on timeout or failure."""
        deadline = time.monotonic() + timeout_s
        while not predicate():
            if (why := self.failure()) is not None:
                raise ProtocolError(f"{why} while waiting for {what}")
            self._progress.clear()
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise ProtocolError(f"timed out after {timeout_s:.0f} s waiting for {what}")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._progress.wait(), min(remaining, 1.0))

    def steady(self, s: ProtocolRules) -> bool:
        return all(
            r.completion_tokens >= s.steady_min_tokens and self._steady[id(r)].steady() for r in self.records
        )

    async def wait_steady(self, s: ProtocolRules) -> float:
        """Seed 002's steady-state rule on every stream; returns ms from the batch's start."""
        await self.wait_for(lambda: self.steady(s), s.steady_timeout_s, "steady decodes")
        return (time.perf_counter_ns() - self.t_start_ns) / 1e6

    def chunks_after(self, t_ns: int) -> int:
        """The fewest chunks any stream received after ``t_ns`` (stamps are in order: a bisection)."""
        return min(len(r.chunk_t_ns) - bisect.bisect_right(r.chunk_t_ns, t_ns) for r in self.records)

    async def close(self) -> None:
        for t in self.tasks:
            t.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)


async def measure_baseline(batch: DecodeBatch, s: ProtocolRules) -> tuple[Baseline, float, int]:
    """Phase 1: wait for steady state, then collect ``baseline_gaps`` more gaps on every stream."""
    steady_ms = await batch.wait_steady(s)
    t0 = time.perf_counter_ns()
    await batch.wait_for(
        lambda: batch.chunks_after(t0) >= s.baseline_gaps + 1, s.steady_timeout_s, "baseline gaps"
    )
    gaps = [g for i in range(batch.size) for g in batch.gaps(i) if g.start_ns >= t0]
    if (burst := max((g.tokens for g in gaps), default=0)) > MAX_TOKENS_PER_READ:
        raise NotSteady(f"delivery stalled during the baseline: {burst} tokens arrived in one read")
    baseline = Baseline(
        tpot_p50_ms=percentile_ms(gaps, 50),
        tpot_p90_ms=percentile_ms(gaps, 90),
        tpot_p99_ms=percentile_ms(gaps, 99),
        n_gaps=len(gaps),
    )
    return baseline, steady_ms, t0
