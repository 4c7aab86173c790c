"""An isolated worker (``isolate_worker``): its core plan, the engine's environment and start-up affinity."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable

import pytest
from pydantic import ValidationError

from engine_harness import process_group
from engine_harness.engines import EngineSpec
from engine_harness.process_group import (
    CorePlan,
    child_preexec,
    group_processes,
    isolation_plan,
    pin_named,
    pin_process,
)
from engine_harness.sglang_kind import sglang_env
from engine_harness.vllm_kind import vllm_env


@pytest.fixture
def cores(monkeypatch: pytest.MonkeyPatch) -> None:
    """A 4-core process, whatever this box has."""
    monkeypatch.setattr(process_group, "_allowed_cores", lambda: frozenset({0, 1, 2, 3}))


def test_the_worker_takes_every_core_but_the_last_unless_bound(cores: None) -> None:
    assert isolation_plan(None) == CorePlan(frozenset({0, 1, 2}), frozenset({3}))
    assert isolation_plan("auto") == isolation_plan(None)
    assert isolation_plan("1-2") == CorePlan(frozenset({1, 2}), frozenset({0, 3}))


@pytest.mark.parametrize("bind", ["0-3", "2,7"])
def test_a_plan_without_a_core_for_the_rest_or_outside_the_box_is_refused(cores: None, bind: str) -> None:
    with pytest.raises(ValueError, match="isolate_worker needs"):
        isolation_plan(bind)


def test_the_engine_is_told_the_worker_cores(cores: None) -> None:
    env = vllm_env(EngineSpec(kind="vllm", isolate_worker=True, cpu_threads_bind="0,2"))
    assert env["VLLM_CPU_OMP_THREADS_BIND"] == "0,2"
    assert vllm_env(EngineSpec(kind="vllm", isolate_worker=True))["VLLM_CPU_OMP_THREADS_BIND"] == "0-2"
    assert "VLLM_CPU_OMP_THREADS_BIND" not in vllm_env(EngineSpec(kind="vllm"))


def test_only_a_kind_with_a_worker_to_pin_takes_it(cores: None) -> None:
    with pytest.raises(ValidationError, match="isolate_worker is for vLLM's and SGLang's"):
        EngineSpec(kind="sim", isolate_worker=True)
    # SGLang binds no threads here: the suite pins its scheduler, whose torch pool gets a thread per core
    assert sglang_env(EngineSpec(kind="sglang", isolate_worker=True))["OMP_NUM_THREADS"] == "3"
    assert "OMP_NUM_THREADS" not in sglang_env(EngineSpec(kind="sglang"))


@pytest.mark.skipif(sys.platform != "linux" or len(os.sched_getaffinity(0)) < 2, reason="Linux, ≥ 2 cores")
def test_the_engines_processes_start_on_the_host_cores() -> None:
    preexec = child_preexec(isolation_plan(None).host)
    code = "import os; print(sorted(os.sched_getaffinity(0)))"
    out = subprocess.run([sys.executable, "-c", code], preexec_fn=preexec, capture_output=True, text=True)
    assert out.stdout.strip() == str(sorted(isolation_plan(None).host))


@pytest.mark.skipif(sys.platform != "linux" or len(os.sched_getaffinity(0)) < 2, reason="Linux, ≥ 2 cores")
def test_pinning_a_process_pins_the_threads_it_already_has() -> None:
    code = (
        "import threading, time; threading.Thread(target=time.sleep, args=(30,)).start(); "
        "print(1, flush=True); time.sleep(30)"
    )
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)
    try:
        assert child.stdout is not None and child.stdout.readline()  # its second thread runs
        last = max(os.sched_getaffinity(0))
        assert pin_process(child.pid, {last}) >= 2
        tids = os.listdir(f"/proc/{child.pid}/task")
        assert len(tids) >= 2 and all(os.sched_getaffinity(int(t)) == {last} for t in tids)
    finally:
        child.kill()
        child.wait()


@pytest.mark.skipif(sys.platform != "linux" or len(os.sched_getaffinity(0)) < 2, reason="Linux, ≥ 2 cores")
def test_the_named_worker_of_a_group_is_pinned_and_the_rest_left(spawn_group: Callable[[str], int]) -> None:
    """SGLang's scheduler, as its process title names it (the kernel keeps 15 characters of it)."""
    pgid = spawn_group(  # the worker names itself and starts a second thread, then says it is ready
        "import ctypes, threading, time; ctypes.CDLL(None).prctl(15, b'sglang::scheduler', 0, 0, 0); "
        "threading.Thread(target=time.sleep, args=(60,)).start(); print(1, flush=True); time.sleep(60)"
    )
    last = max(os.sched_getaffinity(0))
    assert pin_named(pgid, "sglang::scheduler", {last}) == 1
    assert pin_named(pgid, "sglang::detokenizer", {last}) == 0
    named = [p for p in group_processes(pgid) if p.pid != pgid]
    tids = os.listdir(f"/proc/{named[0].pid}/task")
    assert len(tids) >= 2 and all(os.sched_getaffinity(int(t)) == {last} for t in tids)
    assert os.sched_getaffinity(pgid) == os.sched_getaffinity(0)  # the parent keeps its cores
