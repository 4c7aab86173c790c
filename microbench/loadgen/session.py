"""The load-generation session: start → run stages → drain each → result, with per-request records.

``LoadSession`` owns one aiohttp session (no connection cap, so an open loop is never throttled by a
pool) and runs ``Stage`` after ``Stage``: a warm-up, then the measured stages of a rate or concurrency
sweep. A stage pairs a plan, ``(target offset ns, RequestSpec)`` pairs from a scheduler or a self-timed
workload, with its limits (a request count, a duration, or both). A plan's requests may be drafts: the
session builds (``RequestSpec.built``) those it sends, before waiting for their time; as worker k of N it
takes its share with ``share_of`` (the others' items skipped, where the plan can, without being made).

Open loop: the dispatcher sleeps until each target (the last ``spin_us`` by yielding to the event loop,
for sub-millisecond precision) and starts the request as a task; nothing it waits on depends on a
response, so a slow server never delays the next issue. Closed loop (``in_flight_limit``): a queue holds
one token per slot; a completion puts its token back, which releases the next issue (no polling); the
intended time of that issue is the moment the slot came free.

Each request records its intended send time, the actual one (``StreamRecord.t_send_ns``), every chunk,
usage, status and error; errors (HTTP 429/500, cut streams, server errors) become records, never
exceptions. Streams are read on the client's hot path (a stamp and the bytes per read) and parsed after
the stages, or when a multi-turn conversation or an event hook needs the answer. ``stop()`` ends
issuing; in-flight requests then drain for up to ``drain_timeout_s`` and the rest are cancelled and
recorded as such.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import time
from collections.abc import Awaitable, Callable, Iterable, Iterator
from types import TracebackType
from typing import Any

import aiohttp

from engine_harness.engines import auth_headers
from microbench.client.aio import GcPasses, no_full_collections
from microbench.client.requests import RequestSpec
from microbench.client.session import engine_session
from microbench.client.streams import StreamRecord
from microbench.loadgen.client import classify, send_request
from microbench.loadgen.events import Event, EventBus, EventHook, EventKind
from microbench.loadgen.handshakes import listen_overflows, on_this_host
from microbench.loadgen.stages import (
    RequestRecord,
    SessionResult,
    SessionSettings,
    Stage,
    StageOutcome,
    share_of,
)

__all__ = ["LoadSession"]

# GET /v1/models round trips before the stages: the network's share of every latency. The API server
# answers it alone; SGLang's /health runs a one-token generation and polls for it once a second (≥ 1 s).
_RTT_PROBES = 5
_PROBE_TIMEOUT = aiohttp.ClientTimeout(total=2)  # a GET /v1/models before the stages (round trip, warm pool)


class LoadSession:
    """``async with LoadSession(settings) as s: result = await s.run(stages)``."""

    def __init__(
        self,
        settings: SessionSettings,
        hooks: Iterable[EventHook] = (),
        share: tuple[int, int] = (0, 1),
        stage_start: Callable[[], Awaitable[int]] | None = None,
    ) -> None:
        """``share`` = (k, n): this session is worker k of n (``microbench.loadgen.workers``): of the
        items the stages' plans yield, counted across stages, it sends those whose count is k modulo n
        (and k's part of a closed loop's slots); ``stage_start()`` gives every stage's common start."""
        self.settings = settings
        self.share = share
        self._models_url = settings.base_url.rstrip("/") + "/v1/models"  # the round trips' and warm-up's GET
        self._stage_start = stage_start
        self._pulled = 0  # plan items pulled so far, every worker's included
        self.events = EventBus(list(hooks))
        self.records: list[RequestRecord] = []
        self._http: aiohttp.ClientSession | None = None
        self._headers: dict[str, str] | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._active = 0
        self._stopping = False
        self._wakeup: asyncio.Future[None] | None = None
        self._slots: asyncio.Queue[int | None] | None = None
        self._cancel_reason = "cancelled"
        self._outcome: StageOutcome | None = None
        self._t0_ns = 0

    async def __aenter__(self) -> LoadSession:
        await self.start()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    async def start(self) -> None:
        timeout = aiohttp.ClientTimeout(total=self.settings.request_timeout_s)
        self._http = engine_session(limit=0, timeout=timeout)
        self._headers = auth_headers(self.settings.api_key_env) or None

    async def close(self) -> None:
        if self._tasks:
            await self._drain(0.0)
        if self._http is not None:
            await self._http.close()
            self._http = None

    def stop(self) -> None:
        """End issuing now; the running stage drains, later stages are skipped."""
        self._stopping = True
        if self._wakeup is not None and not self._wakeup.done():
            self._wakeup.set_result(None)
        if self._slots is not None:
            self._slots.put_nowait(None)

    async def run(self, stages: Iterable[Stage]) -> SessionResult:
        """Run the stages in order (each drained before the next) and return the records."""
        if self._http is None:
            raise RuntimeError("LoadSession.run() needs start() (or 'async with') first")
        rtt_ms = await self._round_trips()
        self._t0_ns = time.perf_counter_ns()
        started_unix_ns = time.time_ns()
        self._emit(EventKind.SESSION_STARTED, self._t0_ns)
        outcomes = []
        # The collector (aio.no_full_collections): with the interpreter's thresholds, at 4000 req/s one
        # worker ran ~90 young passes a second and a generation-1 pass every ~0.1 s for 1.5 ms (up to
        # 4 ms), and the sends behind each came late. A healthy request leaves no cyclic garbage (a
        # collection after 2000 of them with the collector off freed nothing); a refused one leaves 85
        # objects, of which young passes free all but ~2, so only they run while stages send. Held back
        # altogether instead (no pass until 500,000 new objects), one pass stopped the loop for 250-460 ms
        # when the sim fell behind and 5000-7700 requests were in flight. AIPerf's timing workers switch
        # the collector off (gc.freeze, gc.disable). Each stage's garbage is collected after its drain.
        with no_full_collections(), GcPasses() as passes:
            for stage in stages:
                if self._stopping:
                    break
                outcome = await self._run_stage(stage)
                outcome.gc_passes = passes.between(outcome.start_ns, outcome.end_ns)
                outcomes.append(outcome)
                gc.collect()  # the stage's cyclic garbage, after its timed part,
                gc.freeze()  # and what outlives it (its records) out of the next stage's young passes
        self._emit(EventKind.SESSION_ENDED, time.perf_counter_ns())
        for record in self.records:  # the streams are parsed here, after the timed part
            _settle(record)
        return SessionResult(self.settings, self._t0_ns, started_unix_ns, self.records, outcomes, rtt_ms)

    async def _round_trips(self, count: int = _RTT_PROBES) -> list[float]:
        """Milliseconds of ``count`` sequential GET /v1/models (any answer is a round trip; none: [])."""
        assert self._http is not None
        url, times = self._models_url, []
        for _ in range(count):
            t0 = time.perf_counter_ns()
            try:
                async with self._http.get(url, headers=self._headers, timeout=_PROBE_TIMEOUT):
                    times.append((time.perf_counter_ns() - t0) / 1e6)
            except (aiohttp.ClientError, TimeoutError):
                return times
        return times

    async def _warm_pool(self, count: int) -> None:
        """Open ``count`` connections at once (concurrent GET /v1/models, bodies read), left idle in the
        pool for the stage. Without it, a late stretch sends its overdue requests in one burst and each one
        past the pool's idle connections opens its own: on a 2-core box's core against a canned responder
        (4000-5000 req/s, 2-s reps, 2026-12-01, results/loadgen-canned-cpu/) reps with p99 delay > 1 ms
        were 11 of 56 cold, 3 of 56 with 200 opened first (at a listen backlog of 100: a cold burst could
        overflow it; 5 of 16 and 1 of 16 at 2048). A failed or unanswered GET (2 s) is let be."""
        http, url = self._http, self._models_url
        assert http is not None

        async def one() -> None:
            with contextlib.suppress(aiohttp.ClientError, TimeoutError):
                async with http.get(url, headers=self._headers, timeout=_PROBE_TIMEOUT) as resp:
                    await resp.read()

        await asyncio.gather(*(one() for _ in range(count)))

    def _emit(self, kind: EventKind, t_ns: int, request_id: int | None = None, **data: Any) -> None:
        if self.events.active:
            stage = self._outcome.name if self._outcome else ""
            self.events.emit(Event(kind, t_ns, stage, request_id, data))

    async def _run_stage(self, stage: Stage) -> StageOutcome:
        outcome = StageOutcome(
            stage.name,
            stage.warmup,
            stage.description,
            stage.requested_rate,
            stage.in_flight_limit,
            stage.max_requests,
            stage.duration_s,
        )
        self._outcome = outcome
        if self.settings.warm_connections:
            await self._warm_pool(self.settings.warm_connections)
        overflows0 = listen_overflows() if on_this_host(self.settings.base_url) else None
        outcome.start_ns = await self._stage_start() if self._stage_start else time.perf_counter_ns()
        self._emit(EventKind.STAGE_STARTED, outcome.start_ns, warmup=stage.warmup)
        cpu0 = time.process_time()
        deadline = None if stage.duration_s is None else outcome.start_ns + int(stage.duration_s * 1e9)
        if stage.in_flight_limit is None:
            await self._open_loop(stage, outcome, deadline)
        else:
            await self._closed_loop(stage, outcome, deadline, stage.in_flight_limit)
        outcome.issue_end_ns = time.perf_counter_ns()
        outcome.issue_cpu_s = time.process_time() - cpu0
        outcome.stopped = self._stopping
        self._emit(EventKind.ISSUE_STOPPED, outcome.issue_end_ns, issued=outcome.issued)
        outcome.drain_cancelled = await self._drain(self.settings.drain_timeout_s)
        outcome.end_ns = time.perf_counter_ns()
        if overflows0 is not None and (overflows := listen_overflows()) is not None:
            outcome.listen_overflows = overflows - overflows0
        self._emit(EventKind.DRAINED, outcome.end_ns, cancelled=outcome.drain_cancelled)
        return outcome

    def _plan(self, stage: Stage) -> Iterator[tuple[int, RequestSpec | None]]:
        """The stage's plan up to its request limit: each item's offset, with its request where this
        worker sends it (``share_of``: the others' items are skipped, not made), else None."""
        k, n = self.share
        for item in share_of(stage.plan, k, n, self._pulled, stage.max_requests):
            self._pulled += 1
            yield item

    async def _open_loop(self, stage: Stage, outcome: StageOutcome, deadline: int | None) -> None:
        for offset_ns, spec in self._plan(stage):
            if self._stopping:
                return
            target = outcome.start_ns + offset_ns
            if deadline is not None and target >= deadline:
                # the issuing window is the nominal one: its empty tail (no arrival drawn) belongs to it
                await self._sleep_until(deadline)
                return
            if spec is None:
                continue  # another worker's: its request is never made here
            spec = spec.built()  # before the wait, not between the target and the send
            if not await self._sleep_until(target):
                return
            self._launch(spec, target, stage, outcome, deadline, None)

    async def _closed_loop(
        self, stage: Stage, outcome: StageOutcome, deadline: int | None, limit: int
    ) -> None:
        slots: asyncio.Queue[int | None] = asyncio.Queue()
        self._slots = slots
        k, n = self.share
        mine = limit // n + (k < limit % n)
        if not mine:
            return  # more workers than slots: this one sends nothing
        for _ in range(mine):
            slots.put_nowait(outcome.start_ns)
        loop = asyncio.get_running_loop()
        timer = None
        if deadline is not None:
            timer = loop.call_later((deadline - time.perf_counter_ns()) / 1e9, slots.put_nowait, None)

        def release() -> None:
            slots.put_nowait(time.perf_counter_ns())

        try:
            for offset_ns, spec in self._plan(stage):
                if spec is None:
                    continue
                spec = spec.built()
                freed_ns = await slots.get()
                if freed_ns is None or self._stopping:
                    return
                if deadline is not None and time.perf_counter_ns() >= deadline:
                    return
                intended = max(freed_ns, outcome.start_ns + offset_ns)
                if not await self._sleep_until(intended):
                    return
                self._launch(spec, intended, stage, outcome, deadline, release)
        finally:
            if timer is not None:
                timer.cancel()
            self._slots = None

    async def _sleep_until(self, target_ns: int) -> bool:
        """Sleep until ``target_ns``, yielding to the loop for the last ``spin_us``; False if stopped."""
        remaining = target_ns - time.perf_counter_ns() - self.settings.spin_us * 1000
        if remaining > 0:
            loop = asyncio.get_running_loop()
            self._wakeup = loop.create_future()
            handle = loop.call_later(remaining / 1e9, _resolve, self._wakeup)
            await self._wakeup
            handle.cancel()
            self._wakeup = None
        # Deliberate spin: each turn lets the loop ingest chunks; a timer would add up to 1 ms of lateness.
        while not self._stopping and time.perf_counter_ns() < target_ns:  # noqa: ASYNC110
            await asyncio.sleep(0)
        return not self._stopping

    def _launch(
        self,
        spec: RequestSpec,
        intended_ns: int,
        stage: Stage,
        outcome: StageOutcome,
        deadline: int | None,
        release: Callable[[], None] | None,
    ) -> None:
        outcome.issued += 1
        task = asyncio.create_task(self._conversation(spec, intended_ns, stage, outcome, deadline, release))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _conversation(
        self,
        spec: RequestSpec,
        intended_ns: int,
        stage: Stage,
        outcome: StageOutcome,
        deadline: int | None,
        release: Callable[[], None] | None,
    ) -> None:
        """Send a request and, for a multi-turn one, its later rounds after their think time."""
        try:
            current: RequestSpec | None = spec
            while current is not None:
                record = await self._send(current, intended_ns, stage, outcome)
                if current.next_turn is None or self._stopping or _settle(record) != "ok":
                    return
                following = current.next_turn(current, record.stream)
                intended_ns = time.perf_counter_ns() + int(current.think_time_s * 1e9)
                if following is None or (deadline is not None and intended_ns >= deadline):
                    return
                await asyncio.sleep(current.think_time_s)
                current = following
        finally:
            if release is not None:
                release()

    async def _send(
        self, spec: RequestSpec, intended_ns: int, stage: Stage, outcome: StageOutcome
    ) -> RequestRecord:
        assert self._http is not None
        record = RequestRecord(len(self.records), stage.name, stage.warmup, spec, intended_ns, StreamRecord())
        self.records.append(record)
        self._active += 1
        outcome.max_in_flight = max(outcome.max_in_flight, self._active)
        self._emit(EventKind.ISSUED, time.perf_counter_ns(), record.request_id, intended_ns=intended_ns)
        try:
            await send_request(
                self._http, self.settings.base_url, spec, self.settings.api, record.stream, self._headers,
                lazy=True,
            )  # fmt: skip
            record.status = "ok"
        except asyncio.CancelledError:
            record.status = "cancelled"
            record.stream.error = record.stream.error or self._cancel_reason
            raise
        except Exception as exc:  # every failure becomes a record; the trace counts them by status
            record.status = classify(exc)
            record.stream.error = record.stream.error or f"{type(exc).__name__}: {exc}"
        finally:
            self._active -= 1
            if self.events.active:
                _settle(record)
                self._emit_outcome(record)
        return record

    def _emit_outcome(self, record: RequestRecord) -> None:
        stream = record.stream
        for i, (t_ns, tokens) in enumerate(zip(stream.chunk_t_ns, stream.chunk_tokens, strict=True)):
            kind = EventKind.FIRST_CHUNK if i == 0 else EventKind.CHUNK
            self._emit(kind, t_ns, record.request_id, tokens=tokens)
        end_ns = stream.t_done_ns or time.perf_counter_ns()
        if record.status == "ok":
            self._emit(EventKind.COMPLETE, end_ns, record.request_id, usage=stream.usage)
        else:
            self._emit(EventKind.ERROR, end_ns, record.request_id, status=record.status, error=stream.error)

    async def _drain(self, timeout_s: float) -> int:
        """Wait up to ``timeout_s`` for in-flight requests, cancel the rest; returns the number cancelled."""
        pending = set(self._tasks)
        if not pending:
            return 0
        if timeout_s > 0:
            _, pending = await asyncio.wait(pending, timeout=timeout_s)
        self._cancel_reason = f"cancelled: still in flight at the drain timeout ({timeout_s:g} s)"
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        return len(pending)


def _settle(record: RequestRecord) -> str:
    """Parse a lazily kept stream; an error found in it (malformed line, error event) sets the status."""
    if record.status == "ok" and (failure := record.stream.failure) is not None:
        record.status = classify(failure)
    return record.status


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)
