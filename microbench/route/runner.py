"""Runs a ``RouteConfig`` into a ``RouteFolder``: the engine pair, the router, every replay not on disk.

The two workers start once (``microbench.measure.engine_pair``: joined by the connector, each pinned to
its own cores); the router (``microbench.route.router``) sits in front of them. One unrecorded warm-up
(one hand-off, one local request), then per round the policies in their counterbalanced order; each
replay is the load generator's session (``microbench.loadgen.LoadSession``) sending the seeded workload
through the router. Around each replay: both engines' ``/metrics`` (prefix-cache hits: a cold workload
has none; KV transfers and their time), each engine's CPU use over the replay and the box's load (the
contention). A replay with a failed request or a prefix-cache hit is stored invalid with its reasons and
replayed once more; ``--resume`` replays only what has no valid record.
"""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any

import aiohttp
import pandas as pd
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from analysis.policy import OffloadPolicy
from benchcore.console import console as make_console
from engine_harness.engines import engine_kind
from engine_harness.idle_cpu import group_threads, idle_cpu_between
from engine_harness.launch import EngineProcess
from engine_harness.metrics import MetricsError, Snapshot, scrape
from microbench.client.prompts import TokenSpace, cold_prompt, token_space_for
from microbench.client.requests import ApiSettings, RequestSpec
from microbench.client.session import engine_session
from microbench.loadgen import LoadSession, SessionSettings, Stage
from microbench.loadgen.trace import trace_frame
from microbench.measure.engine_pair import PairAborted, check_runnable, engine_pair
from microbench.results.layout import RouteFolder
from microbench.results.route import EngineLoad, ReplayRecord
from microbench.route.config import RouteConfig
from microbench.route.decide import PolicyName
from microbench.route.router import OffloadRouter
from microbench.route.workload import replay_plan

__all__ = ["MAX_ATTEMPTS", "RouteRunner", "requests_frame"]

MAX_ATTEMPTS = 2
_STAMPS = (
    "t_recv_ns", "t_producer_send_ns", "t_producer_done_ns", "t_consumer_send_ns",
    "t_consumer_first_token_ns", "t_consumer_done_ns",
)  # fmt: skip


def requests_frame(trace: pd.DataFrame, router: OffloadRouter, t0_ns: int) -> pd.DataFrame:
    """The load generator's trace joined with the router's decision and stamps per request (by tag);
    router stamps become offsets from the session start ``t0_ns`` (one process, one clock)."""
    rows: list[dict[str, Any]] = []
    for tag in trace["session_id"]:
        decision, stamps = router.decisions.get(tag), router.stamps.get(tag)
        row: dict[str, Any] = {"session_id": tag}
        if decision is not None:
            row |= {k: v for k, v in decision.model_dump().items() if k not in ("policy", "prompt_tokens")}
            row["decide_ns"] = router.decide_ns.get(tag)
        if stamps is not None:
            for name in _STAMPS:
                value = getattr(stamps, name)
                row[name.removeprefix("t_").removesuffix("_ns") + "_ns"] = (
                    None if value is None else value - t0_ns
                )
            row["failed_phase"] = stamps.failed_phase
        rows.append(row)
    return trace.merge(pd.DataFrame(rows), on="session_id", how="left")


