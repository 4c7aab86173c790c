"""One measurement: a cold P-token request, disaggregated through the proxy or colocated on one engine.

Both engines' ``/metrics`` are scraped right before and after the request; the deltas give each
engine's own account (queue, prefill, KV transfer time and bytes, prompt tokens by source). The
client stamps its send and the first token (``perf_counter_ns``); the proxy, in the same process and
clock, stamps the producer and consumer legs. Validity: the prompt was cold on the engine that
computed it, and — for a connector that moves KV — the consumer took its prompt from the connector
(``prompt_tokens_by_source{external_kv_transfer}`` or ``cached_tokens`` > 0) instead of recomputing it.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from dataclasses import dataclass
from typing import Any

import aiohttp
import pandas as pd

from engine_harness.kv_connectors import ConnectorPreset
from engine_harness.metrics import MetricsError, Snapshot, scrape
from engine_harness.watchdog import EngineWatch, Hung, watch_request
from microbench.client.prompts import TokenSpace, cold_prompt
from microbench.client.requests import completion_body
from microbench.client.streams import StreamError, StreamRecord, stream_request
from microbench.measure.pd_proxy import PDProxy, PhaseStamps
from microbench.results.transfer import EngineSide, Mode, Phases, TransferRecord

__all__ = ["Measured", "PointContext", "engine_side", "measure_point", "phases_from"]

SOURCE = "vllm:prompt_tokens_by_source_total"


@dataclass
class PointContext:
    """What every measurement needs: the session, the engines' URLs, the proxy and the settings."""

    session: aiohttp.ClientSession
    producer_url: str
    consumer_url: str | None
    proxy: PDProxy | None
    model_name: str
    space: TokenSpace
    connector: ConnectorPreset
    decode_tokens: int
    run_id: str
    phase_timeout_s: float
    stall_s: float
    producer_pgid: int | None = None
    consumer_pgid: int | None = None

    @property
    def client_timeout_s(self) -> float:
        """Longer than both proxy phases together, so a phase's own timeout fires first and is blamed."""
        return 2 * self.phase_timeout_s + 30

    def watch(self, role: str) -> EngineWatch:
        if role == "consumer" and self.consumer_url is not None:
            return EngineWatch("consumer", self.consumer_url, self.consumer_pgid)
        return EngineWatch("producer", self.producer_url, self.producer_pgid)


@dataclass
class Measured:
    record: TransferRecord
    raw: pd.DataFrame
    scrapes: dict[str, Snapshot | None]


def _ms(a: int | None, b: int | None) -> float | None:
    return None if a is None or b is None else (b - a) / 1e6


def _hist_ms(after: Snapshot, before: Snapshot, name: str | None) -> float | None:
    if name is None:
        return None
    d = after.delta(before, [f"{name}_sum"])
    return None if d is None else d * 1e3


def engine_side(
    before: Snapshot | None, after: Snapshot | None, preset: ConnectorPreset
) -> EngineSide | None:
    """An engine's account of what happened between two scrapes (None if either scrape is missing)."""
    if before is None or after is None:
        return None
    xfer = preset.transfer_time_metric
    return EngineSide(
        queue_ms=_hist_ms(after, before, "vllm:request_queue_time_seconds"),
        prefill_ms=_hist_ms(after, before, "vllm:request_prefill_time_seconds"),
        ttft_ms=_hist_ms(after, before, "vllm:time_to_first_token_seconds"),
        prompt_tokens=after.delta(before, ["vllm:prompt_tokens_total"]),
        tokens_local_compute=after.delta(before, [SOURCE], source="local_compute"),
        tokens_local_cache_hit=after.delta(before, [SOURCE], source="local_cache_hit"),
        tokens_external=after.delta(before, [SOURCE], source="external_kv_transfer"),
        kv_xfer_ms=_hist_ms(after, before, xfer),
        kv_xfer_count=after.delta(before, [f"{xfer}_count"]) if xfer else None,
        kv_post_ms=_hist_ms(after, before, preset.transfer_post_metric),
        kv_bytes=(
            after.delta(before, [f"{preset.transfer_bytes_metric}_sum"])
            if preset.transfer_bytes_metric
            else None
        ),
    )


