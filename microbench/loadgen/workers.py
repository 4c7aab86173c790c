"""Load generation past one core: the stages run in N worker processes, one seeded schedule between them.

``run_sessions(settings, stages, workers)`` forks N processes. Each inherits the stages (their plans are
seeded iterators, so every copy yields the same items in the same order) and runs its own event loop and
connection pool as ``LoadSession(share=(k, n))``: of the items the plans yield, counted across stages, worker
k sends those whose count is k modulo n, at their absolute target times — every stage starts at one
``perf_counter_ns`` instant (CLOCK_MONOTONIC, the same clock in every process) that the workers agree on
at a barrier, so the merged sends follow the one schedule. No item is sent twice and each prompt stays
unique: the workers' counts never meet. A closed loop's slots are split between the workers (its items
still alternate: a worker with one slot fewer sets the pace of a request-limited closed stage). A stage
ended by a request count or by an open loop's time is the same in every worker; a closed loop ended by
time is not (each worker pulled what its slots freed), so an open-loop stage after one keeps prompts
unique but may send pairs at one target time instead of the whole schedule (the trace shows it).

The workers' records come back (parsed, pickled) and are merged into one ``SessionResult``: records in
order of intended send time and numbered again, each stage's outcome summed (``max_in_flight`` is the sum
of the workers' maxima, an upper bound; ``gc_passes``: every worker's, by start; ``listen_overflows``: the
largest, each worker having read the one host's count over the stage). ``RequestRecord.worker``
says who sent what; ``worker_delays`` gives each worker's schedule delay, the figure that shows which one
fell behind. Each worker builds only the requests it sends (the plans yield drafts, ``RequestSpec.built``),
and passes the others' by with the plan's ``skip()`` where it has one (``stages.share_of``: a workload's
plan does), for the price of their draws, not their drafts; it sends back its prompt factories' request
counts, which this process takes over, so a later run here never numbers a request again that a worker drew
(``microbench.workloads.prompts``). One worker (the default) runs in this process, as before. ``cores``
pins worker k to a core. ``SentCount`` lets a progress display (the battery's) read how many requests the
workers have sent while they run.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import multiprocessing as mp
import os
import time
from collections.abc import Iterable, Sequence
from multiprocessing.connection import Connection
from typing import Any

import numpy as np

from microbench.client import aio
from microbench.loadgen.events import EventHook
from microbench.loadgen.session import LoadSession
from microbench.loadgen.stages import SessionResult, SessionSettings, Stage, StageOutcome
from microbench.workloads.prompts import item_counts, raise_item_counts

__all__ = ["SentCount", "merge_results", "run_sessions", "worker_delays"]

_LEAD_NS = 50_000_000  # a stage starts this long after the last worker reached the barrier
_COUNT_EVERY_S = 0.5


class SentCount:
    """Requests sent so far by each worker, in shared memory: a progress display reads ``total()`` while
    the workers run (each writes its own slot twice a second)."""

    def __init__(self, workers: int) -> None:
        self.slots = mp.get_context("fork").Array("q", workers, lock=False)

    def total(self) -> int:
        return int(sum(self.slots))


async def run_sessions(
    settings: SessionSettings,
    stages: list[Stage],
    workers: int = 1,
    hooks: Iterable[EventHook] = (),
    sent: SentCount | None = None,
    cores: Sequence[int] | None = None,
) -> SessionResult:
    """Run ``stages`` in ``workers`` processes (1: in this one) and return the merged result; ``sent``
    (one slot per worker) counts the requests sent so far while they run; ``cores``: worker k runs
    pinned to core ``cores[k]`` (one worker: this process, its own affinity back after the run)."""
    if workers < 1:
        raise ValueError("workers must be at least 1")
    if cores is not None and len(cores) < workers:
        raise ValueError(f"{workers} workers need {workers} cores to pin to, got {list(cores)}")
    if workers == 1:
        affinity = os.sched_getaffinity(0)
        try:
            if cores is not None:
                os.sched_setaffinity(0, {cores[0]})
            async with LoadSession(settings, hooks=hooks) as session:
                return await _counted(session, stages, sent, 0)
        finally:
            os.sched_setaffinity(0, affinity)
    if list(hooks):
        raise ValueError("event hooks run in one process: use them with one worker")
    ctx = mp.get_context("fork")  # the children inherit the stages' plans (iterators, closures) as they are
    start = ctx.Value("q", 0, lock=False)
    barrier = ctx.Barrier(workers, action=lambda: _set_start(start))
    pipes = [ctx.Pipe(duplex=False) for _ in range(workers)]
    procs = [
        ctx.Process(
            target=_worker,
            args=(
                k,
                workers,
                settings,
                stages,
                barrier,
                start,
                send,
                sent,
                None if cores is None else cores[k],
            ),
            daemon=True,
        )
        for k, (_, send) in enumerate(pipes)
    ]
    for proc in procs:
        proc.start()
    for _, send in pipes:
        send.close()
    loop = asyncio.get_running_loop()
    try:
        answers = [await loop.run_in_executor(None, _receive, recv) for recv, _ in pipes]
    finally:
        for proc in procs:
            if proc.is_alive():
                proc.terminate()
            proc.join()
    failed = [a for a in answers if isinstance(a, str)]
    if failed:
        raise RuntimeError(f"a load-generation worker failed: {failed[0]}")
    results = [a for a in answers if not isinstance(a, str)]
    for _, counts in results:  # the requests the workers numbered are numbered here too
        raise_item_counts(counts)
    return merge_results([result for result, _ in results])


async def _counted(
    session: LoadSession, stages: list[Stage], sent: SentCount | None, k: int
) -> SessionResult:
    """``session.run(stages)``, writing its requests sent so far into ``sent``'s slot ``k`` meanwhile."""

    async def count() -> None:
        assert sent is not None
        while True:
            sent.slots[k] = len(session.records)
            await asyncio.sleep(_COUNT_EVERY_S)

    counter = None if sent is None else asyncio.create_task(count())
    try:
        return await session.run(stages)
    finally:
        if counter is not None:
            counter.cancel()
            sent.slots[k] = len(session.records)  # type: ignore[union-attr]


