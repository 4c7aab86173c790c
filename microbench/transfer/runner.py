"""Runs a ``TransferConfig`` into a ``TransferFolder``: the engine pair, the proxy, warm-up, every point.

Two stages. The pair: producer and consumer start together (each pinned to its own core on the CPU
default, with the connector's ``--kv-transfer-config`` and environment), the proxy joins them; the
disaggregated and colocated points. Then the lone engine: the producer's settings with no connector
and no peer, the uncontended baseline (``alone``). Each stage: one unrecorded warm-up per mode, the
idle CPU of every engine sampled (``idle``), then every point without a valid record on disk; an
invalid point is retried once. A point whose engine died or hung (no progress for the stall timeout,
``watchdog``) is recorded with that engine's log tail and stops the run (``TransferAborted``).
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import json
import os
import signal
import sys
import time
from collections.abc import AsyncIterator

import aiohttp
import psutil
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn

from benchcore.console import console as make_console
from engine_harness.engines import EngineSpec, engine_kind
from engine_harness.launch import EngineProcess, free_port, log_tail
from microbench.client.prompts import TokenSpace, token_space_for
from microbench.results.layout import TransferFolder, point_stem
from microbench.results.transfer import Mode, TransferRecord
from microbench.transfer.config import ConnectorPreset, TransferConfig, load_connector
from microbench.transfer.idle import deprioritize_spinners, sample_idle_cpu
from microbench.transfer.measure import Measured, PointContext, measure_point
from microbench.transfer.proxy import TransferProxy

Point = tuple[Mode, int, int]

__all__ = [
    "MAX_ATTEMPTS",
    "TransferAborted",
    "TransferRunner",
    "parse_cores",
    "pin_group",
    "point_line",
    "role_spec",
]

MAX_ATTEMPTS = 2


class TransferAborted(RuntimeError):
    """The run cannot go on: an engine died, or the set-up is impossible here."""


def parse_cores(text: str) -> set[int]:
    """``"0"``, ``"0-3"``, ``"0,2"`` → a core set (VLLM_CPU_OMP_THREADS_BIND syntax, one NUMA group)."""
    cores: set[int] = set()
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        cores.update(range(int(lo), int(hi or lo) + 1))
    return cores


def pin_group(pgid: int, cores: set[int]) -> int:
    """Pin every thread of every live process in process group ``pgid`` to ``cores``; threads pinned."""
    pinned = 0
    for proc in psutil.process_iter(["pid"]):
        try:
            if os.getpgid(proc.pid) != pgid:
                continue
            for tid in os.listdir(f"/proc/{proc.pid}/task"):
                with contextlib.suppress(OSError):
                    os.sched_setaffinity(int(tid), cores)
                    pinned += 1
        except (psutil.Error, OSError):
            continue
    return pinned


def role_spec(base: EngineSpec, preset: ConnectorPreset, role: str, storage: str) -> EngineSpec:
    """``base`` with the connector's ``--kv-transfer-config`` and environment for ``role``."""
    values = {"free_port": str(free_port()), "storage_path": storage}
    cfg = preset.role_config("producer" if role == "producer" else "consumer", values)
    extra = list(base.extra_args) + (
        ["--kv-transfer-config", json.dumps(cfg)] if cfg and engine_kind(base.kind).kv_connectors else []
    )
    if not engine_kind(base.kind).kv_connectors:
        extra += preset.sim_args  # the sim's own connector switch (engine_harness/sim/kv_transfer.py)
    return base.model_copy(update={"extra_args": extra, "env": base.env | preset.role_env(values)})


