"""Helpers of the fault tier: the outcome of one command and the checks every fault row makes."""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import pytest
import yaml

from engine_harness.launch import free_port
from microbench.results.records import Observation, RunRecord, read_record

__all__ = [
    "ISSUE_GRID",
    "STEP_ARGS",
    "Outcome",
    "Place",
    "assert_clear_error",
    "assert_intact",
    "assert_no_engine_left",
    "fill_disk",
    "remount",
    "stalled_observations",
    "start_sim",
]

STEP_ARGS = ["--alpha-ms", "4", "--beta-d-ms", "0.2", "--beta-c-ms", "0.02", "--gamma-ns", "20"]
# The grid of the issue's first row: one chunk, D = 4, two prefill lengths, six repetitions.
ISSUE_GRID = {
    "chunks": [512],
    "decode_batch_sizes": [4],
    "prefill_tokens": [256, 1024],
    "repetitions": 6,
    "decode_context": 512,
}


@dataclass
class Outcome:
    code: int
    out: str
    err: str

    @property
    def text(self) -> str:
        return self.out + self.err


@dataclass
class Place:
    """A test's folders: ``cwd`` (the working directory, must stay empty) and ``tmp`` (inputs)."""

    tmp: Path
    cwd: Path

    def sweep_yaml(
        self, sim_args: list[str] | tuple[str, ...] = (), name: str = "sweep.yaml", **over: object
    ) -> Path:
        sweep = ISSUE_GRID | {"engine": {"kind": "sim", "extra_args": [*STEP_ARGS, *sim_args]}} | over
        path = self.tmp / name
        path.write_text(yaml.safe_dump(sweep))
        return path


def assert_clear_error(outcome: Outcome, *needles: str) -> None:
    """One error paragraph naming the problem (each needle), never a traceback."""
    text = outcome.text
    assert "Traceback" not in text and "crash-traceback" not in text, text[-3000:]
    start = text.find("error: ")
    assert start >= 0, text[-3000:]
    paragraph = text[start:].split("\n\n")[0]
    flat = " ".join(paragraph.split())  # rich wraps long lines; compare words
    for needle in needles:
        assert " ".join(needle.split()) in flat, (needle, paragraph)


def assert_intact(run_dir: Path) -> list[RunRecord]:
    """Every record and observation readable, every valid record's stamps present, no temp file left,
    no crash traceback; returns the point records."""
    temporary = [p for p in run_dir.rglob("*") if p.name.startswith(".") or ".tmp" in p.suffixes]
    leftovers = [p for p in temporary if p.name != ".lock"]
    assert not leftovers, leftovers
    assert not (run_dir / "crash-traceback.txt").exists()
    if (run_dir / "manifest.json").exists():
        json.loads((run_dir / "manifest.json").read_text())
    for path in run_dir.glob("observed/*/*.json"):
        read_record(path, Observation)
    records = [read_record(p, RunRecord) for p in sorted(run_dir.glob("runs/*/*.json"))]
    for r in records:
        if r.validity.valid:
            assert (run_dir / r.raw_file).is_file(), r.raw_file
    return records


def assert_no_engine_left() -> None:
    """No engine process of this test outlived the command."""
    children = psutil.Process().children(recursive=True)
    _, alive = psutil.wait_procs(children, timeout=15)
    assert not alive, [p.cmdline() for p in alive]


def start_sim(*flags: str, env: dict[str, str] | None = None) -> tuple[subprocess.Popen[bytes], str]:
    """A sim engine started by hand with ``flags`` (and ``env`` added to its environment), once it
    answers /health: its process and URL."""
    port = free_port()
    cmd = [sys.executable, "-m", "engine_harness.sim", "--model", "sim", "--port", str(port), *STEP_ARGS]
    environ = {**os.environ, **(env or {})}
    proc = subprocess.Popen([*cmd, *flags], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=environ)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while True:
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=1):
                return proc, url
        except (urllib.error.URLError, OSError):
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.1)


class _FullDisk:
    """A file on a full disk: a write puts half its bytes down, then fails as write(2) does (ENOSPC)."""

    def __init__(self, f: Any) -> None:
        self.f = f

    def write(self, data: bytes) -> int:
        self.f.write(data[: len(data) // 2])
        self.f.flush()
        raise OSError(errno.ENOSPC, "No space left on device")

    def __getattr__(self, name: str) -> Any:
        return getattr(self.f, name)

    def __enter__(self) -> _FullDisk:
        return self

    def __exit__(self, *exc: object) -> None:
        self.f.close()


def fill_disk(monkeypatch: pytest.MonkeyPatch, full: Callable[[Path], bool]) -> None:
    """From now on the disk is full for every file opened for writing whose path ``full`` says: the
    write itself fails (half written), not fsync. (No root here for a real small filesystem.)"""
    real = os.fdopen

    def fdopen(fd: int, *args: Any, **kwargs: Any) -> Any:
        f = real(fd, *args, **kwargs)
        target = Path(os.readlink(f"/proc/self/fd/{fd}"))
        writing = "w" in str(args[0] if args else kwargs.get("mode", "r"))
        return _FullDisk(f) if writing and full(target) else f

    monkeypatch.setattr(os, "fdopen", fdopen)


def remount(mnt: Path, opts: str) -> None:
    """Change a mounted test filesystem (``small_fs``), e.g. ``size=64m`` (space freed) or ``ro``."""
    subprocess.run(["mount", "-o", f"remount,{opts}", str(mnt)], check=True)


def stalled_observations(out: Path) -> list[Observation]:
    """The stored attempts of the run in ``out`` whose engine steps hold a stall (a step over 2.5 s: one
    of ``frozen_sweep``'s 3 s freezes)."""
    observations = (read_record(p, Observation) for p in out.glob("observed/*/*.json"))
    return [o for o in observations if any((s.elapsed_ms or 0) > 2500 for s in o.engine_steps or [])]


def frozen_sweep(
    cfg: Path, out: Path, freeze_after: tuple[int, ...], timeout_s: float, until_stalled: bool = False
) -> None:
    """Run the sweep of ``cfg`` into ``out`` as a subprocess and freeze its engine (SIGSTOP, 3 s, SIGCONT)
    just inside the next point after each count of stored points; asserts exit 0. ``until_stalled``: no
    more freezes once an attempt's observation holds a stalled step. A freeze 0.3 s after a stored point
    can miss every observation (the sweep still storing that point, or waiting out its next attempt's
    steady state), so a test that needs one landed freeze gives several counts and this stops at the first
    that landed."""
    cmd = [sys.executable, "-m", "microbench.sweep", "--config", str(cfg), "--out", str(out)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    for n_done in freeze_after:
        deadline = time.monotonic() + 120
        while len(list(out.glob("runs/*/*.json"))) < n_done:
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.01)
        if until_stalled and stalled_observations(out):
            break
        time.sleep(0.3)  # inside the next point
        (engine,) = psutil.Process(proc.pid).children()
        os.killpg(engine.pid, signal.SIGSTOP)
        time.sleep(3.0)
        os.killpg(engine.pid, signal.SIGCONT)
    text, _ = proc.communicate(timeout=timeout_s)
    assert proc.returncode == 0, text[-3000:]
