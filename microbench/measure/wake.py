"""The wake probe: how much slower an engine serves a request after it has idled, by how long it idled.

A sweep with ``wake_probe`` set runs it once per chunk size, after the grid, on the same engine
(``microbench.measure.shard``): one cold request of ``prompt_tokens`` tokens and ``max_tokens`` 1 after
each gap of ``gaps_s`` in turn, ``repetitions`` rounds. Each request is sent alone, its gap counted from
the previous request's last byte, so the engine has done nothing for the gap (no ``/metrics`` scrape
either: the probe waits on its own clock). A first request, not stored, starts the clock (the grid's end
leaves an unknown idle spell). A request the engine refuses or breaks off raises, as a point's would: the
shard rides the fault out and probes again from the start. The extra time to first token over the
shortest gap's is the wake cost (``engine_harness.wake_model``; fitted by ``analysis.calibrate.wake``).
About Σ gaps × repetitions plus one request's time per sample: 33 s for the calibration sweeps' 0.02–3 s
gaps on the CPU engine.
"""

from __future__ import annotations

import asyncio
import time

from microbench.client.prompts import TokenSpace, cold_prompt
from microbench.client.streams import StreamRecord
from microbench.measure.engine_client import EngineClient
from microbench.results.wake import WakeProbeConfig, WakeProbeRecord, WakeSample

__all__ = ["probe_wake"]


def _sample(gap_s: float, idle_s: float, record: StreamRecord) -> WakeSample:
    """A completed request as a sample (a refused or broken one raised: the shard's fault handling)."""
    error = None if record.chunk_t_ns else "the stream ended without a token"
    ttft = (record.chunk_t_ns[0] - record.t_send_ns) / 1e6 if error is None else None
    return WakeSample(
        gap_s=gap_s,
        idle_s=round(idle_s, 6),
        ttft_ms=None if ttft is None else round(ttft, 4),
        cached_prompt_tokens=record.cached_prompt_tokens,
        error=error,
    )


async def probe_wake(
    client: EngineClient, space: TokenSpace, config: WakeProbeConfig, chunk: int
) -> WakeProbeRecord:
    """Every gap of ``config``, ``config.repetitions`` times in turn: one stored sample per request."""

    async def send() -> StreamRecord:
        return await client.complete(cold_prompt(config.prompt_tokens, space), max_tokens=1)

    last = await send()
    last_end = last.t_done_ns or time.perf_counter_ns()
    samples = []
    for _ in range(config.repetitions):
        for gap in config.gaps_s:
            while (left_ns := last_end + int(gap * 1e9) - time.perf_counter_ns()) > 0:  # noqa: ASYNC110
                await asyncio.sleep(left_ns / 1e9)  # uvloop's timer may fire early (it reads a cached now)
            record = await send()
            samples.append(_sample(gap, (record.t_send_ns - last_end) / 1e9, record))
            last_end = record.t_done_ns or time.perf_counter_ns()
    return WakeProbeRecord(chunk_size=chunk, config=config, samples=samples)