class TransferRunner:
    def __init__(self, folder: TransferFolder, cfg: TransferConfig, console: Console | None = None) -> None:
        self.folder = folder
        self.cfg = cfg
        self.preset = cfg.connector_preset()
        self.console = console or make_console()
        producer = cfg.producer_spec()
        self.space = TokenSpace.parse(cfg.token_range) if cfg.token_range else token_space_for(producer.model)
        self.failures = 0

    def check_runnable(self) -> None:
        """Refuse a GPU-only preset on this box and a connector whose package is missing, with the fix."""
        if not engine_kind(self.cfg.producer_spec().kind).kv_connectors:
            return
        if not self.preset.run_here:
            from engine_harness.telemetry import NvmlSource

            if not NvmlSource.gpu_names():
                raise TransferAborted(
                    f"connector {self.preset.name!r} is a GPU preset (run_here: false) and this machine has "
                    "no GPU; use --connector nixl-cpu (or example-storage) here"
                )
        missing = [pkg for pkg in self.preset.requires if importlib.util.find_spec(pkg) is None]
        if missing:
            raise TransferAborted(
                f"connector {self.preset.name!r} needs the Python package(s) {missing}, not installed; for "
                "NIXL on CPU: `pip install nixl-cu12 && pip install --no-deps nixl` "
                "(or bash scripts/setup.sh)"
            )

    @contextlib.asynccontextmanager
    async def engines(self) -> AsyncIterator[tuple[EngineProcess, EngineProcess]]:
        """Producer and consumer started together; both stopped on every exit path."""
        storage = str(self.folder.root / "kv-storage")
        producer = EngineProcess(
            role_spec(self.cfg.producer_spec(), self.preset, "producer", storage),
            self.folder.role_log("producer"),
            startup_timeout_s=self.cfg.startup_timeout_s,
        )
        consumer = EngineProcess(
            role_spec(self.cfg.consumer_spec(), self.preset, "consumer", storage),
            self.folder.role_log("consumer"),
            startup_timeout_s=self.cfg.startup_timeout_s,
        )
        try:
            t0 = time.perf_counter_ns()
            results = await asyncio.gather(producer.start(), consumer.start(), return_exceptions=True)
            errors = [r for r in results if isinstance(r, BaseException)]
            if errors:
                raise errors[0]
            self.console.print(
                f"producer {producer.base_url} + consumer {consumer.base_url} up in "
                f"{(time.perf_counter_ns() - t0) / 1e9:.1f} s "
                f"({producer.spec.kind} {producer.version or ''}, connector {self.preset.name})"
            )
            self._pin({"producer": producer, "consumer": consumer})
            manifest = self.folder.read_manifest()
            manifest.engine_version = producer.version
            manifest.engine_argv = {"producer": producer.argv, "consumer": consumer.argv}
            self.folder.write_manifest(manifest)
            yield producer, consumer
        finally:
            await asyncio.gather(producer.stop(), consumer.stop())

    @contextlib.asynccontextmanager
    async def alone_engine(self) -> AsyncIterator[EngineProcess]:
        """The producer's engine started alone: same settings and cores, no connector, no peer."""
        spec = role_spec(self.cfg.producer_spec(), load_connector("none"), "producer", "")
        engine = EngineProcess(
            spec, self.folder.role_log("alone"), startup_timeout_s=self.cfg.startup_timeout_s
        )
        try:
            await engine.start()
            self.console.print(
                f"lone engine {engine.base_url} up in {engine.startup_s or 0:.1f} s (no connector)"
            )
            self._pin({"alone": engine})
            yield engine
        finally:
            await engine.stop()

    def _pin(self, engines: dict[str, EngineProcess]) -> None:
        if not self.cfg.pin_engine_threads or sys.platform != "linux":
            return
        for role, engine in engines.items():
            bind = engine.spec.cpu_threads_bind
            if engine.pid is not None and bind and bind != "auto":
                n = pin_group(engine.pid, parse_cores(bind))
                self.console.print(f"pinned {n} threads of the {role}'s processes to core(s) {bind}")

    async def run(self) -> None:
        self.check_runnable()
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
        async with aiohttp.ClientSession(timeout=timeout) as session:
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
        proxy: TransferProxy | None,
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
        async with self.engines() as (producer, consumer):
            prefill_params = self.preset.prefill_kv_transfer_params
            async with TransferProxy(
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
        async with self.alone_engine() as engine:
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
            raise TransferAborted(f"warm-up ({mode}) failed: {'; '.join(m.record.reasons)}")
        if not m.record.valid:
            log = self.folder.role_log("consumer" if mode == "disaggregated" else "producer")
            raise TransferAborted(
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
                raise TransferAborted(
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
            raise TransferAborted(
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
