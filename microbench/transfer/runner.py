"""Runs a ``TransferConfig`` into a ``TransferFolder``: the stages, warm-up, idle CPU and every point.

Two stages. The pair (``engine_pair``): producer and consumer joined by the connector, the PD proxy
(``microbench.measure.pd_proxy``) between them; the disaggregated and colocated points. Then the lone
engine: the producer's settings with no connector and no peer, the uncontended baseline (``alone``).
Each stage: one unrecorded warm-up per mode, the idle CPU of every engine sampled
(``engine_harness.idle_cpu``), then every point without a valid record on disk; an invalid point is
retried once. A point whose engine died or hung (no progress for the stall timeout,
``engine_harness.watchdog``) is recorded with that engine's log tail and stops the run
(``PairAborted``).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal

import aiohttp
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn

from benchcore.console import console as make_console
from engine_harness.idle_cpu import deprioritize_spinners, sample_idle_cpu
from engine_harness.kv_connectors import load_connector
from engine_harness.launch import EngineProcess, log_tail
from microbench.client.prompts import TokenSpace, token_space_for
from microbench.client.session import engine_session
from microbench.measure.engine_pair import PairAborted
from microbench.measure.pd_proxy import PDProxy
from microbench.results.layout import TransferFolder, point_stem
from microbench.results.transfer import Mode, TransferRecord
from microbench.transfer.config import TransferConfig
from microbench.transfer.engine_pair import alone_engine, check_runnable, engine_pair
from microbench.transfer.measure import Measured, PointContext, measure_point

Point = tuple[Mode, int, int]

__all__ = ["MAX_ATTEMPTS", "TransferRunner", "point_line"]

MAX_ATTEMPTS = 2


class TransferRunner:
    """Measures every point of a run not yet on disk, stage by stage; ``failures`` counts failed points."""

    def __init__(self, folder: TransferFolder, cfg: TransferConfig, console: Console | None = None) -> None:
        self.folder = folder
        self.cfg = cfg
        self.preset = cfg.connector_preset()
        self.console = console or make_console()
        producer = cfg.producer_spec()
        self.space = TokenSpace.parse(cfg.token_range) if cfg.token_range else token_space_for(producer.model)
        self.failures = 0

    async def run(self) -> None:
        check_runnable(self.cfg, self.preset)
        todo = [pt for pt in self.cfg.points() if not self.folder.is_point_done(*pt)]
        total = len(self.cfg.points())
        if not todo:
            self.console.print("every point is already measured")
            return
        if total - len(todo):
            self.console.print(
                f"resuming {self.folder.root.name}: {total - len(todo)}/{total} valid points on disk, "
                f"{len(todo)} to measure (failed and invalid ones again)"
            )
        # no socket-read timeout on the client: the proxy's per-phase timeouts must fire first
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=10)
        columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
        async with engine_session(timeout=timeout) as session:
            with Progress(*columns, console=self.console) as progress:
                task = progress.add_task("measuring", total=total, completed=total - len(todo))
                pair = [pt for pt in todo if pt[0] != "alone"]
                alone = [pt for pt in todo if pt[0] == "alone"]
                if pair:
                    await self._pair_stage(session, pair, progress, task)
                if alone:
                    await self._alone_stage(session, alone, progress, task)

    def _context(
        self,
        session: aiohttp.ClientSession,
        producer: EngineProcess,
        consumer: EngineProcess | None,
        proxy: PDProxy | None,
    ) -> PointContext:
        return PointContext(
            session=session,
            producer_url=producer.base_url,
            consumer_url=consumer.base_url if consumer is not None else None,
            proxy=proxy,
            model_name=producer.spec.model_name,
            space=self.space,
            connector=self.preset if consumer is not None else load_connector("none"),
            decode_tokens=self.cfg.decode_tokens,
            run_id=self.folder.root.name,
            phase_timeout_s=self.cfg.phase_timeout_s,
            stall_s=self.cfg.stall_timeout_s,
            producer_pgid=producer.pid,
            consumer_pgid=consumer.pid if consumer is not None else None,
        )

    async def _pair_stage(
        self, session: aiohttp.ClientSession, todo: list[Point], progress: Progress, task: TaskID
    ) -> None:
        async with engine_pair(self.folder, self.cfg, self.preset, self.console) as (producer, consumer):
            prefill_params = self.preset.prefill_kv_transfer_params
            async with PDProxy(
                producer.base_url, consumer.base_url, prefill_params, self.cfg.phase_timeout_s
            ) as proxy:
                ctx = self._context(session, producer, consumer, proxy)
                engines = {"producer": producer, "consumer": consumer}
                for mode in self.cfg.pair_modes():
                    await self._warm_up(ctx, mode, engines)
                await self._sample_idle("pair", engines)
                await self._points(ctx, engines, todo, progress, task)

    async def _alone_stage(
        self, session: aiohttp.ClientSession, todo: list[Point], progress: Progress, task: TaskID
    ) -> None:
        async with alone_engine(self.folder, self.cfg, self.console) as engine:
            ctx = self._context(session, engine, None, None)
            engines = {"producer": engine}
            await self._warm_up(ctx, "alone", engines)
            await self._sample_idle("alone", {"alone": engine})
            await self._points(ctx, engines, todo, progress, task)

    async def _sample_idle(self, stage: str, engines: dict[str, EngineProcess]) -> None:
        """Idle CPU of each engine of this stage (after warm-up, nothing in flight), kept in the folder."""
        if self.cfg.idle_sample_s <= 0:
            return
        groups = {role: e.pid for role, e in engines.items() if e.pid is not None and e.kind.launched}
        if not groups:
            return
        await asyncio.sleep(self.cfg.pause_s)
        idle = await sample_idle_cpu(groups, self.cfg.idle_sample_s)
        if self.cfg.spinners == "sched-idle":
            idle = {
                role: s.model_copy(update={"deprioritized": deprioritize_spinners(s)})
                for role, s in idle.items()
            }
        self.folder.write_idle(stage, idle)
        self.console.print(
            f"idle CPU ({stage}, {self.cfg.idle_sample_s:g} s): "
            + ", ".join(f"{role} {s.total_pct:.0f}% of a core" for role, s in idle.items())
            + "".join(
                f"; {role}: {', '.join(s.deprioritized)} moved to SCHED_IDLE"
                for role, s in idle.items()
                if s.deprioritized
            )
        )

    async def _warm_up(self, ctx: PointContext, mode: Mode, engines: dict[str, EngineProcess]) -> None:
        m = await measure_point(ctx, mode, self.cfg.warmup_tokens, 0)
        if m.record.failed_phase is not None:
            self._abort_if_stuck(m, engines, f"warm-up ({mode})")
            raise PairAborted(f"warm-up ({mode}) failed: {'; '.join(m.record.reasons)}")
        if not m.record.valid:
            log = self.folder.role_log("consumer" if mode == "disaggregated" else "producer")
            raise PairAborted(
                f"warm-up ({mode}) is not a valid hand-off: {'; '.join(m.record.reasons)}; check the "
                f"connector set-up in {log}"
            )

    async def _points(
        self,
        ctx: PointContext,
        engines: dict[str, EngineProcess],
        todo: list[Point],
        progress: Progress,
        task: TaskID,
    ) -> None:
        for mode, p, rep in todo:
            progress.update(task, description=f"{mode} P={p} r{rep}")
            for attempt in range(MAX_ATTEMPTS):
                await asyncio.sleep(self.cfg.pause_s)
                m = await measure_point(ctx, mode, p, rep)
                final = m.record.valid or attempt == MAX_ATTEMPTS - 1 or m.record.failed_phase is not None
                if m.record.failed_phase is not None:
                    m.record.engine_log_tail = self._failed_tail(m, engines)
                self.folder.write_raw(m.record.raw_file, m.raw)
                self.folder.write_metrics(mode, point_stem(p, rep), m.scrapes)
                self.folder.write_transfer(m.record, attempt, final)
                if m.record.failed_phase is not None:
                    self.failures += 1
                    self._abort_if_stuck(m, engines, f"{mode} P={p} r{rep}")
                if final:
                    break
            progress.advance(task)
            self.console.print(point_line(m.record))

    def _failed_tail(self, m: Measured, engines: dict[str, EngineProcess]) -> str:
        """The log tail of the engine to blame: a dead one first, else the one of the failed phase."""
        dead = [e for e in engines.values() if not e.alive()]
        role = m.record.failed_phase if m.record.failed_phase in engines else "producer"
        engine = dead[0] if dead else engines[role]
        return log_tail(engine.log_path, 30) if engine.log_path else ""

    def _abort_if_stuck(self, m: Measured, engines: dict[str, EngineProcess], what: str) -> None:
        """Stop the run when an engine died or hung: what follows could only fail or wait."""
        for role, engine in engines.items():
            if not engine.alive():
                code = engine.proc.returncode if engine.proc is not None else None
                raise PairAborted(
                    f"the {role} engine died during {what} (exit code {code}): "
                    f"{'; '.join(m.record.reasons)}; last lines of {engine.log_path}:\n"
                    f"{log_tail(engine.log_path, 15) if engine.log_path else ''}"
                )
        if m.record.hung:
            role = m.record.failed_phase or "producer"
            hung = engines.get(role)
            if hung is not None and hung.pid is not None:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(hung.pid, signal.SIGCONT)  # a stopped engine cannot act on SIGTERM
            raise PairAborted(
                f"{what}: {'; '.join(m.record.reasons)}. The run stops (every later point would wait on it); "
                f"see {self.folder.role_log(role)}, then continue with --resume"
            )


def point_line(r: TransferRecord) -> str:
    """One console line per point; reasons escaped so rich does not take them for markup."""
    ph = r.phases
    line = f"{r.mode:>13} P={r.prefill_tokens:<6} r{r.repetition}: TTFT {_f(ph.total_ttft_ms)} ms"
    if r.mode == "disaggregated" and r.consumer is not None:
        line += (
            f" = producer {_f(ph.producer_ms)} + hand-off {_f(ph.handoff_ms)} + client "
            f"{_f(ph.client_overhead_ms)}; KV xfer {_f(_xfer_ms(r))} ms, "
            f"external tokens {_f(r.consumer.tokens_external, 0)}"
        )
    if not r.valid:
        line += " " + escape(f"[invalid: {'; '.join(r.reasons)}]")
    return line


def _xfer_ms(r: TransferRecord) -> float | None:
    """The transfer time of the engine that counted the transfer (pull: consumer, push: producer)."""
    for side in (r.consumer, r.producer):
        if side is not None and side.kv_xfer_count:
            return side.kv_xfer_ms
    return None


def _f(x: float | None, digits: int = 1) -> str:
    return "–" if x is None else f"{x:.{digits}f}"
