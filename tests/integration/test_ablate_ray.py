"""``python -m microbench.ablate --executor ray`` on a local Ray instance against the sim engine (issue #39):
a 2-arm ablation whose arms run side by side (a core each on this 2-core box) stores the same records as
the local, counterbalanced one; a shard whose Ray task is killed mid-round loses nothing it stored, and
``--resume`` completes the ablation measuring only what was missing."""

from __future__ import annotations

import datetime as dt
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import pytest
import yaml

from microbench.ablate.cli import main
from microbench.results.records import Observation, RunRecord, read_record

pytest.importorskip("ray")
pytestmark = [pytest.mark.integration, pytest.mark.clock]  # reads the clock: the clock pass

STEP_A = ["--alpha-ms", "4", "--beta-d-ms", "0.2", "--beta-c-ms", "0.02", "--gamma-ns", "20"]
STEP_B = ["--alpha-ms", "5.2", "--beta-d-ms", "0.26", "--beta-c-ms", "0.026", "--gamma-ns", "26"]
RAY = ["--executor", "ray", "--shard-cpus", "1"]  # both arms at once on this 2-core box, a core each


def _ablation(tmp: Path, prefills: list[int]) -> Path:
    data = {
        "name": "sim-ray",
        "grid": {
            "chunks": [512],
            "decode_batch_sizes": [0, 4],
            "prefill_tokens": prefills,
            "repetitions": 1,
            "decode_context": 256,
            "engine": {"kind": "sim", "extra_args": STEP_A},
        },
        "arms": {"A": {}, "B": {"extra_args": STEP_B}},
        "rounds": 2,
    }
    path = tmp / "ablation.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def _records(run: Path) -> set[str]:
    return {p.relative_to(run).as_posix() for p in (run / "arms").rglob("runs/*/*.json")}


def _manifest(path: Path) -> dict:
    return json.loads(path.read_text())


def _span(shard: dict) -> tuple[float, float]:
    start = dt.datetime.fromisoformat(shard["started_utc"]).timestamp()
    return start, start + shard["wall_s"]


def test_a_ray_ablation_runs_its_arms_side_by_side_and_equals_the_local_one(
    tmp_path: Path, tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)  # nothing may be written outside --out
    home = tmp_path_factory.mktemp("home")  # nor in the home folder (Ray's token: ~/.ray/auth_token)
    monkeypatch.setenv("HOME", str(home))
    for name in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH"):  # Ray sets the mode: undone
        monkeypatch.delenv(name, raising=False)
    made: list[str] = []  # the local Ray instance's session folder: not Ray's /tmp/ray, and gone with it
    mkdtemp = tempfile.mkdtemp
    monkeypatch.setattr(tempfile, "mkdtemp", lambda *a, **kw: made.append(mkdtemp(*a, **kw)) or made[-1])
    path = _ablation(tmp_path, [256, 2048])
    local, ray = tmp_path / "out" / "local", tmp_path / "out" / "ray"
    assert main(["--config", str(path), "--out", str(local)]) == 0
    assert main(["--config", str(path), "--out", str(ray), *RAY]) == 0
    sessions = [m for m in made if Path(m).name.startswith("microbench-ray-")]
    assert len(sessions) == 1 and not Path(sessions[0]).exists()
    assert not any(home.iterdir()) and "RAY_AUTH_TOKEN_PATH" not in os.environ
    assert _records(ray) == _records(local) and len(_records(ray)) == 2 * 2 * 4  # arms × rounds × points
    assert (ray / "compare-B-vs-A" / "comparison.json").is_file()
    notes_ray = _manifest(ray / "manifest.json")["notes"]
    assert any("side by side" in n and "simultaneity, not by order" in n for n in notes_ray), notes_ray
    assert any("in turn" in n and "by order" in n for n in _manifest(local / "manifest.json")["notes"])
    shards = {arm: _manifest(ray / "arms" / arm / "manifest.json")["shards"] for arm in ("A", "B")}
    for arm, runs in shards.items():  # one execution per round, each on a core of its own
        assert len(runs) == 2, arm
        for s in runs:
            assert s["executor"] == "ray" and s["outcome"] == "done" and s["points"] == 4
            assert s["cores_exclusive"] and len(s["cores"]) == 1 and s["node_id"]
            assert s["device"].startswith("CPU cores")
    for a, b in zip(shards["A"], shards["B"], strict=True):  # a round's arms at once: never on one core
        (a0, a1), (b0, b1) = _span(a), _span(b)
        if a0 <= b1 and b0 <= a1:
            assert a["cores"] != b["cores"]
    for arm in ("A", "B"):  # the local run records its placement too: in turn, the whole machine
        runs = _manifest(local / "arms" / arm / "manifest.json")["shards"]
        assert [s["executor"] for s in runs] == ["local", "local"]
    for p in (ray / "arms").rglob("runs/*/*.json"):  # every record names its arm's run
        assert read_record(p, RunRecord).run_id == p.parents[2].name
    assert set(os.listdir(tmp_path)) == {"ablation.yaml", "out"}  # nothing written beside --out


