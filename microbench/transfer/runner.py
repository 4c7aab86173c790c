"""Runs a ``TransferConfig`` into a ``TransferFolder``: the engine pair, the proxy, warm-up, every point.

The producer and the consumer start together (each pinned to its own core on the CPU default, with
the connector's ``--kv-transfer-config`` and environment); the proxy joins them. One unrecorded
warm-up request per mode, then every (mode, P, repetition) not yet on disk; an invalid point is
retried once. A failed request whose engine died is recorded with that engine's log tail and stops
the run (``TransferAborted``) — every wait has a timeout, so a dead consumer is reported, never hung on.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import json
import os
import sys
import time
from collections.abc import AsyncIterator

import aiohttp
import psutil
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from engine_harness.engines import EngineSpec, engine_kind
from engine_harness.launch import EngineProcess, free_port, log_tail
from microbench.client.prompts import TokenSpace, token_space_for
from microbench.transfer.config import ConnectorPreset, TransferConfig
from microbench.transfer.folder import TransferFolder, point_stem
from microbench.transfer.measure import Measured, PointContext, measure_point
from microbench.transfer.proxy import TransferProxy
from microbench.transfer.records import Mode

__all__ = ["MAX_ATTEMPTS", "TransferAborted", "TransferRunner", "parse_cores", "pin_group", "role_spec"]

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
    return base.model_copy(update={"extra_args": extra, "env": base.env | preset.role_env(values)})


class TransferRunner:
    def __init__(self, folder: TransferFolder, cfg: TransferConfig, console: Console | None = None) -> None:
        self.folder = folder
        self.cfg = cfg
        self.preset = cfg.connector_preset()
        self.console = console or Console()
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
            if self.cfg.pin_engine_threads and sys.platform == "linux":
                for role, engine in (("producer", producer), ("consumer", consumer)):
                    bind = engine.spec.cpu_threads_bind
                    if engine.pid is not None and bind and bind != "auto":
                        n = pin_group(engine.pid, parse_cores(bind))
                        self.console.print(f"pinned {n} threads of the {role}'s processes to core(s) {bind}")
            manifest = self.folder.read_manifest()
            manifest.engine_version = producer.version
            manifest.engine_argv = {"producer": producer.argv, "consumer": consumer.argv}
            self.folder.write_manifest(manifest)
            yield producer, consumer
        finally:
            await asyncio.gather(producer.stop(), consumer.stop())

    async def run(self) -> None:
        self.check_runnable()
        todo = [pt for pt in self.cfg.points() if not self.folder.is_point_done(*pt)]
        total = len(self.cfg.points())
        if not todo:
            self.console.print("every point is already measured")
            return
        if total - len(todo):
            self.console.print(
                f"resuming {self.folder.root.name}: {total - len(todo)}/{total} points on disk"
            )
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=10, sock_read=self.cfg.request_timeout_s)
        async with (
            aiohttp.ClientSession(timeout=timeout) as session,
            self.engines() as (producer, consumer),
        ):
            connectors = producer.kind.kv_connectors
            prefill_params = self.preset.prefill_kv_transfer_params if connectors else None
            async with TransferProxy(
                producer.base_url, consumer.base_url, prefill_params, self.cfg.request_timeout_s
            ) as proxy:
                ctx = PointContext(
                    session=session,
                    producer_url=producer.base_url,
                    consumer_url=consumer.base_url,
                    proxy=proxy,
                    model_name=producer.spec.model_name,
                    space=self.space,
                    connector=self.preset,
                    decode_tokens=self.cfg.decode_tokens,
                    run_id=self.folder.root.name,
                    timeout_s=self.cfg.request_timeout_s,
                )
                await self._warm_up(ctx, producer, consumer)
                await self._points(ctx, producer, consumer, todo, total)

    async def _warm_up(self, ctx: PointContext, producer: EngineProcess, consumer: EngineProcess) -> None:
        modes: list[Mode] = ["disaggregated", "colocated"] if self.cfg.colocated else ["disaggregated"]
        for mode in modes:
            m = await measure_point(ctx, mode, self.cfg.warmup_tokens, 0)
            if m.record.failed_phase is not None:
                self._abort_if_dead(m, producer, consumer, f"warm-up ({mode})")
                raise TransferAborted(f"warm-up ({mode}) failed: {'; '.join(m.record.reasons)}")
            if not m.record.valid:
                raise TransferAborted(
                    f"warm-up ({mode}) is not a valid hand-off: {'; '.join(m.record.reasons)}; check the "
                    f"connector set-up in {self.folder.role_log('consumer')}"
                )

    async def _points(
        self,
        ctx: PointContext,
        producer: EngineProcess,
        consumer: EngineProcess,
        todo: list[tuple[Mode, int, int]],
        total: int,
    ) -> None:
        columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
        with Progress(*columns, console=self.console) as progress:
            task = progress.add_task("measuring", total=total, completed=total - len(todo))
            for mode, p, rep in todo:
                progress.update(task, description=f"{mode} P={p} r{rep}")
                for attempt in range(MAX_ATTEMPTS):
                    await asyncio.sleep(self.cfg.pause_s)
                    m = await measure_point(ctx, mode, p, rep)
                    final = m.record.valid or attempt == MAX_ATTEMPTS - 1 or m.record.failed_phase is not None
                    if m.record.failed_phase is not None:
                        m.record.engine_log_tail = self._failed_tail(m, producer, consumer)
                    self.folder.write_raw(m.record.raw_file, m.raw)
                    self.folder.write_metrics(mode, point_stem(p, rep), m.scrapes)
                    self.folder.write_transfer(m.record, attempt, final)
                    if m.record.failed_phase is not None:
                        self.failures += 1
                        self._abort_if_dead(m, producer, consumer, f"{mode} P={p} r{rep}")
                    if final:
                        break
                progress.advance(task)
                ph = m.record.phases
                self.console.print(
                    f"{mode:>13} P={p:<6} r{rep}: TTFT {_f(ph.total_ttft_ms)} ms"
                    + (
                        f" = producer {_f(ph.producer_ms)} + hand-off {_f(ph.handoff_ms)} + client "
                        f"{_f(ph.client_overhead_ms)}; KV xfer {_f(m.record.consumer.kv_xfer_ms)} ms, "
                        f"external tokens {m.record.consumer.tokens_external}"
                        if mode == "disaggregated" and m.record.consumer is not None
                        else ""
                    )
                    + ("" if m.record.valid else f" [invalid: {'; '.join(m.record.reasons)}]")
                )

    def _failed_tail(self, m: Measured, producer: EngineProcess, consumer: EngineProcess) -> str:
        """The log tail of the engine to blame: a dead one first, else the phase that failed."""
        if not consumer.alive():
            engine = consumer
        elif not producer.alive() or m.record.failed_phase == "producer":
            engine = producer
        else:
            engine = consumer if m.record.mode == "disaggregated" else producer
        return log_tail(engine.log_path, 30) if engine.log_path else ""

    def _abort_if_dead(
        self, m: Measured, producer: EngineProcess, consumer: EngineProcess, what: str
    ) -> None:
        for role, engine in (("consumer", consumer), ("producer", producer)):
            if not engine.alive():
                code = engine.proc.returncode if engine.proc is not None else None
                raise TransferAborted(
                    f"the {role} engine died during {what} (exit code {code}): "
                    f"{'; '.join(m.record.reasons)}; last lines of {engine.log_path}:\n"
                    f"{log_tail(engine.log_path, 15) if engine.log_path else ''}"
                )


def _f(x: float | None) -> str:
    return "–" if x is None else f"{x:.1f}"