class RouteRunner:
    """Every replay of a run not yet on disk; ``failures`` counts replays left invalid."""

    def __init__(self, folder: RouteFolder, cfg: RouteConfig, console: Console | None = None) -> None:
        self.folder = folder
        self.cfg = cfg
        self.preset = cfg.connector_preset()
        self.console = console or make_console()
        spec = cfg.prefill_spec()
        self.space = TokenSpace.parse(cfg.token_range) if cfg.token_range else token_space_for(spec.model)
        self.table = OffloadPolicy.load(cfg.table) if cfg.table is not None else None
        self.failures = 0

    def todo(self) -> list[tuple[int, int, PolicyName]]:
        return [
            (rep, pos, policy)
            for rep, order in enumerate(self.cfg.rounds())
            for pos, policy in enumerate(order)
            if not self.folder.is_replay_done(policy, rep)
        ]

    async def run(self) -> None:
        check_runnable(self.cfg.prefill_spec().kind, self.preset)
        todo = self.todo()
        total = len(self.cfg.rounds()) * len(self.cfg.policies)
        if not todo:
            self.console.print("every replay is already stored")
            return
        pair = engine_pair(
            self.folder, self.cfg.prefill_spec(), self.cfg.decode_spec(), self.preset, self.console,
            startup_timeout_s=self.cfg.startup_timeout_s, pin=self.cfg.pin_engine_threads,
        )  # fmt: skip
        async with pair as (prefill, decode):
            router = OffloadRouter(
                prefill.base_url, decode.base_url, self.preset.prefill_kv_transfer_params,
                self.cfg.policies[0], self.cfg.chunk(), self.table, self.cfg.phase_timeout_s,
            )  # fmt: skip
            async with router:
                engines = {"prefill": prefill, "decode": decode}
                if self.cfg.warmup:
                    await self._warm_up(router, prefill.spec.model_name)
                columns = (
                    TextColumn("{task.description}"),
                    BarColumn(),
                    MofNCompleteColumn(),
                    TimeElapsedColumn(),
                )
                with Progress(*columns, console=self.console) as progress:
                    task = progress.add_task("replaying", total=total, completed=total - len(todo))
                    for rep, pos, policy in todo:
                        progress.update(task, description=f"{policy} r{rep}")
                        for attempt in range(MAX_ATTEMPTS):
                            await asyncio.sleep(self.cfg.pause_s)
                            record = await self._replay(router, engines, policy, rep, pos)
                            self._abort_if_dead(engines, policy, rep)
                            if record.valid:
                                break
                            if attempt == MAX_ATTEMPTS - 1:
                                self.failures += 1
                        progress.advance(task)
                        self.console.print(replay_line(record))

    async def _warm_up(self, router: OffloadRouter, model: str) -> None:
        """One hand-off and one local request, unrecorded: both paths and the connector are live."""
        api = ApiSettings(model=model)
        settings = SessionSettings(
            base_url=router.base_url, api=api, drain_timeout_s=self.cfg.drain_timeout_s
        )
        for policy in ("disaggregated", "colocated"):
            router.reset(policy)
            spec = RequestSpec(prompt=cold_prompt(256, self.space), prompt_tokens=256, max_tokens=4)
            async with LoadSession(settings) as session:
                result = await session.run(
                    [Stage(name=f"warm-up {policy}", plan=iter([(0, spec)]), max_requests=1)]
                )
            if result.records[0].status != "ok":
                raise PairAborted(f"warm-up ({policy}) failed: {result.records[0].stream.error}")

    async def _replay(
        self, router: OffloadRouter, engines: dict[str, EngineProcess], policy: PolicyName, rep: int, pos: int
    ) -> ReplayRecord:
        router.reset(policy)
        plan = replay_plan(self.cfg.workload, self.cfg.seed, self.space, f"{policy}-r{rep}")
        model = engines["prefill"].spec.model_name
        settings = SessionSettings(
            base_url=router.base_url, api=ApiSettings(model=model), drain_timeout_s=self.cfg.drain_timeout_s
        )
        before = await self._scrape(engines)
        threads = {role: group_threads(e.pid) for role, e in engines.items() if e.pid is not None}
        t0 = time.perf_counter()
        async with LoadSession(settings) as session:
            result = await session.run([Stage(name=policy, plan=iter(plan), max_requests=len(plan))])
        elapsed = time.perf_counter() - t0
        loads = []
        for role, before_threads in threads.items():  # each engine's CPU over the replay: the contention
            pid = engines[role].pid
            assert pid is not None
            load = idle_cpu_between(role, before_threads, group_threads(pid), elapsed)
            loads.append(EngineLoad(role=role, busy_pct=load.total_pct, top_threads_pct=load.top_threads_pct))
        after = await self._scrape(engines)
        frame = requests_frame(trace_frame(result), router, result.t0_ns)
        record = self._record(policy, rep, pos, result.started_unix_ns, elapsed, frame, before, after, loads)
        self.folder.write_replay(record, frame)
        return record

    async def _scrape(self, engines: dict[str, EngineProcess]) -> dict[str, Snapshot | None]:
        async with engine_session() as http:
            out: dict[str, Snapshot | None] = {}
            for role, engine in engines.items():
                try:
                    out[role] = await scrape(http, engine.base_url)
                except (
                    MetricsError,
                    aiohttp.ClientError,
                    TimeoutError,
                ):  # recorded as missing, never as zero
                    out[role] = None
            return out

    def _record(
        self, policy: PolicyName, rep: int, pos: int, started: int, elapsed: float, frame: pd.DataFrame,
        before: dict[str, Snapshot | None], after: dict[str, Snapshot | None], loads: list[EngineLoad],
    ) -> ReplayRecord:  # fmt: skip
        reasons = []
        failed = int((frame["status"] != "ok").sum())
        if failed:
            reasons.append(f"{failed} request(s) did not finish: {sorted(set(frame['status']) - {'ok'})}")
        hits: dict[str, float] = {}
        xfer_count = xfer_sum = None
        metric = self.preset.transfer_time_metric
        for role in before:
            b, a = before[role], after[role]
            if b is None or a is None:
                reasons.append(f"no /metrics from the {role} worker around the replay")
                continue
            names = engine_kind(self.cfg.prefill_spec().kind).metrics
            hit = a.delta(b, names.prefix_cache_hits)
            if hit is not None:
                hits[role] = hit
                if hit > 0:
                    reasons.append(
                        f"{hit:g} prefix-cache hit tokens on the {role} worker: not a cold workload"
                    )
            if metric:
                n, s = a.delta(b, [metric + "_count"]), a.delta(b, [metric + "_sum"])
                if n is not None and s is not None:
                    xfer_count, xfer_sum = (xfer_count or 0) + n, (xfer_sum or 0) + s * 1e3
        return ReplayRecord(
            policy=policy, repetition=rep, position=pos, seed=self.cfg.seed, started_unix_ns=started,
            duration_s=elapsed, requests=len(frame), failed_requests=failed, prefix_cache_hits=hits,
            kv_xfer_count=xfer_count, kv_xfer_sum_ms=xfer_sum, loadavg_1m=os.getloadavg()[0],
            engine_load=loads, valid=not reasons, reasons=reasons,
        )  # fmt: skip

    def _abort_if_dead(self, engines: dict[str, EngineProcess], policy: str, rep: int) -> None:
        for role, engine in engines.items():
            if not engine.alive():
                raise PairAborted(f"the {role} worker died during {policy} r{rep}; see {engine.log_path}")


def replay_line(r: ReplayRecord) -> str:
    """One console line per replay."""
    line = f"{r.policy:>13} r{r.repetition}: {r.requests} requests in {r.duration_s:.1f} s"
    if r.kv_xfer_count:
        line += (
            f", {r.kv_xfer_count:g} KV transfers ({(r.kv_xfer_sum_ms or 0) / r.kv_xfer_count:.1f} ms mean)"
        )
    if r.engine_load:
        line += ", CPU " + ", ".join(f"{x.role} {x.busy_pct:.0f}%" for x in r.engine_load)
    if not r.valid:
        line += f" [invalid: {'; '.join(r.reasons)}]"
    return line
