"""The launcher on a stand-in engine: health wait, version, log capture, stop of the whole group."""

import dataclasses
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import pytest

from engine_harness.engines import EngineSpec
from engine_harness.launch import _LIVE, EngineProcess, EngineStartError

FAKE = str(Path(__file__).parent.parent / "fixtures" / "fake_engine.py")


def fake_engine(spec: EngineSpec, log: Path, *flags: str, **kw) -> EngineProcess:
    """An EngineProcess whose argv runs the stand-in engine instead of a real one."""
    proc = EngineProcess(spec, log, **kw)
    proc.kind = dataclasses.replace(
        proc.kind, package=None, argv=lambda s, port: [sys.executable, FAKE, "--port", str(port), *flags]
    )
    return proc


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


async def test_start_reports_version_and_stop_kills_the_group(tmp_path: Path) -> None:
    child_file = tmp_path / "child.pid"
    engine = fake_engine(EngineSpec(kind="sim"), tmp_path / "e.log", "--child-pid-file", str(child_file))
    async with engine:
        assert engine.version == "fake-1.0"
        assert engine.base_url.startswith("http://127.0.0.1:")
        assert engine.startup_s is not None and engine.startup_s > 0
        pid, child, proc = engine.pid, int(child_file.read_text()), engine.proc
        assert engine.alive() and proc in _LIVE
        # its temporary files in a scratch folder of its own, removed with it (vLLM and SGLang leave
        # their ZMQ sockets behind even on a clean stop): one is left there as they would
        assert pid is not None
        scratch = Path(psutil.Process(pid).environ()["TMPDIR"])
        # empty but for the lock this process holds on it (a later start removes it only once let go)
        assert os.listdir(scratch) == [".owner.lock"] and scratch.name.startswith("microbench-engine-")
        assert _LIVE[proc] == scratch and scratch.parent == Path(tempfile.gettempdir())
        (scratch / "0b27a7c1-a9db-4a2e-b8d2-210be1619c18").touch()
        # its own process group, our session (one autogroup: see EngineProcess._spawn)
        assert os.getpgid(pid) == pid != os.getpgid(0)
        assert os.getsid(pid) == os.getsid(0)
    assert pid is not None and _gone(pid) and _gone(child)
    assert "fake engine ready" in (tmp_path / "e.log").read_text()
    assert proc not in _LIVE  # nothing left for the atexit reaper
    assert scratch.name not in os.listdir(scratch.parent)


async def test_engine_ignoring_sigterm_is_killed_after_the_grace_period(tmp_path: Path) -> None:
    engine = fake_engine(EngineSpec(kind="sim"), tmp_path / "e.log", "--ignore-term", stop_grace_s=0.5)
    await engine.start()
    pid = engine.pid
    t0 = time.monotonic()
    await engine.stop()
    assert pid is not None and _gone(pid)
    assert time.monotonic() - t0 < 10


async def test_engine_dying_during_startup_raises_with_the_log_tail(tmp_path: Path) -> None:
    engine = fake_engine(EngineSpec(kind="sim"), tmp_path / "e.log", "--die-after", "0.2")
    with pytest.raises(EngineStartError) as err:
        await engine.start()
    msg = str(err.value)
    assert "exited with code 3 during start-up" in msg
    assert "ValueError: fake engine could not load the model" in msg  # the error line, quoted first
    assert "loading model..." in msg  # and the tail
    assert engine.proc is None


async def test_startup_timeout_is_an_error_and_reaps_the_engine(tmp_path: Path) -> None:
    engine = fake_engine(
        EngineSpec(kind="sim"), tmp_path / "e.log", "--die-after", "30", startup_timeout_s=1.0
    )
    live_before = set(_LIVE)  # a session-wide e2e engine may be running
    with pytest.raises(EngineStartError, match="not healthy after 1 s"):
        await engine.start()
    assert engine.proc is None and live_before == set(_LIVE)


