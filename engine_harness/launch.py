"""Start an engine, wait until it is healthy, capture its log, stop it on every exit path, restart it.

``EngineProcess`` is an async context manager::

    async with EngineProcess(spec, log_path) as engine:
        ... engine.base_url ...
        await engine.restart(spec.model_copy(update={"chunk_size": 4096}))

The engine runs in its own process group (in the caller's session: see ``_spawn``) bound to
``spec.host`` (127.0.0.1 by default) on a free port. Start-up races the ``/health`` poll against the
process exiting; a failure raises ``EngineStartError`` with the tail of the log. Stopping sends SIGTERM
to the whole group, then SIGKILL after a grace period; an ``atexit`` hook does the same for any engine
still alive when the interpreter leaves (Ctrl-C included), and on Linux the engine gets SIGTERM from the
kernel if the suite's process is killed outright. An engine of kind ``external`` is only reached.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from types import TracebackType

import aiohttp

from benchcore.redact import redact_argv
from engine_harness.engine_log import log_errors, log_tail
from engine_harness.engines import EngineKind, EngineSpec, auth_headers, engine_kind
from engine_harness.environments import EngineEnvError, engine_env
from engine_harness.metric_names import METRIC_TABLES, MetricNames, served_table, table_name
from engine_harness.metrics import MetricsError, scrape
from engine_harness.process_group import (
    _LIVE,
    _kill_group,
    child_preexec,
    core_text,
    drop_scratch,
    engine_scratch,
    isolation_plan,
    pin_named,
    pin_process,
)
from engine_harness.sim.params import SimConfig

__all__ = [
    "EngineError",
    "EngineProcess",
    "EngineStartError",
    "context_limit",
    "free_port",
    "log_errors",
    "log_tail",
    "model_problem",
]


class EngineError(RuntimeError):
    """An engine could not be started, reached or stopped."""


class EngineStartError(EngineError):
    """The engine exited or never became healthy during start-up; the message carries the log tail."""


def free_port(host: str = "127.0.0.1") -> int:
    """A port that was free on ``host`` a moment ago (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def _check_port_free(host: str, port: int) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((host, port))
        except OSError as exc:
            raise EngineStartError(
                f"port {port} on {host} is already in use ({exc.strerror}); pick another with --port "
                "or leave it out to get a free one"
            ) from None


def model_problem(spec: EngineSpec) -> str | None:
    """Why a launched engine cannot load ``spec.model`` from disk, or None: a model given as a path
    (absolute, ``./``, ``../``, ``~``) must be a folder holding ``config.json``. Checked before a start
    that can take minutes and then fail with the engine's own words (a hub name is the engine's business).
    """
    if not engine_kind(spec.kind).launched:
        return None
    text = spec.model
    if not (os.path.isabs(text) or text.startswith(("./", "../", "~"))):
        return None
    path = Path(text).expanduser().absolute()  # a relative folder is named as the engine would look for it
    if not path.is_dir():
        return f"model folder {path} does not exist; give an existing folder or a hub name with --model"
    if not (path / "config.json").is_file():
        return f"model folder {path} holds no config.json; is it the model's folder? (--model)"
    return None


def context_limit(spec: EngineSpec) -> tuple[int, str] | None:
    """The longest prompt + completion a launched engine of ``spec`` takes, and where that limit is set:
    ``max_model_len`` where given, else the sim's default or a local model's ``max_position_embeddings``;
    None where it cannot be told before a start (a hub name; an external engine: ask its /v1/models)."""
    if spec.max_model_len is not None:
        return spec.max_model_len, "the engine's max_model_len"
    if spec.kind == "sim":
        return int(SimConfig.model_fields["max_model_len"].default), "the sim's default max_model_len"
    config = Path(spec.model).expanduser() / "config.json"
    if not engine_kind(spec.kind).launched or not config.is_file():
        return None
    try:
        limit = json.loads(config.read_text(encoding="utf-8")).get("max_position_embeddings")
    except (OSError, ValueError, AttributeError):
        return None  # the engine's own start names a broken config
    return (limit, f"max_position_embeddings in {config}") if isinstance(limit, int) else None


class EngineProcess:
    """One engine the suite launched (or an external one it only reaches)."""

    def __init__(
        self,
        spec: EngineSpec,
        log_path: Path | None = None,
        startup_timeout_s: float = 600.0,
        stop_grace_s: float = 30.0,
    ) -> None:
        self.spec = spec
        self.kind = engine_kind(spec.kind)
        self.log_path = log_path
        self.startup_timeout_s = startup_timeout_s
        self.stop_grace_s = stop_grace_s
        self.proc: subprocess.Popen[bytes] | None = None
        self.port: int | None = None
        self.argv: list[str] = []
        self.version: str | None = None
        self.startup_s: float | None = None
        self.metrics: MetricNames = self.kind.metrics  # an external engine's: what its /metrics serves

    @staticmethod
    def kind_of(spec: EngineSpec) -> EngineKind:
        return engine_kind(spec.kind)

    @property
    def base_url(self) -> str:
        if not self.kind.launched:
            assert self.spec.url is not None
            return self.spec.url.rstrip("/")
        if self.port is None:
            raise EngineError("engine is not running")
        return f"http://{self.spec.host}:{self.port}"

    @property
    def auth_headers(self) -> dict[str, str]:
        """The bearer header for the key the spec's variable holds (read when asked, never stored)."""
        return auth_headers(self.spec.api_key_env)

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    async def __aenter__(self) -> EngineProcess:
        await self.start()
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.stop()

    async def start(self) -> None:
        """Launch (unless external), wait for /health, read the engine's version."""
        t0 = time.perf_counter_ns()
        if self.kind.launched:
            argv = self._argv()
            # The engine's own interpreter answers (its package, its parser): seconds, off the event loop.
            try:
                env = engine_env(self.kind, self.spec, argv[0])
                await asyncio.get_running_loop().run_in_executor(None, self.kind.preflight, self.spec, argv)
            except EngineEnvError as exc:
                raise EngineStartError(str(exc)) from None
            self._spawn(argv, env)
        try:
            await self._wait_healthy()
            self._pin_worker()
            self.version = await self._read_version()
            self.metrics = await self._read_metric_names()
        except BaseException:
            await self.stop()
            raise
        self.startup_s = (time.perf_counter_ns() - t0) / 1e9

    def _argv(self) -> list[str]:
        if (problem := model_problem(self.spec)) is not None:  # before a minute of engine start-up
            raise EngineStartError(problem)
        if self.spec.isolate_worker:
            try:
                isolation_plan(self.spec.cpu_threads_bind)
            except ValueError as exc:
                raise EngineStartError(str(exc)) from None
        if self.spec.port is not None:
            _check_port_free(self.spec.host, self.spec.port)
            self.port = self.spec.port
        else:
            self.port = free_port(self.spec.host)
        return self.kind.argv(self.spec, self.port)

    def _spawn(self, argv: list[str], env: dict[str, str]) -> None:
        self.argv = argv
        if self.log_path is None:
            raise EngineError("a launched engine needs log_path= to write its output to")
        host = isolation_plan(self.spec.cpu_threads_bind).host if self.spec.isolate_worker else None
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        scratch = engine_scratch()
        try:
            self.proc = self._popen(self.log_path, env | {"TMPDIR": str(scratch)}, host)
        except BaseException:
            drop_scratch(scratch)
            raise
        _LIVE[self.proc] = scratch
        if host is not None:
            # the client (this process) off the worker's cores too: on a 2-core box it otherwise lands on the
            # worker's core whenever the engine's scheduler spins on the other
            pin_process(os.getpid(), host)

    def _pin_worker(self) -> None:
        """``isolate_worker`` where the engine binds no worker of its own (``EngineKind.worker_process``):
        that process, every thread of it, onto the worker's cores, once it is up (its model loaded)."""
        name = self.kind.worker_process
        if not (self.spec.isolate_worker and name and self.proc and self.log_path):
            return
        worker = isolation_plan(self.spec.cpu_threads_bind).worker
        pinned = pin_named(self.proc.pid, name, set(worker))
        if not pinned:
            raise EngineStartError(
                f"isolate_worker: the engine is up but no process of it is named {name!r} to pin; "
                "run without isolate_worker"
            )
        with self.log_path.open("a") as log:  # the run folder says where its worker ran
            log.write(
                f"### isolate_worker: {pinned} process(es) {name!r} pinned to core(s) {core_text(worker)}\n"
            )

    def _popen(
        self, log_path: Path, env: dict[str, str], host: frozenset[int] | None
    ) -> subprocess.Popen[bytes]:
        with log_path.open("ab") as log:
            shown = " ".join(redact_argv(self.argv))  # no --api-key value in the log
            log.write(f"\n### {time.strftime('%Y-%m-%dT%H:%M:%S')} starting: {shown}\n".encode())
            log.flush()
            return subprocess.Popen(
                self.argv,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
                # Its own process group (one killpg stops it all; a terminal's Ctrl-C does not reach it)
                # but *our session*: Linux's autogroup scheduler puts every session in its own task
                # group, and vLLM's EngineCore spins on sched_yield() while its worker computes, which
                # only yields within its group. In a new session that spinner starved the client's
                # thread on the shared core for up to 7 s (measured: run-queue wait = the stall), so
                # hundreds of decode tokens reached the client in one read. In one session it does not.
                process_group=0,
                preexec_fn=child_preexec(host) if sys.platform == "linux" else None,
            )

    async def _wait_healthy(self) -> None:
        deadline = time.monotonic() + self.startup_timeout_s
        url = f"{self.base_url}/health"
        async with aiohttp.ClientSession() as session:
            while True:
                if self.proc is not None and self.proc.poll() is not None:
                    raise EngineStartError(
                        f"{self.spec.kind} engine exited with code {self.proc.returncode} during start-up; "
                        f"last lines of {self.log_path}:\n{self._tail()}"
                    )
                with contextlib.suppress(aiohttp.ClientError, TimeoutError):
                    async with session.get(url, timeout=aiohttp.ClientTimeout(total=5)) as resp:
                        if resp.status == 200:
                            return
                if time.monotonic() > deadline:
                    raise EngineStartError(self._not_healthy())
                await asyncio.sleep(0.5)

    def _not_healthy(self) -> str:
        if not self.kind.launched:
            return (
                f"nothing answered at {self.base_url}/health for {self.startup_timeout_s:.0f} s: is the "
                "external engine running, and is its URL right?"
            )
        return (
            f"{self.spec.kind} engine at {self.base_url} not healthy after {self.startup_timeout_s:.0f} s "
            f"(a slow start needs a longer start timeout); last lines of {self.log_path}:\n{self._tail()}"
        )

    def _tail(self) -> str:
        if not self.log_path:
            return "(no log: external engine)"
        errors = log_errors(self.log_path)
        head = "errors in the log:\n  " + "\n  ".join(errors) + "\n" if errors else ""
        return head + log_tail(self.log_path)

    async def _read_metric_names(self) -> MetricNames:
        """The kind's metric table; for a kind whose names are read off the engine (``external``), the
        table whose names its /metrics serves (the kind's when /metrics does not answer)."""
        if not self.kind.metrics_from_engine:
            return self.kind.metrics
        async with aiohttp.ClientSession(headers=self.auth_headers) as session:
            try:
                snapshot = await scrape(session, self.base_url)
            except MetricsError:
                return self.kind.metrics
        return METRIC_TABLES[served_table(snapshot.names(), default=table_name(self.kind.metrics))]

    async def _read_version(self) -> str | None:
        if not self.kind.version_path:
            return None
        async with aiohttp.ClientSession(headers=self.auth_headers) as session:
            try:
                async with session.get(
                    f"{self.base_url}{self.kind.version_path}", timeout=aiohttp.ClientTimeout(total=10)
                ) as resp:
                    if resp.status != 200:
                        return None
                    body = await resp.json(content_type=None)
            except (aiohttp.ClientError, TimeoutError, ValueError):
                return None
        version = body.get("version") if isinstance(body, dict) else None
        return str(version) if version is not None else None

    def alive(self) -> bool:
        """True while a launched engine's process runs (external engines: always True; see ``responsive``)."""
        return not self.kind.launched or (self.proc is not None and self.proc.poll() is None)

    async def responsive(self, timeout_s: float = 30.0) -> bool:
        """Whether the engine answers ``/health`` within ``timeout_s`` (polled every 0.5 s).

        A launched engine whose process has exited is not (checked on every poll, so a process still
        exiting is seen as dead once it is gone, not as alive because it was not gone yet); an external
        engine is probed over HTTP like any other, so one that stopped answering is noticed.
        """
        if self.kind.launched and self.proc is None:
            return False
        deadline = time.monotonic() + timeout_s
        async with aiohttp.ClientSession() as session:
            while True:
                if self.kind.launched and not self.alive():
                    return False
                with contextlib.suppress(aiohttp.ClientError, TimeoutError):
                    async with session.get(
                        f"{self.base_url}/health", timeout=aiohttp.ClientTimeout(total=5)
                    ) as resp:
                        if resp.status == 200:
                            return True
                if time.monotonic() > deadline:
                    return False
                await asyncio.sleep(0.5)

    async def wait_exit(self) -> int | None:
        """Until a launched engine's process exits by itself; its exit code (None: not launched)."""
        proc = self.proc
        if proc is None:
            return None
        return await asyncio.get_running_loop().run_in_executor(None, proc.wait)

    async def stop(self) -> None:
        """TERM the process group, KILL it after the grace period; safe to call twice."""
        proc, self.proc = self.proc, None
        if proc is not None:
            await asyncio.get_running_loop().run_in_executor(None, _kill_group, proc, self.stop_grace_s)

    async def restart(self, spec: EngineSpec | None = None) -> None:
        """Stop and start again, optionally with new settings (e.g. another chunk size)."""
        await self.stop()
        if spec is not None:
            self.spec = spec
            self.kind = engine_kind(spec.kind)
        self.port = None
        await self.start()
