"""One interference measurement, live: inject one cold prefill into steady decodes, watch it through.

``inject`` is seed 002's Phase 2 for one (P, repetition), on a ``decode_batch.DecodeBatch`` whose Phase 1
(``measure_baseline``) is done, or alone (D = 0): it stamps the send and first token of a unique cold
prompt, waits through a recovery window, scrapes /metrics before and after and reads the engine's own
steps. ``warm_up`` readies an engine first; ``raw_frame`` is the stamps a point stores. It measures and
nothing else: the shard stores what it saw through its sink (``measure.sink``) and
``microbench.results.derive`` computes every figure and the validity from what was stored.
"""

from __future__ import annotations

import asyncio
import bisect
import functools
import gc
import itertools
import time
from dataclasses import dataclass

import pandas as pd

from engine_harness.metric_names import MetricNames
from engine_harness.metrics import Snapshot
from engine_harness.steps import EngineStep
from microbench.client.prompts import TokenSpace, cold_prompt
from microbench.client.retry import is_transient, with_retry
from microbench.client.streams import StreamError, StreamRecord, stream_request
from microbench.measure.decode_batch import DecodeBatch
from microbench.measure.engine_client import EngineClient, NotSteady, ProtocolError
from microbench.results.records import ProtocolRules

__all__ = ["Injection", "WarmUp", "inject", "raw_frame", "warm_up"]


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
