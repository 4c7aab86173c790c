"""The simulated engine's step loop: plan a step, wait its modelled duration, emit tokens, log the step.

``SimEngine`` owns the ``Scheduler``, the seeded random generators, the metrics and the ground-truth
step log. It knows nothing of HTTP: a caller ``submit``s a request and reads tokens from the returned
``RequestStream``; ``abort`` frees the request's KV blocks at once.

Timing: a step of model duration ``d`` occupies ``d × time_scale`` wall seconds (``time_scale`` 0: no
waiting at all, only a yield to the event loop). The event loop's timers have millisecond granularity, so
the last ``busy_wait_ms`` (+1 ms) pass in short naps between loop yields (see ``wait_until``).
Tokens are handed to their streams when the step ends; while the engine runs back to back, a step starts
where the previous one ended, so host work between steps counts in the step and wall times follow the
model. A step waits until the model's step grid says it ends: the previous step's *planned* end plus its
own model time. So a late wake-up or a host hiccup (tens of µs to a few ms on a loaded 2-core box) is not
carried into every later step: over a busy period of thousands of steps the engine's clock stays on the
model's (step boundaries, and so which step a request joins, as a virtual-time replay of the model puts
them): the next steps wait that much less. A step that ends more than ``_RESYNC_NS`` behind the grid (a
freeze, a swapped-out process: the engine's own stall) moves the grid on instead, as it would a real
engine's. Below that the noise is the test box's (moving on at every 1 ms, 14 hiccups of 1-6 ms in a 15 s
trace set the grid 20 ms behind the model's). A step takes in the requests that reached the engine by its
start on the grid, not by when a late loop came to plan it, and an idle engine's grid starts at the arrival
that woke it, as the model and a replay of it put both (``clock``: front-end work kept out of a step's last
ms). ``StepRecord.behind_ns`` says how far each step ended behind the grid, ``arrivals`` when the requests
it took in reached the engine (the way in's ground truth), ``engine_ns`` the step on the engine's own clock
(``sim.step_record``). After an idle spell a step pays the configured wake cost (``wake_model``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import time
from collections import deque
from collections.abc import Callable
from typing import IO

from engine_harness.scheduler_model import Scheduler, SimRequest, StepPlan, StepResult
from engine_harness.sim.gpu_modes import host_s, iteration_line, step_times
from engine_harness.sim.params import SimConfig
from engine_harness.sim.step_clock import StepClock
from engine_harness.sim.step_record import StepRecord
from engine_harness.sim.streams import EngineDead, RequestStream
from engine_harness.sim.vllm_metrics import SimMetrics
from engine_harness.step_model import StepShape

__all__ = ["EngineDead", "RequestStream", "SimEngine"]

_NAP_NS = 50_000  # longest blocking nap while waiting out the end of a step
_RESYNC_NS = 50_000_000  # a step ending this much after its planned end (an engine stall): the clock moves on


def _off_grid(behind_ns: int, scale: float) -> bool:
    """A step the model's grid does not time: it ended more than ``_RESYNC_NS`` after its planned end (an
    engine stall), or nothing is waited (scale 0)."""
    return behind_ns > _RESYNC_NS or scale == 0


def _next_start(planned_end: int, scale: float, t1: int) -> int:
    """Where the next back-to-back step is planned to start: this step's planned end, unless the step was
    off the grid (``_off_grid``): then its actual end ``t1``."""
    return t1 if _off_grid(t1 - planned_end, scale) else planned_end


class SimEngine:
    """Scheduler + step-time model + clock; one asyncio task runs the steps."""

    def __init__(self, config: SimConfig, metrics: SimMetrics | None = None) -> None:
        self.config = config
        self.metrics = metrics or SimMetrics(config.model)
        self.scheduler = Scheduler(
            mode=config.mode,
            max_num_batched_tokens=config.max_num_batched_tokens,
            max_num_seqs=config.max_num_seqs,
            block_size=config.block_size,
            num_kv_blocks=config.kv_blocks,
            enable_prefix_caching=config.enable_prefix_caching,
        )
        self.step_log: deque[StepRecord] = deque(maxlen=config.step_log_max)
        self.num_steps = 0
        self.num_arrivals = 0
        self.num_finished = 0
        self.dead: str | None = None
        self.on_die: Callable[[str], None] | None = None
        self.die_in_prefill: str | None = None  # armed (the reason): die as the next cold prompt prefills
        self._jitter_rng = random.Random(config.seed)
        self._streams: dict[str, RequestStream] = {}
        self._arriving: deque[RequestStream] = deque()  # submitted, not yet taken in by a step (``_admit``)
        self._wake = asyncio.Event()
        self.clock = StepClock()  # the running step's planned end, for front-end work (step_clock)
        self._task: asyncio.Task[None] | None = None
        self._log_file: IO[str] | None = None
        self._counted = (0, 0, 0)  # prefix queries, hits, preemptions already added to the counters

    # -- life cycle -------------------------------------------------------------------------------

    async def start(self) -> None:
        if self.config.step_log_path is not None:
            self.config.step_log_path.parent.mkdir(parents=True, exist_ok=True)
            self._log_file = self.config.step_log_path.open("a", encoding="utf-8")
        self._task = asyncio.create_task(self._run(), name="sim-engine-steps")

    async def stop(self) -> None:
        """Stop stepping; requests still in flight end with an error."""
        await self._cancel_task()
        for stream in list(self._streams.values()):
            self._drop(stream, None, "engine stopped")
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None

    def kill(self, reason: str) -> None:
        """Die now (fault injection): every request in flight fails, nothing runs any more."""
        if self.dead is not None:
            return
        self.dead = reason
        if self._task is not None:
            self._task.cancel()
        for stream in list(self._streams.values()):
            self._drop(stream, None, f"engine died: {reason}")
        if self._log_file is not None:
            self._log_file.flush()
        if self.on_die is not None:
            self.on_die(reason)

    async def _cancel_task(self) -> None:
        task, self._task = self._task, None
        if task is not None and not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    # -- requests ---------------------------------------------------------------------------------

    def submit(
        self,
        prompt_token_ids: list[int],
        max_tokens: int,
        min_tokens: int = 0,
        ignore_eos: bool = False,
        request_id: str | None = None,
        external_tokens: int = 0,
    ) -> RequestStream:
        """Queue a request; its generated tokens come from a generator seeded by (seed, arrival index)."""
        if self.dead is not None:
            raise EngineDead(self.dead)
        if len(prompt_token_ids) + max_tokens > self.config.context_limit or not prompt_token_ids:
            raise ValueError(
                f"a request of {len(prompt_token_ids)} prompt + {max_tokens} completion tokens does not fit "
                f"(context limit {self.config.context_limit}, empty prompts refused)"
            )
        index = self.num_arrivals
        self.num_arrivals += 1
        rid = request_id or f"sim-{index}"
        req = SimRequest(rid, list(prompt_token_ids), max_tokens, min_tokens, ignore_eos)
        req.num_external_tokens = min(external_tokens, len(prompt_token_ids) - 1)
        stream = RequestStream(req, random.Random(f"{self.config.seed}:{index}"), self.config.eos_probability)
        self._streams[rid] = stream
        self._arriving.append(stream)
        self.metrics.num_requests_waiting.set(len(self.scheduler.waiting) + len(self._arriving))
        self._wake.set()
        return stream

    def _admit(self, until_ns: int | None) -> None:
        """Hand the scheduler the requests that arrived by ``until_ns`` (None: every one so far)."""
        arriving = self._arriving
        while arriving and (until_ns is None or arriving[0].t_arrival_ns <= until_ns):
            self.scheduler.add(arriving.popleft().request)

    def _forget(self, stream: RequestStream) -> bool:
        """Take ``stream``'s request out of the engine (the scheduler, or the arrivals not yet taken in);
        False if it had already finished."""
        if stream in self._arriving:
            self._arriving.remove(stream)
            return True
        return self.scheduler.abort(stream.request)

    def abort(self, stream: RequestStream) -> None:
        """Abort a request (client gone): free its KV blocks now; no-op once it has finished."""
        if self._forget(stream):
            self.metrics.request_success["abort"].inc()
            self._update_gauges()
        self._streams.pop(stream.request_id, None)
        if not stream.finished:
            stream._end("abort")
        self._wake.set()

    def _drop(self, stream: RequestStream, reason: str | None, error: str | None) -> None:
        self._forget(stream)
        self._streams.pop(stream.request_id, None)
        stream._end(reason, error)

    # -- the step loop ----------------------------------------------------------------------------

    async def _next_plan(self, until_ns: int | None) -> StepPlan | None:
        """Plan the next step from the requests that arrived by ``until_ns`` (its start on the grid; None:
        an idle engine's, every arrival); None (after waiting for work) when nothing can run now."""
        sched = self.scheduler
        self._admit(until_ns)
        if not sched.has_work():
            if self._arriving:  # the engine idled from the grid's step start to an arrival the late loop saw
                return None
            if self._log_file is not None:
                self._log_file.flush()
            self._wake.clear()
            await self._wake.wait()
            return None
        plan = sched.schedule()
        if plan.chunks:
            return plan
        if plan.preempted:
            await asyncio.sleep(0)
        else:
            self._wake.clear()  # nothing fits: wait for an abort or a new request
            await self._wake.wait()
        return None

    async def _run(self) -> None:
        sched, cfg = self.scheduler, self.config
        faults = cfg.faults
        scale = cfg.time_scale
        spin_ns = int(cfg.busy_wait_ms * 1e6)
        # while the engine runs back to back: the previous step's actual end (where the next one is logged
        # to start) and where the model's grid puts the next one's start (what it waits from)
        prev_end: int | None = None
        planned = 0
        plan: StepPlan | None = None  # async scheduling: planned before the previous step's outputs went out
        idle_from = time.perf_counter_ns()  # the last step's end: where an idle spell began
        while True:
            if plan is None:
                plan = await self._next_plan(None if prev_end is None else planned)
                if plan is None:
                    prev_end = None
                    continue
            shape = plan.shape
            if self.die_in_prefill and shape.prefill_tokens >= 128:  # a cold prompt, not a decode's tail
                return self.kill(self.die_in_prefill)
            device_s = cfg.step.sample_s(shape, self._jitter_rng)
            if faults.stall_step == self.num_steps:
                device_s += faults.stall_s
            host = host_s(cfg, shape)
            # Back to back, a step starts when the previous one ended: the host work in between (token
            # hand-off, scheduling) is part of the step's time, so the wall time follows the model exactly.
            if prev_end is None:
                # the grid starts at the arrival that woke the engine, not where the loop came to plan (0.9
                # ms later on the box of 2026-11-30: every later step boundary of the busy period as late)
                now, streams = time.perf_counter_ns(), self._streams
                woke = (streams[r.request_id].t_arrival_ns for r in plan.admitted if r.request_id in streams)
                t0 = planned = min(now, max(planned, min(woke, default=now)))
                device_s += cfg.wake.extra_ms((t0 - idle_from) / 1e9 / scale) / 1e3 if scale else 0.0
            else:
                t0 = prev_end
            for req in plan.admitted:
                stream = self._streams.get(req.request_id)
                if stream is not None and stream.t_scheduled_ns is None:
                    stream.t_scheduled_ns = t0
            done, plan, host_next = plan, None, 0.0
            if not cfg.async_scheduling:
                await self._sleep(planned, host + device_s, scale, spin_ns)
                t1 = time.perf_counter_ns()  # the step's end; committing is the next one's time
                planned_end = planned + int((host + device_s) * scale * 1e9)
                result = sched.commit(done, lambda req: self._streams[req.request_id].draw())
            else:
                # books kept under the device work, as a GPU's host work is (after it, 310 µs for a 1024-token
                # chunk stretched big steps: eager +2-12%); the next step planned before the outputs go out
                result = sched.commit(done, lambda req: self._streams[req.request_id].draw())
                await self._sleep(planned, device_s, scale, spin_ns)
                self._admit(planned + int(device_s * scale * 1e9) if scale else None)
                if sched.has_work():
                    plan = sched.schedule()
                    plan = plan if plan.chunks else None
                    host_next = host_s(cfg, plan.shape) if plan is not None else 0.0
                if host_next > device_s:
                    await self._sleep(planned, host_next, scale, spin_ns)
                t1 = time.perf_counter_ns()
                planned_end = planned + int(max(device_s, host_next) * scale * 1e9)
            prev_end, planned, idle_from = t1, _next_start(planned_end, scale, t1), t1
            whole_s, reported_s = step_times(cfg, device_s, host, host_next)
            self._finish_step(done, result, shape, (whole_s, reported_s), t0, t1, t1 - planned_end)

    async def _sleep(self, t0: int, model_s: float, scale: float, spin_ns: int) -> None:
        """Until ``model_s`` model seconds after ``t0`` (no waiting at all at time scale 0)."""
        if scale > 0:
            self.clock.begin(end := t0 + int(model_s * scale * 1e9))
            await self.wait_until(end, spin_ns)
        else:
            await asyncio.sleep(0)

    @staticmethod
    async def wait_until(deadline_ns: int, spin_ns: int) -> None:
        """Sleep until ``deadline_ns``: a timer for the bulk, then short blocking naps between loop yields.

        The event loop's timers round up to whole milliseconds, so the timer aims ``spin_ns`` + 1 ms early;
        the rest passes in 50 µs naps (no CPU burnt) with a yield after each, so other coroutines (stream
        writers, an in-process client) still run while the step lasts; the last 100 µs only yield.
        """
        while spin_ns <= 0 and (left_ns := deadline_ns - time.perf_counter_ns()) > 0:  # noqa: ASYNC110
            await asyncio.sleep(left_ns / 1e9)  # timer only: ≤ ~1 ms late (uvloop's may fire early: slept on)
        coarse_s = (deadline_ns - time.perf_counter_ns() - spin_ns) / 1e9 - 1e-3
        if coarse_s > 0:
            await asyncio.sleep(coarse_s)
        while (left_ns := deadline_ns - time.perf_counter_ns()) > 0:
            if left_ns > 2 * _NAP_NS:  # a nap may oversleep by the kernel's timer slack (50 µs)
                time.sleep(_NAP_NS / 1e9)  # noqa: ASYNC251 - a nap shorter than any loop timer
            await asyncio.sleep(0)

    def _finish_step(
        self,
        plan: StepPlan,
        result: StepResult,
        shape: StepShape,
        times_s: tuple[float, float],
        t0: int,
        t1: int,
        behind_ns: int,
    ) -> None:
        """Hand the step's tokens out, log the step, count it (``times_s``: whole step, elapsed field)."""
        sched, m = self.scheduler, self.metrics
        streams = self._streams
        prefill_chunks = tuple(
            (c.request.request_id, c.num_tokens, c.context) for c in plan.chunks if not c.is_decode
        )
        scale = self.config.time_scale
        stalled = _off_grid(behind_ns, scale)
        record = StepRecord(
            index=self.num_steps,
            t_start_ns=t0,
            duration_ns=t1 - t0,
            model_duration_s=times_s[0],
            behind_ns=behind_ns,
            engine_ns=t1 - t0 if stalled else round(times_s[0] * scale * 1e9),
            reported_ms=times_s[1] * 1e3,
            decode_tokens=shape.decode_tokens,
            prefill_tokens=shape.prefill_tokens,
            chunk_context=shape.chunk_attention,
            num_decode_reqs=len(plan.chunks) - len(prefill_chunks),
            num_prefill_reqs=len(prefill_chunks),
            preemptions=len(plan.preempted),
            request_ids=tuple(c.request.request_id for c in plan.chunks),
            prefill_chunks=prefill_chunks,
            arrivals=tuple(
                (s.request_id, s.t_arrival_ns) for s in streams.values() if s.t_scheduled_ns == t0
            ),
        )
        self.num_steps += 1
        self.step_log.append(record)
        if self._log_file is not None:
            self._log_file.write(json.dumps(record.to_dict(), separators=(",", ":")) + "\n")
        if self.config.vllm_log:
            print(iteration_line(record, sched.kv_usage), flush=True)
        m.iteration_tokens.observe(record.num_tokens)
        m.generation_tokens.inc(len(result.outputs))
        itl_s = m.inter_token_latency
        for out in result.outputs:
            if (stream := streams.get(out.request.request_id)) is None:  # aborted in its step (async)
                continue
            if stream.t_last_token_ns is None:
                stream.t_first_token_ns = t1
                m.time_to_first_token.observe((t1 - stream.t_arrival_ns) / 1e9)
                m.prompt_tokens.inc(out.request.num_prompt_tokens)
                m.request_prefill_time.observe((t1 - (stream.t_scheduled_ns or t0)) / 1e9)
                m.request_queue_time.observe(((stream.t_scheduled_ns or t0) - stream.t_arrival_ns) / 1e9)
            else:
                itl_s.observe((t1 - stream.t_last_token_ns) / 1e9)
            stream.t_last_token_ns = t1
            stream._push(out.token_id, out.finish_reason)
        for req in result.finished:
            if (stream := streams.pop(req.request_id, None)) is not None:
                self._observe_finished(stream, t1)
        self._update_gauges()
        self.clock.end()
        if self.config.faults.die_after_requests is not None and (
            self.num_finished >= self.config.faults.die_after_requests
        ):
            self.kill(f"die_after_requests={self.config.faults.die_after_requests} reached")

    def _observe_finished(self, stream: RequestStream, t_ns: int) -> None:
        m, req = self.metrics, stream.request
        self.num_finished += 1
        m.request_success[stream.finish_reason or "length"].inc()
        m.e2e_request_latency.observe((t_ns - stream.t_arrival_ns) / 1e9)
        m.request_decode_time.observe((t_ns - (stream.t_first_token_ns or t_ns)) / 1e9)
        m.request_prompt_tokens.observe(req.num_prompt_tokens)
        m.request_generation_tokens.observe(req.num_output_tokens)

    def _update_gauges(self) -> None:
        sched, m = self.scheduler, self.metrics
        m.num_requests_running.set(len(sched.running))
        m.num_requests_waiting.set(len(sched.waiting) + len(self._arriving))
        m.kv_cache_usage_perc.set(sched.kv_usage)
        counts = (sched.prefix_cache_queries, sched.prefix_cache_hits, sched.num_preemptions)
        counters = (m.prefix_cache_queries, m.prefix_cache_hits, m.num_preemptions)
        for counter, now, before in zip(counters, counts, self._counted, strict=True):
            counter.inc(now - before)
        self._counted = counts

    def steps_since(self, index: int = 0) -> list[StepRecord]:
        """Logged steps whose index is ≥ ``index`` (those still in memory)."""
        start = max(0, index - self.step_log[0].index) if self.step_log else 0
        return [self.step_log[i] for i in range(start, len(self.step_log))]
