"""An engine's process group on this host: its members pinned and found stopped, its idle CPU, and the
watchdog's progress key (a real child process group where the kernel is the judge)."""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from collections.abc import Callable

import psutil
import pytest

from engine_harness.idle_cpu import IdleCpu, deprioritize_spinners, idle_cpu_between
from engine_harness.process_group import group_processes, parse_cores, pin_group, stopped_pids
from engine_harness.watchdog import progress_key


@pytest.fixture
def child_group(spawn_group: Callable[[str], int]) -> int:
    """A process group of two sleeping processes (a parent and the child it spawned); its id."""
    return spawn_group("import time; print(1, flush=True); time.sleep(60)")


def test_core_lists_parse_like_vllm_cpu_omp_threads_bind() -> None:
    assert (
        parse_cores("1") == {1} and parse_cores("0-3") == {0, 1, 2, 3} and parse_cores("0,2-3") == {0, 2, 3}
    )


@pytest.mark.skipif(sys.platform != "linux", reason="thread affinity is Linux's")
def test_every_thread_of_the_group_is_pinned_and_stopped_members_are_named(child_group: int) -> None:
    members = group_processes(child_group)
    assert len(members) == 2 and all(os.getpgid(p.pid) == child_group for p in members)
    threads = sum(len(os.listdir(f"/proc/{p.pid}/task")) for p in members)
    assert pin_group(child_group, {0}) == threads
    assert all(os.sched_getaffinity(p.pid) == {0} for p in members)
    assert stopped_pids(child_group) == [] and stopped_pids(None) == []
    os.killpg(child_group, signal.SIGSTOP)
    deadline = time.monotonic() + 10
    while len(stopped_pids(child_group)) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    states = {p.pid: psutil.Process(p.pid).status() for p in members}  # what a member not stopped was doing
    assert sorted(stopped_pids(child_group)) == sorted(p.pid for p in members), states
    os.killpg(child_group, signal.SIGCONT)
    assert all(psutil.Process(p.pid).status() != psutil.STATUS_STOPPED for p in members)


def test_idle_cpu_shares_and_progress_keys_from_hand_built_readings() -> None:
    before = {(1, 1): ("VLLM::Worker", "nixl_prog", 10.0), (1, 2): ("VLLM::Worker", "python", 5.0)}
    after = {
        (1, 1): ("VLLM::Worker", "nixl_prog", 13.5),
        (1, 2): ("VLLM::Worker", "python", 5.5),
        (1, 3): ("VLLM::Worker", "new", 9.0),
    }
    idle = idle_cpu_between("consumer", before, after, 5.0)
    assert idle.total_pct == pytest.approx(80.0) and idle.per_process_pct == {"VLLM::Worker": 80.0}
    assert next(iter(idle.top_threads_pct.items())) == ("VLLM::Worker/nixl_prog#1", 70.0)
    snap = {
        ("vllm:iteration_tokens_total_count", frozenset()): 7.0,
        ("vllm:prompt_tokens_total", frozenset({("engine", "0")})): 100.0,
        ("vllm:kv_cache_usage_perc", frozenset()): 0.5,
    }
    assert progress_key(snap) == (7.0, 100.0, 0.0, 0.0)


def test_spinning_threads_are_moved_to_sched_idle_and_quiet_ones_left_alone() -> None:
    stop = threading.Event()
    spinner = threading.Thread(target=lambda: stop.wait())
    spinner.start()
    try:
        tid = spinner.native_id
        idle = IdleCpu(
            role="consumer",
            seconds=5,
            total_pct=91.0,
            per_process_pct={"VLLM::Worker": 91.0},
            top_threads_pct={f"VLLM::Worker/VLLM::Worker#{tid}": 90.0, f"python/python#{os.getpid()}": 1.0},
        )
        assert deprioritize_spinners(idle) == [f"VLLM::Worker/VLLM::Worker#{tid}"]
        assert os.sched_getscheduler(tid) == os.SCHED_IDLE
        assert os.sched_getscheduler(os.getpid()) != os.SCHED_IDLE  # the quiet one stays as it was
    finally:
        stop.set()
        spinner.join()
