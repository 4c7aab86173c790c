"""One interference measurement, live: hold D decodes steady, inject one cold prefill, watch it through.

``EngineClient`` is what the protocol talks to (base URL, model name, metric names, step source, the
client's loop-lag monitor). ``DecodeBatch`` runs D streaming completions on one shared warm prefix and
keeps seed 002's steady rule per stream as chunks arrive. ``measure_baseline`` is seed 002's Phase 1;
``inject`` is Phase 2 for one (P, repetition): it stamps the send and first token of a unique cold
prompt, waits through a recovery window, scrapes /metrics before and after and reads the engine's own
steps. It measures and nothing else: the runner stores what it saw (``microbench.results.layout``) and
``microbench.results.derive`` computes every figure and the validity from what was stored.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import functools
import gc
import itertools
import time
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import pandas as pd

from engine_harness.metric_names import MetricNames
from engine_harness.metrics import Snapshot, scrape
from engine_harness.steps import EngineStep, StepSource
from microbench.client.aio import LagMonitor
from microbench.client.prompts import TokenSpace, cold_prompt
from microbench.client.retry import is_transient, with_retry
from microbench.client.streams import StreamError, StreamRecord, stream_request
from microbench.results.records import Baseline, ProtocolRules
from microbench.results.windows import Gap, SteadyTracker, gaps_of, percentile_ms

__all__ = [
    "DecodeBatch",
    "EngineClient",
    "Injection",
    "NotSteady",
    "ProtocolError",
    "inject",
    "measure_baseline",
    "raw_frame",
    "wait_idle",
    "warm_up",
]


class ProtocolError(RuntimeError):
    """The engine could not be brought into the state a measurement needs (e.g. never steady)."""


class NotSteady(ProtocolError):
    """The decode batch did not reach (or hold) steady state before an injection; nothing was injected."""


# More tokens than this in one read of a decode stream means the client or the engine's API server
# stalled (the tokens were produced on time but delivered together). A baseline with such a read is
# refused (it would set the reference of every point of its batch); in a measurement window the stall
# is what the decode clients saw, so it is kept and its size recorded (``max_tokens_per_read``).
MAX_TOKENS_PER_READ = 4


@dataclass
class EngineClient:
    """Everything the protocol needs to reach one engine."""

    session: aiohttp.ClientSession
    base_url: str
    model: str
    metrics: MetricNames
    steps: StepSource | None = None
    headers: dict[str, str] = field(default_factory=dict)
    lag: LagMonitor | None = None

    @property
    def completions_url(self) -> str:
        return f"{self.base_url}/v1/completions"

    async def scrape(self) -> Snapshot:
        return await scrape(self.session, self.base_url)

    def payload(self, prompt: list[int], max_tokens: int, **extra: Any) -> dict[str, Any]:
        return {
            "model": self.model,
            "prompt": prompt,
            "max_tokens": max_tokens,
            "temperature": 0,
            "stream_options": {"include_usage": True, "continuous_usage_stats": True},
            **extra,
        }

    async def complete(self, prompt: list[int], max_tokens: int = 1) -> StreamRecord:
        return await stream_request(
            self.session, self.completions_url, self.payload(prompt, max_tokens), headers=self.headers
        )


async def wait_idle(client: EngineClient, timeout_s: float) -> None:
    """Until the engine has no running and no waiting requests (as its /metrics say)."""
    deadline = time.monotonic() + timeout_s
    while True:
        snap = await client.scrape()
        running = snap.total(client.metrics.requests_running)
        waiting = snap.total(client.metrics.requests_waiting)
        if running is None or waiting is None:
            raise ProtocolError(f"/metrics of {client.base_url} lacks running/waiting request gauges")
        if running == 0 and waiting == 0:
            return
        if time.monotonic() > deadline:
            raise ProtocolError(
                f"engine not idle after {timeout_s:.0f} s ({running} running, {waiting} waiting)"
            )
        await asyncio.sleep(0.05)


class DecodeBatch:
    """D streaming completions on one shared prefix, stamped live; cancel with ``close()``."""

    def __init__(
        self, client: EngineClient, prefix: list[int], size: int, max_tokens: int, rules: ProtocolRules
    ) -> None:
        self.client = client
        self.prefix = prefix
        self.size = size
        self.max_tokens = max_tokens
        self.records = [StreamRecord() for _ in range(size)]
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
        payload = self.client.payload(
            self.prefix, self.max_tokens, ignore_eos=True, min_tokens=self.max_tokens
        )
        self.tasks = [
            asyncio.create_task(
                stream_request(
                    self.client.session,
                    self.client.completions_url,
                    payload,
                    rec,
                    self.client.headers,
                    self._on_chunk,
                )
            )
            for rec in self.records
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


@dataclass
class Injection:
    """What one injection produced, before it becomes a record."""

    prefill: StreamRecord
    t_inject_ns: int
    t_first_token_ns: int | None
    before: Snapshot
    after: Snapshot | None
    steps: list[EngineStep]
    reasons: list[str]
    client_lag_max_ms: float | None = None


@dataclass
class WarmUp:
    """Engine warm-up and its verification (DESIGN §3: probe latency stable within 10%)."""

    probes_ms: list[float]
    verified: bool


async def _probe(client: EngineClient, space: TokenSpace) -> StreamRecord:
    """One warm-up probe: a fresh 64-token cold prompt, 16 tokens out."""
    payload = client.payload(cold_prompt(64, space), 16, ignore_eos=True, min_tokens=16)
    return await stream_request(client.session, client.completions_url, payload, headers=client.headers)


async def warm_up(client: EngineClient, space: TokenSpace, chunk: int, max_probes: int = 20) -> WarmUp:
    """One full-budget cold prefill, then identical-shape probes until three agree within 10%."""
    # Warm-up requests are not measurements: one an engine turns away for a moment (HTTP 429 with its
    # Retry-After, a 5xx, no connection) is sent again instead of ending the run (client.retry).
    await with_retry(lambda: client.complete(cold_prompt(min(chunk, 4096), space), 1))
    probes: list[float] = []
    for _ in range(max_probes):
        rec = await with_retry(functools.partial(_probe, client, space))
        probes.append(((rec.t_done_ns or time.perf_counter_ns()) - rec.t_send_ns) / 1e6)
        last = probes[-3:]
        if len(last) == 3 and max(last) <= 1.1 * min(last):
            return WarmUp(probes, True)
    return WarmUp(probes, False)


async def inject(
    client: EngineClient,
    batch: DecodeBatch | None,
    prefill_tokens: int,
    space: TokenSpace,
    s: ProtocolRules,
) -> Injection:
    """Phase 2: one cold prompt of exactly ``prefill_tokens`` ids while ``batch`` decodes (or alone)."""
    reasons: list[str] = []
    if batch is not None:
        try:
            await batch.wait_for(
                lambda: batch.steady(s), s.steady_timeout_s, "steady decodes before injection"
            )
        except ProtocolError as exc:
            raise NotSteady(str(exc)) from exc
    prompt = cold_prompt(prefill_tokens, space)
    # Scrape before the local-baseline window, not inside it: rendering /metrics keeps vLLM's API server
    # busy for tens of ms, during which it delivers no tokens (measured: a ~100 ms stall on the CPU
    # engine). The local baseline is then taken from fresh gaps after the scrape.
    gc.collect()  # outside the windows (see aio.no_full_collections); the local baseline starts after it
    mark = await client.steps.mark() if client.steps else 0
    before = await client.scrape()
    t_window = time.perf_counter_ns()  # the local baseline, window and recovery all come after this
    if batch is not None:
        t_scraped = t_window
        try:
            await batch.wait_for(
                lambda: batch.chunks_after(t_scraped) >= s.local_gaps + 1 and batch.steady(s),
                s.steady_timeout_s,
                "a clean local baseline before injection",
            )
        except ProtocolError as exc:
            raise NotSteady(str(exc)) from exc
        _check_occupancy(before, client.metrics, batch.size, reasons)
    t_inject = time.perf_counter_ns()
    try:
        prefill = await asyncio.wait_for(client.complete(prompt, 1), s.injection_timeout_s)
    except StreamError as exc:
        if is_transient(exc):
            raise  # the engine turned it away or went away (429, 5xx, no connection): not a measurement
        prefill = exc.record
        reasons.append(f"the injected request failed: {exc}")
    except TimeoutError:
        prefill = StreamRecord(t_send_ns=t_inject)
        reasons.append(f"the injected request got no answer within {s.injection_timeout_s:.0f} s")
    t_first = prefill.first_token_ns
    if batch is not None and t_first is not None:
        try:
            await batch.wait_for(
                lambda: batch.chunks_after(t_first) >= s.recovery_gaps + 1,
                s.steady_timeout_s,
                "recovery gaps",
            )
        except ProtocolError as exc:
            reasons.append(f"decodes did not span the window: {exc}")
    # After the recovery window, for the same reason as above.
    # /metrics after the window failing means the engine went away (or stalled): an infrastructure fault
    # (MetricsError, raised to the runner), not a verdict on the point.
    after: Snapshot | None = await client.scrape()
    steps: list[EngineStep] = []
    if client.steps is not None:
        steps = await client.steps.since(mark)
    lag = client.lag.max_ms(t_window, time.perf_counter_ns()) if client.lag is not None else None
    return Injection(prefill, t_inject, t_first, before, after, steps, reasons, lag)


def _check_occupancy(before: Snapshot, metrics: MetricNames, decode_batch: int, reasons: list[str]) -> None:
    """Only the batch's D decodes may be running and nothing waiting when the injection goes in."""
    running = before.total(metrics.requests_running)
    waiting = before.total(metrics.requests_waiting)
    if running is not None and running != decode_batch:
        reasons.append(f"{running:.0f} requests were running before the injection, not D = {decode_batch}")
    if waiting:
        reasons.append(f"{waiting:.0f} requests were waiting before the injection")