def _set_start(start: Any) -> None:
    start.value = time.perf_counter_ns() + _LEAD_NS


def _receive(recv: Connection) -> tuple[SessionResult, dict[int, int]] | str:
    try:
        return recv.recv()
    except EOFError:
        return "it exited without a result (killed, or out of memory)"


def _worker(
    k: int,
    n: int,
    settings: SessionSettings,
    stages: list[Stage],
    barrier: Any,
    start: Any,
    send: Connection,
    sent: SentCount | None,
    core: int | None,
) -> None:
    if core is not None:
        os.sched_setaffinity(0, {core})

    async def stage_start() -> int:
        await asyncio.get_running_loop().run_in_executor(None, barrier.wait)
        return int(start.value)

    async def main() -> SessionResult:
        async with LoadSession(settings, share=(k, n), stage_start=stage_start) as session:
            return await _counted(session, stages, sent, k)

    try:
        result = aio.run(main())
        for record in result.records:
            record.worker = k
            record.spec = dataclasses.replace(record.spec, next_turn=None)  # a closure does not pickle
        send.send((result, item_counts()))
    except BaseException as exc:  # the parent gets the reason, whatever it was
        barrier.abort()
        with contextlib.suppress(OSError):
            send.send(f"worker {k}: {type(exc).__name__}: {exc}")
        raise
    finally:
        send.close()


def merge_results(results: list[SessionResult]) -> SessionResult:
    """The workers' results as one session's: records by intended send time, stages summed."""
    records = sorted((r for res in results for r in res.records), key=lambda r: (r.intended_ns, r.worker))
    for i, record in enumerate(records):
        record.request_id = i
    stages = [
        _merge_stage(list(outcomes)) for outcomes in zip(*(res.stages for res in results), strict=False)
    ]
    first = min(results, key=lambda res: res.t0_ns)
    return SessionResult(first.settings, first.t0_ns, first.started_unix_ns, records, stages, first.rtt_ms)


def _merge_stage(outcomes: list[StageOutcome]) -> StageOutcome:
    merged = dataclasses.replace(outcomes[0])
    merged.start_ns = min(o.start_ns for o in outcomes)
    merged.issue_end_ns = max(o.issue_end_ns for o in outcomes)
    merged.end_ns = max(o.end_ns for o in outcomes)
    merged.issued = sum(o.issued for o in outcomes)
    merged.max_in_flight = sum(o.max_in_flight for o in outcomes)
    merged.issue_cpu_s = sum(o.issue_cpu_s for o in outcomes)
    merged.drain_cancelled = sum(o.drain_cancelled for o in outcomes)
    merged.stopped = any(o.stopped for o in outcomes)
    merged.gc_passes = sorted((p for o in outcomes for p in o.gc_passes), key=lambda p: p.start_ns)
    counted = [o.listen_overflows for o in outcomes if o.listen_overflows is not None]
    merged.listen_overflows = max(counted) if counted else None  # one host's count, over like windows
    return merged


def worker_delays(result: SessionResult, stage: str | None = None) -> dict[int, dict[str, float]]:
    """Per worker: requests sent and schedule delay (actual − intended send) p50/p99/max in ms, over the
    first rounds of ``stage`` (every non-warm-up stage if None)."""
    delays: dict[int, list[int]] = {}
    for r in result.records:
        if r.spec.round_index or (r.warmup if stage is None else r.stage != stage) or not r.stream.t_send_ns:
            continue
        delays.setdefault(r.worker, []).append(r.stream.t_send_ns - r.intended_ns)
    out = {}
    for worker, values in sorted(delays.items()):
        ms = np.asarray(values, dtype=float) / 1e6
        out[worker] = {
            "sent": len(values),
            "p50_ms": float(np.percentile(ms, 50)),
            "p99_ms": float(np.percentile(ms, 99)),
            "max_ms": float(ms.max()),
        }
    return out