def phases_from(t_send: int, t_first: int | None, stamps: PhaseStamps | None) -> Phases:
    """Phase durations from the client's send/first-token and the proxy's stamps (colocated: none)."""
    total = _ms(t_send, t_first)
    if stamps is None:
        return Phases(
            total_ttft_ms=total,
            producer_ms=None,
            proxy_gap_ms=None,
            consumer_ttft_ms=None,
            handoff_ms=None,
            client_overhead_ms=None,
        )
    producer = _ms(stamps.t_producer_send_ns, stamps.t_producer_done_ns)
    handoff = _ms(stamps.t_producer_done_ns, stamps.t_consumer_first_token_ns)
    overhead = None if None in (total, producer, handoff) else total - producer - handoff  # type: ignore[operator]
    return Phases(
        total_ttft_ms=total,
        producer_ms=producer,
        proxy_gap_ms=_ms(stamps.t_producer_done_ns, stamps.t_consumer_send_ns),
        consumer_ttft_ms=_ms(stamps.t_consumer_send_ns, stamps.t_consumer_first_token_ns),
        handoff_ms=handoff,
        client_overhead_ms=overhead,
    )


async def _scrape(session: aiohttp.ClientSession, url: str) -> Snapshot | None:
    try:
        return await scrape(session, url, timeout_s=10)
    except MetricsError:
        return None


def _xfer_seen(metric: str, before: Snapshot | None, after: Snapshot | None) -> bool:
    return before is not None and after is not None and (after.delta(before, [f"{metric}_count"]) or 0) > 0


async def _settle(
    ctx: PointContext, p_before: Snapshot | None, c_before: Snapshot | None, skip: str | None
) -> tuple[Snapshot | None, Snapshot | None]:
    """Both engines' after-scrapes of a hand-off. The connector's transfer stats arrive a step late, on
    the engine that ran the transfer (pull: the consumer; push: the producer), so wait ≤ 3 s for
    either to count it; a hung engine (``skip``) is not asked."""

    async def both() -> tuple[Snapshot | None, Snapshot | None]:
        return await asyncio.gather(
            _scrape(ctx.session, ctx.producer_url) if skip != "producer" else asyncio.sleep(0, None),
            _scrape(ctx.session, ctx.consumer_url)
            if skip != "consumer" and ctx.consumer_url
            else asyncio.sleep(0, None),
        )

    p_after, c_after = await both()
    metric = ctx.connector.transfer_time_metric
    deadline = time.perf_counter_ns() + 3_000_000_000
    while metric and skip is None and time.perf_counter_ns() < deadline:
        if _xfer_seen(metric, p_before, p_after) or _xfer_seen(metric, c_before, c_after):
            break
        await asyncio.sleep(0.2)
        p_after, c_after = await both()
    return p_after, c_after


def _raw(stamps: dict[str, int | None], rec: StreamRecord) -> pd.DataFrame:
    rows = [{"event": k, "t_ns": v, "tokens": 0} for k, v in stamps.items() if v is not None]
    rows += [
        {"event": "client_chunk", "t_ns": t, "tokens": n}
        for t, n in zip(rec.chunk_t_ns, rec.chunk_tokens, strict=True)
    ]
    return pd.DataFrame(rows, columns=["event", "t_ns", "tokens"])


def _active_role(ctx: PointContext, disagg: bool, rid: str) -> str:
    """The engine whose phase is running: the producer until it answered, then the consumer."""
    if not disagg or ctx.proxy is None:
        return "producer"
    stamps = ctx.proxy.stamps.get(rid)
    return "producer" if stamps is None or stamps.t_producer_done_ns is None else "consumer"