def raw_frame(batch: DecodeBatch | None, prefill: StreamRecord | None, t_lo: int, t_hi: int) -> pd.DataFrame:
    """The stamps ``derive`` needs: decode streams 0..D−1 from the last read before ``t_lo`` to ``t_hi``
    and the injected request as stream −1; ``seen`` is the stream's token count after each chunk (so the
    discard rule counts from the stream's real start, and the first gap of the slice is not lost)."""
    rows: list[tuple[int, str, int, int, int]] = []
    if prefill is not None:
        seen = itertools.accumulate(prefill.chunk_tokens)
        rows += [
            (-1, "prefill", t, n, c)
            for t, n, c in zip(prefill.chunk_t_ns, prefill.chunk_tokens, seen, strict=True)
        ]
    if batch is not None:
        for i, rec in enumerate(batch.records):
            first = bisect.bisect_left(rec.chunk_t_ns, t_lo)
            if first > 0:
                first = bisect.bisect_left(rec.chunk_t_ns, rec.chunk_t_ns[first - 1])
            seen = itertools.accumulate(rec.chunk_tokens)
            rows += [
                (i, "decode", t, n, c)
                for k, (t, n, c) in enumerate(zip(rec.chunk_t_ns, rec.chunk_tokens, seen, strict=True))
                if k >= first and t <= t_hi
            ]
    df = pd.DataFrame(rows, columns=["stream", "role", "t_ns", "tokens", "seen"])
    return df.astype({"stream": "int16", "t_ns": "int64", "tokens": "int32", "seen": "int32"})