async def test_busy_port_is_a_clear_error(tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        engine = fake_engine(EngineSpec(kind="sim", port=port), tmp_path / "e.log")
        with pytest.raises(EngineStartError, match=f"port {port} on 127.0.0.1 is already in use"):
            await engine.start()


async def test_restart_applies_new_settings(tmp_path: Path) -> None:
    engine = fake_engine(EngineSpec(kind="sim", chunk_size=512), tmp_path / "e.log")
    async with engine:
        first = engine.pid
        await engine.restart(engine.spec.model_copy(update={"chunk_size": 1024}))
        assert engine.spec.chunk_size == 1024 and engine.pid != first and engine.alive()
        assert first is not None and _gone(first)


def test_engine_env_drops_unlisted_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    from engine_harness.engines import engine_kind
    from engine_harness.environments import engine_env

    monkeypatch.setenv("OPENAI_API_KEY", "sk-secret")
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "9")
    env = engine_env(engine_kind("vllm"), EngineSpec(cpu_kvcache_gib=2), sys.executable)
    assert "OPENAI_API_KEY" not in env
    assert env["VLLM_CPU_KVCACHE_SPACE"] == "2"  # the spec wins over the inherited value
    # not TMPDIR (the launch gives a scratch folder) but the compile cache where PyTorch keeps it by default
    assert "TMPDIR" not in env and env["TORCHINDUCTOR_CACHE_DIR"].startswith(tempfile.gettempdir())
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", "/cache/inductor")
    assert (
        engine_env(engine_kind("vllm"), EngineSpec(), sys.executable)["TORCHINDUCTOR_CACHE_DIR"]
        == "/cache/inductor"
    )
    assert signal.SIGTERM  # keep the import honest for readers: stop uses SIGTERM then SIGKILL


def test_an_engine_in_its_own_environment_gets_that_environment_first_and_not_the_suites_path(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from engine_harness.engines import engine_kind
    from engine_harness.environments import engine_env

    monkeypatch.setenv("PYTHONPATH", "/work/suite")
    monkeypatch.setenv("PATH", "/usr/bin")
    python = "/repo/.venv-sglang/bin/python"
    env = engine_env(engine_kind("sglang"), EngineSpec(kind="sglang", python=python, device="cpu"), python)
    assert env["PATH"].split(os.pathsep)[:2] == ["/repo/.venv-sglang/bin", "/usr/bin"]
    assert env["VIRTUAL_ENV"] == "/repo/.venv-sglang" and "PYTHONPATH" not in env
    assert env["SGLANG_USE_CPU_ENGINE"] == "1"
    same = engine_env(engine_kind("vllm"), EngineSpec(), sys.executable)
    assert same["PYTHONPATH"] == "/work/suite"  # the suite's own interpreter keeps it


_HOLD = (  # a process that takes a folder's lock and keeps it
    "import filelock, sys, time; lock = filelock.FileLock(sys.argv[1]); lock.acquire(); "
    "print(1, flush=True); time.sleep(60)"
)


def test_a_scratch_folder_whose_lock_no_process_holds_is_removed_by_the_next(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from engine_harness.process_group import drop_scratch, engine_scratch

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    mine = engine_scratch()  # this process's: its engine runs
    old = time.time() - 120

    def folder(name: str, owner: str | None) -> Path:
        path = tmp_path / name
        (path / "sockets").mkdir(parents=True)
        (path / "sockets" / "0b27a7c1").touch()
        if owner is not None:  # a process took the folder's lock: exited, or still running (then returned)
            args = [sys.executable, "-c", _HOLD, str(path / ".owner.lock")]
            proc = subprocess.Popen(args, stdout=subprocess.PIPE)
            assert proc.stdout is not None and proc.stdout.readline().strip() == b"1"
            if owner == "gone":  # SIGKILLed before it could remove its engine's folder
                proc.kill()
                proc.wait()
            else:
                held.append(proc)
        os.utime(path, (old, old))
        return path

    held: list[subprocess.Popen[bytes]] = []
    try:
        gone = folder("microbench-engine-1-abcd1234", "gone")
        # another PID namespace's suite process: its id means nothing here (none has it), its lock holds
        elsewhere = folder("microbench-engine-4194304-efgh5678", "held")
        young = folder("microbench-engine-2-ijkl9012", None)  # being set up: not locked yet
        young_time = time.time()
        os.utime(young, (young_time, young_time))
        os.utime(mine, (old, old))
        other = tmp_path / "microbench-engine-notours"  # not one of ours by its name: left alone
        other.mkdir()
        new = engine_scratch()
        assert new.parent == tmp_path and new.name.startswith(f"microbench-engine-{os.getpid()}-")
        left = {p.name for p in tmp_path.iterdir()}
        assert left == {mine.name, elsewhere.name, young.name, other.name, new.name} and gone.name not in left
    finally:
        for proc in held:
            proc.kill()
            proc.wait()
    for path in (mine, new):
        drop_scratch(path)
        assert not path.exists()
    last = engine_scratch()
    assert not elsewhere.exists()  # its owner gone now, it goes
    drop_scratch(last)