def _worker_of(arm: Path, points: int, proc: subprocess.Popen[str]) -> int:
    """The pid of the Ray worker measuring ``arm`` once ``points`` of its records are stored."""
    deadline = time.monotonic() + 120
    while True:
        assert proc.poll() is None and time.monotonic() < deadline, "the ablation ended before the kill"
        try:
            running = [s for s in _manifest(arm / "manifest.json")["shards"] if s["outcome"] == "running"]
        except (OSError, ValueError):
            running = []
        if running and len(list((arm / "runs").rglob("*.json"))) >= points:
            return int(running[0]["pid"])
        time.sleep(0.05)


def test_a_killed_arm_shard_loses_nothing_and_resume_completes_the_ablation(tmp_path: Path) -> None:
    path = _ablation(tmp_path, [256, 1024, 2048])  # 6 points per arm and round
    run = tmp_path / "run"
    cmd = [sys.executable, "-m", "microbench.ablate", "--config", str(path), "--out", str(run), *RAY]
    proc = subprocess.Popen(cmd, text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    pid = _worker_of(run / "arms" / "B", 2, proc)
    engines = psutil.Process(pid).children(recursive=True)
    os.kill(pid, signal.SIGKILL)  # B's Ray task is lost mid-round, its worker with no chance to clean up
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 1, out[-3000:]
    assert "1 of 2 shard(s) did not finish" in out and "--resume" in out
    _, alive = psutil.wait_procs(engines, timeout=15)
    assert not alive, "the killed shard's engine outlived it"
    arm_a, arm_b = run / "arms" / "A", run / "arms" / "B"
    assert len(list((arm_a / "runs").rglob("*.json"))) == 6  # A finished its round-1 shard
    before = {p.name: read_record(p, RunRecord).t_inject_ns for p in (arm_b / "runs").rglob("*.json")}
    assert 2 <= len(before) < 6
    observed_before = {p.relative_to(run).as_posix() for p in run.rglob("observed/*/*.json")}
    assert all(read_record(run / rel, Observation) for rel in observed_before)  # every one whole

    code = main(["--resume", "--out", str(run), *RAY])
    assert code == 0
    after = {p.name: read_record(p, RunRecord).t_inject_ns for p in (arm_b / "runs").rglob("*.json")}
    assert len(after) == 12 and all(after[name] == t for name, t in before.items())  # kept, not redone
    assert len(list((arm_a / "runs").rglob("*.json"))) == 12
    observed_after = {p.relative_to(run).as_posix() for p in run.rglob("observed/*/*.json")}
    assert observed_before <= observed_after  # nothing lost
    b_runs = [(s["outcome"].split(":")[0], s["points"]) for s in _manifest(arm_b / "manifest.json")["shards"]]
    assert b_runs[0][0] == "failed" and [o for o, _ in b_runs[1:]] == ["done", "done"]
    assert sum(points for _, points in b_runs) == 12  # nothing measured twice
    a_runs = [(s["outcome"], s["points"]) for s in _manifest(arm_a / "manifest.json")["shards"]]
    assert a_runs == [("done", 6), ("done", 6)]  # A's finished round-1 shard was not submitted again
    assert (run / "compare-B-vs-A" / "comparison.json").is_file()