async def _send(
    ctx: PointContext, url: str, payload: dict[str, Any], rec: StreamRecord, rid: str, disagg: bool
) -> Hung | None:
    """The request, watched: ``None`` when it ended by itself (``StreamError``/``TimeoutError`` raised
    as they come), a ``Hung`` when the active engine stalled and the request was cancelled."""
    request = asyncio.ensure_future(
        asyncio.wait_for(
            stream_request(ctx.session, url, payload, rec, headers={"X-Request-Id": rid}),
            timeout=ctx.client_timeout_s,
        )
    )
    watchdog = asyncio.ensure_future(
        watch_request(
            ctx.session,
            lambda: ctx.watch(_active_role(ctx, disagg, rid)),
            lambda: len(rec.chunk_t_ns),
            ctx.stall_s,
        )
    )
    try:
        await asyncio.wait({request, watchdog}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in (request, watchdog):
            task.cancel()
        await asyncio.gather(request, watchdog, return_exceptions=True)
    if not request.cancelled() and request.done() and request.exception() is None:
        return None
    if watchdog.done() and not watchdog.cancelled() and watchdog.exception() is None:
        return watchdog.result()
    exc = request.exception() if request.done() and not request.cancelled() else None
    if exc is not None:
        raise exc
    return None


async def measure_point(ctx: PointContext, mode: Mode, prefill_tokens: int, repetition: int) -> Measured:
    """Send one cold request of ``prefill_tokens`` and account for it; failures are recorded, not raised."""
    prompt = cold_prompt(prefill_tokens, ctx.space)
    disagg = mode == "disaggregated"
    p_before, c_before = await asyncio.gather(
        _scrape(ctx.session, ctx.producer_url),
        _scrape(ctx.session, ctx.consumer_url) if disagg and ctx.consumer_url else asyncio.sleep(0, None),
    )
    rid = uuid.uuid4().hex
    url = f"{ctx.proxy.base_url if disagg and ctx.proxy else ctx.producer_url}/v1/completions"
    rec = StreamRecord()
    reasons: list[str] = []
    failed: str | None = None
    hung: Hung | None = None
    body = completion_body(ctx.model_name, prompt, ctx.decode_tokens, temperature=0.0)
    try:
        hung = await _send(ctx, url, body, rec, rid, disagg)
    except (StreamError, TimeoutError) as exc:
        failed = "client"
        reasons.append(f"request failed: {rec.error or type(exc).__name__}")
    if hung is not None:
        failed = hung.role
        reasons.append(f"hung: {hung.reason()}")
    pstamps = ctx.proxy.stamps.pop(rid, None) if disagg and ctx.proxy else None
    if hung is None and pstamps is not None and pstamps.failed_phase is not None:
        failed = pstamps.failed_phase
        reasons.append(f"{pstamps.failed_phase} failed: {pstamps.error}")
    skip = hung.role if hung is not None else None  # a hung engine's /metrics would only time out
    if disagg:
        p_after, c_after = await _settle(ctx, p_before, c_before, skip)
    else:
        p_after, c_after = (await _scrape(ctx.session, ctx.producer_url) if skip is None else None), None
    producer = engine_side(p_before, p_after, ctx.connector)
    consumer = engine_side(c_before, c_after, ctx.connector) if disagg else None
    cached_consumer = rec.cached_prompt_tokens if disagg else None
    cached_producer = rec.cached_prompt_tokens if not disagg else None
    if pstamps is not None and pstamps.producer_usage:
        details = pstamps.producer_usage.get("prompt_tokens_details") or {}
        cached_producer = details.get("cached_tokens")
    if failed is None:
        reasons += _validity(ctx, disagg, rec, pstamps, producer, consumer, cached_producer, cached_consumer)
    stamps: dict[str, int | None] = {
        "t_client_send_ns": rec.t_send_ns,
        "t_client_first_token_ns": rec.first_token_ns,
    }
    if pstamps is not None:
        stamps |= {k: v for k, v in pstamps.as_dict().items() if k.startswith("t_")}
    raw_file = f"raw/{mode}/P{prefill_tokens}_r{repetition}.parquet"
    record = TransferRecord(
        run_id=ctx.run_id,
        mode=mode,
        prefill_tokens=prefill_tokens,
        repetition=repetition,
        connector=ctx.connector.name,
        decode_tokens=ctx.decode_tokens,
        valid=not reasons,
        reasons=reasons,
        failed_phase=failed,
        hung=hung is not None,
        phases=phases_from(rec.t_send_ns, rec.first_token_ns, pstamps),
        producer=producer,
        consumer=consumer,
        cached_tokens_consumer=cached_consumer,
        cached_tokens_producer=cached_producer,
        completion_tokens=rec.completion_tokens,
        stamps=stamps,
        raw_file=raw_file,
    )
    scrapes = {"producer_before": p_before, "producer_after": p_after}
    if disagg:
        scrapes |= {"consumer_before": c_before, "consumer_after": c_after}
    return Measured(record, _raw(stamps, rec), scrapes)


def _validity(
    ctx: PointContext,
    disagg: bool,
    rec: StreamRecord,
    stamps: PhaseStamps | None,
    producer: EngineSide | None,
    consumer: EngineSide | None,
    cached_producer: int | None,
    cached_consumer: int | None,
) -> list[str]:
    reasons = []
    if rec.first_token_ns is None or rec.completion_tokens < 1:
        reasons.append("no token arrived")
    if cached_producer:
        reasons.append(f"the prompt hit the prefix cache where it was computed ({cached_producer} tokens)")
    if disagg:
        assert stamps is not None
        # t_consumer_done_ns may land after the client saw [DONE]: not a TTFT phase, not required
        missing = [
            k
            for k, v in stamps.as_dict().items()
            if k.startswith("t_") and v is None and k != "t_consumer_done_ns"
        ]
        if missing:
            reasons.append(f"proxy phases not stamped: {', '.join(missing)}")
        external = consumer.tokens_external if consumer is not None else None
        if ctx.connector.expects_kv_transfer and not (external or cached_consumer):
            reasons.append(
                "the consumer recomputed the prompt: no external_kv_transfer tokens and no cached tokens "
                f"(external={external}, cached={cached_consumer})"
            )
    return reasons
