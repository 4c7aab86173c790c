"""Two engines joined by a KV connector (producer prefills, consumer decodes), and the producer alone.

Part of the shared measurement floor: the transfer benchmark measures the hand-off between them and the
router job (``microbench.route``) puts its policies in front of them. Each engine is started, pinned
(every thread of each engine's process group to that engine's cores: the ``VLLM_CPU_OMP_THREADS_BIND``
of its spec pins only the compute threads) and stopped on every exit path; both engines' version and
argv go into the run folder's manifest; logs are ``engine-<role>.log`` in the folder. ``check_runnable``
refuses, before any engine starts, a GPU-only preset on a box without one and a connector whose Python
package is missing, with the install command for this platform.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import time
from collections.abc import AsyncIterator, Callable, Coroutine, Sequence
from typing import Any

from rich.console import Console
from rich.markup import escape

from benchcore.cli import EXIT_FAILURES, Stopped
from engine_harness.engines import EngineSpec, engine_kind
from engine_harness.kv_connectors import (
    ConnectorError,
    ConnectorPreset,
    install_hint,
    load_connector,
    missing_packages,
    role_spec,
    torch_cuda_version,
)
from engine_harness.launch import EngineError, EngineProcess
from engine_harness.process_group import parse_cores, pin_group
from engine_harness.settings import EngineSettings
from microbench.results.layout import JobFolder

__all__ = [
    "PairAborted",
    "alone_engine",
    "check_runnable",
    "connector_preset",
    "engine_pair",
    "pin_engines",
    "run_pair_job",
    "worker_spec",
]


class PairAborted(RuntimeError):
    """The run cannot go on: an engine died, or the set-up is impossible here."""


def connector_preset(name: str) -> ConnectorPreset:
    """The named KV-connector preset of a pair job's definition; ValueError (a validator's) naming why not."""
    try:
        return load_connector(name)
    except ConnectorError as exc:
        raise ValueError(str(exc)) from None


def worker_spec(
    settings: EngineSettings, chunk: int | None, cores: str | None, extra_args: Sequence[str] = ()
) -> EngineSpec:
    """One engine of a pair from the job's engine settings: its token budget (None: the preset's own),
    its cores where the kind binds its threads, and the arguments only this worker gets."""
    spec = settings.resolve(chunk_size=chunk)
    if engine_kind(spec.kind).cpu_thread_binding and cores is not None:
        spec = spec.model_copy(update={"cpu_threads_bind": cores})
    if extra_args:
        spec = spec.model_copy(update={"extra_args": [*spec.extra_args, *extra_args]})
    return spec


def check_runnable(kind: str, preset: ConnectorPreset) -> None:
    """Refuse a GPU-only preset on this box and a connector whose package is missing, with the fix."""
    if not engine_kind(kind).kv_connectors:
        return
    if not preset.run_here:
        from engine_harness.telemetry import NvmlSource

        if not NvmlSource.gpu_names():
            raise PairAborted(
                f"connector {preset.name!r} is a GPU preset (run_here: false) and this machine has "
                "no GPU; use --connector nixl-cpu (or example-storage) here"
            )
    missing = missing_packages(preset)
    if missing:
        raise PairAborted(
            f"connector {preset.name!r} needs the Python package(s) {missing}, not installed; install: "
            + install_hint(missing, torch_cuda_version())
        )


@contextlib.asynccontextmanager
async def engine_pair(
    folder: JobFolder,
    producer_spec: EngineSpec,
    consumer_spec: EngineSpec,
    preset: ConnectorPreset,
    console: Console,
    *,
    startup_timeout_s: float,
    pin: bool = True,
) -> AsyncIterator[tuple[EngineProcess, EngineProcess]]:
    """Producer and consumer started together; both stopped on every exit path. Their version and argv
    go into the run's manifest."""
    storage = str(folder.root / "kv-storage")
    producer = EngineProcess(
        role_spec(producer_spec, preset, "producer", storage),
        folder.role_log("producer"),
        startup_timeout_s=startup_timeout_s,
    )
    consumer = EngineProcess(
        role_spec(consumer_spec, preset, "consumer", storage),
        folder.role_log("consumer"),
        startup_timeout_s=startup_timeout_s,
    )
    try:
        t0 = time.perf_counter_ns()
        results = await asyncio.gather(producer.start(), consumer.start(), return_exceptions=True)
        errors = [r for r in results if isinstance(r, BaseException)]
        if errors:
            raise errors[0]
        console.print(
            f"producer {producer.base_url} + consumer {consumer.base_url} up in "
            f"{(time.perf_counter_ns() - t0) / 1e9:.1f} s "
            f"({producer.spec.kind} {producer.version or ''}, connector {preset.name})"
        )
        if pin:
            pin_engines({"producer": producer, "consumer": consumer}, console)
        manifest = folder.read_manifest()
        manifest.engine_version = producer.version
        manifest.engine_argv = {"producer": producer.argv, "consumer": consumer.argv}
        folder.write_manifest(manifest)
        yield producer, consumer
    finally:
        await asyncio.gather(producer.stop(), consumer.stop())


@contextlib.asynccontextmanager
async def alone_engine(
    folder: JobFolder, spec: EngineSpec, console: Console, *, startup_timeout_s: float, pin: bool = True
) -> AsyncIterator[EngineProcess]:
    """``spec``'s engine started alone: no connector, no peer (the uncontended baseline)."""
    spec = role_spec(spec, load_connector("none"), "producer", "")
    engine = EngineProcess(spec, folder.role_log("alone"), startup_timeout_s=startup_timeout_s)
    try:
        await engine.start()
        console.print(f"lone engine {engine.base_url} up in {engine.startup_s or 0:.1f} s (no connector)")
        if pin:
            pin_engines({"alone": engine}, console)
        yield engine
    finally:
        await engine.stop()


def pin_engines(engines: dict[str, EngineProcess], console: Console) -> None:
    """Every thread of each engine's processes onto the cores its spec binds (Linux; else nothing)."""
    if sys.platform != "linux":
        return
    for role, engine in engines.items():
        bind = engine.spec.cpu_threads_bind
        if engine.pid is not None and bind and bind != "auto":
            n = pin_group(engine.pid, parse_cores(bind))
            console.print(f"pinned {n} threads of the {role}'s processes to core(s) {bind}")


def run_pair_job(
    run: Callable[[], Coroutine[Any, Any, object]],
    console: Console,
    resume: str,
    kept: str,
    finish: Callable[[], None],
) -> int | None:
    """Run a pair job's runner to its end (the transfer benchmark, the router experiment): Ctrl-C or
    SIGTERM says how to continue and re-raises (130/143); an engine that died, an aborted pair or a
    failed write is an error line, ``kept`` (what stays stored) and the resume command, then
    ``EXIT_FAILURES``; ``finish`` (the report) runs either way. None: the runner finished."""
    try:
        asyncio.run(run())
    except (KeyboardInterrupt, Stopped):
        console.print(f"[yellow]stopped; continue with: {escape(resume)}", soft_wrap=True)
        raise
    except (PairAborted, EngineError, OSError) as exc:
        console.print(f"[red]error:[/red] {escape(str(exc))}", soft_wrap=True)
        console.print(f"{kept}; continue with: {escape(resume)}", soft_wrap=True)
        return EXIT_FAILURES
    finally:
        finish()
    return None
