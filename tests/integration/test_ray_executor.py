"""``--executor ray`` on a local Ray instance against the sim engine (issue #39): a sweep split into two
shards that run at once on cores of their own equals the sequential run, as do two shards of one chunk
size and a characterization's search and configurations; a worker running other code than the driver
measures nothing; a shard whose Ray task is killed mid-run loses nothing it stored, and ``--resume``
measures only what it had left."""

from __future__ import annotations

import datetime as dt
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import psutil
import pytest
import yaml

from microbench.results.records import Observation, RunRecord, read_record
from microbench.sweep.cli import main

pytest.importorskip("ray")
pytestmark = [pytest.mark.integration, pytest.mark.clock]  # reads the clock: the clock pass

STEP_ARGS = ["--alpha-ms", "4", "--beta-d-ms", "0.2", "--beta-c-ms", "0.02", "--gamma-ns", "20"]
RAY = ["--executor", "ray", "--shard-cpus", "1"]  # two shards at once on this 2-core box, a core each


def _sweep_file(tmp_path: Path, prefills: list[int]) -> Path:
    sweep = {
        "chunks": [512, 1024],
        "decode_batch_sizes": [0, 4],
        "prefill_tokens": prefills,
        "repetitions": 1,  # the executor is under test: one of each point (CI time)
        "decode_context": 256,
        "engine": {"kind": "sim", "extra_args": STEP_ARGS},
    }
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump(sweep))
    return path


def _files(run: Path, sub: str) -> set[str]:
    return {p.relative_to(run).as_posix() for p in (run / sub).rglob("*") if p.is_file()}


def _manifest(run: Path) -> dict:
    return json.loads((run / "manifest.json").read_text())


@pytest.fixture(scope="module")
def ray_instance():
    """One local Ray instance for the in-process runs of this module (the executor joins a running one and
    leaves it running): a start and a stop (≈4 s) for all of them."""
    from microbench.executors.ray import local_instance

    with local_instance():  # its session and token in a scratch folder, removed after (not /tmp/ray, ~/.ray)
        yield


def test_a_ray_sweep_of_two_shards_equals_the_sequential_run(
    tmp_path: Path, monkeypatch, ray_instance
) -> None:
    monkeypatch.chdir(tmp_path)  # nothing may be written outside --out
    sweep = _sweep_file(tmp_path, [256, 2048])
    seq, par = tmp_path / "out" / "seq", tmp_path / "out" / "ray"
    assert main(["--config", str(sweep), "--out", str(seq)]) == 0
    assert main(["--config", str(sweep), "--out", str(par), *RAY]) == 0
    for sub in ("runs", "telemetry"):  # decode batches and retries may differ between two runs
        assert _files(par, sub) == _files(seq, sub), sub
    assert len(_files(par, "runs")) == 8
    for path in (par / "runs").rglob("*.json"):  # every record's inputs came along with it
        record = read_record(path, RunRecord)
        assert record.validity.valid and record.run_id == "ray"
        obs = par / "observed" / path.parent.name / f"{path.stem}_a{record.validity.attempt}.json"
        observed = read_record(obs, Observation)
        for rel in (observed.raw_file, observed.metrics_file, observed.baseline_file):
            assert rel is None or (par / rel).is_file(), rel
    assert {p.name for p in par.glob("engine-*.log")} == {"engine-512.log", "engine-1024.log"}
    a, b = pd.read_csv(seq / "interference_table.csv"), pd.read_csv(par / "interference_table.csv")
    assert list(a.columns) == list(b.columns) and (a.dtypes == b.dtypes).all()
    keys = ["chunk_size", "decode_batch_size", "new_prefill_tokens", "repetitions"]
    assert a[keys].equals(b[keys])
    m_seq, m_par = _manifest(seq), _manifest(par)
    assert m_par["engine_argv"].keys() == m_seq["engine_argv"].keys() == {"512", "1024"}
    assert m_par["warmup"].keys() == {"512", "1024"} and m_par["engine_version"] == m_seq["engine_version"]
    shards = {s["chunk"]: s for s in m_par["shards"]}
    assert shards.keys() == {512, 1024}
    for s in shards.values():
        assert s["executor"] == "ray" and s["outcome"] == "done" and s["points"] == 4
        assert s["cores_exclusive"] and len(s["cores"]) == 1 and s["engine_version"].startswith("sim")
        assert s["node_id"] and s["wall_s"] > 0 and s["device"].startswith("CPU cores")
        assert s["code"] == s["driver_code"] and " @ " in s["code"]  # the worker ran the driver's code
    spans = [(dt.datetime.fromisoformat(s["started_utc"]).timestamp(), s["wall_s"]) for s in shards.values()]
    (t0, w0), (t1, w1) = spans
    if t0 <= t1 + w1 and t1 <= t0 + w0:  # they ran at once (the usual case): never on one core
        assert shards[512]["cores"] != shards[1024]["cores"]
    assert all(s["executor"] == "local" and s["outcome"] == "done" for s in m_seq["shards"])
    token = Path.home() / ".ray" / "auth_token"  # Ray's token never reaches a run folder
    if token.is_file() and (secret := token.read_bytes().strip()):
        assert not [p for p in par.rglob("*") if p.is_file() and secret in p.read_bytes()]
    assert set(os.listdir(tmp_path)) == {"sweep.yaml", "out"}  # nothing written beside --out


def _same_run(seq: Path, par: Path) -> None:
    """``par`` holds the records and table ``seq`` holds, every record valid and of ``par``'s run."""
    assert _files(par, "runs") == _files(seq, "runs")
    for path in (par / "runs").rglob("*.json"):
        record = read_record(path, RunRecord)
        assert record.validity.valid and record.run_id == par.name
    a, b = pd.read_csv(seq / "interference_table.csv"), pd.read_csv(par / "interference_table.csv")
    assert list(a.columns) == list(b.columns) and (a.dtypes == b.dtypes).all()
    keys = ["chunk_size", "decode_batch_size", "new_prefill_tokens", "repetitions"]
    assert a[keys].equals(b[keys])


def test_two_shards_of_one_chunk_size_merge_into_the_sequential_run(tmp_path: Path, ray_instance) -> None:
    sweep = yaml.safe_load(_sweep_file(tmp_path, [256, 2048]).read_text())
    sweep.update(chunks=[512], decode_batch_sizes=[0, 2, 4])
    (tmp_path / "one.yaml").write_text(yaml.safe_dump(sweep))
    seq, par = tmp_path / "seq", tmp_path / "split"
    assert main(["--config", str(tmp_path / "one.yaml"), "--out", str(seq)]) == 0
    assert main(["--config", str(tmp_path / "one.yaml"), "--out", str(par), *RAY, "--shards", "2"]) == 0
    _same_run(seq, par)
    assert len(_files(par, "runs")) == 6
    shards = {s["part"]: s for s in _manifest(par)["shards"]}
    assert shards.keys() == {"D2", "D0_4"}  # D 0's bare prefills ride with the smaller group
    assert all(s["chunk"] == 512 and s["outcome"] == "done" for s in shards.values())
    assert shards["D2"]["points"] == 2 and shards["D0_4"]["points"] == 4
    # each part's engine has a log of its own; the sequential run's one engine, one log
    assert {p.name for p in par.glob("engine-*.log")} == {"engine-512-D2.log", "engine-512-D0_4.log"}
    assert {p.name for p in seq.glob("engine-*.log")} == {"engine-512.log"}
    assert [s["part"] for s in _manifest(seq)["shards"]] == [None]  # local: one shard per chunk size


def test_a_worker_running_other_code_than_the_driver_fails_its_shard_before_any_engine(
    tmp_path: Path, monkeypatch, ray_instance
) -> None:
    from microbench.executors import ray as ray_executor

    # the driver's view faked; the Ray workers are other processes and see this checkout as it is
    monkeypatch.setattr(ray_executor, "running_code", lambda: "pd-interference-bench 0.1.0 @ 0000000")
    run = tmp_path / "run"
    assert main(["--config", str(_sweep_file(tmp_path, [256])), "--out", str(run), *RAY]) == 1
    shards = _manifest(run)["shards"]
    assert len(shards) == 2 and not list(run.glob("engine-*.log")) and not (run / "runs").exists()
    for s in shards:
        assert s["driver_code"].endswith("@ 0000000") and s["code"] != s["driver_code"]
        assert s["outcome"].startswith("failed: ") and "runs other code than the driver" in s["outcome"]


CHARACTERIZE = Path(__file__).resolve().parents[2] / "sweeps" / "characterize" / "sim-memory.yaml"
SMALL_RUN = ["--range", "35903:35906", "--initial", "35903", "--configs", "found,default", "--users", "1,2"]
SMALL_RUN += ["--level-duration", "1s", "--max-level-duration", "1s"]


def test_a_characterization_on_ray_equals_the_sequential_run(tmp_path: Path, ray_instance) -> None:
    from microbench.characterize.cli import main as characterize

    seq, par = tmp_path / "seq", tmp_path / "ray"
    assert characterize(["--config", str(CHARACTERIZE), "--out", str(seq), *SMALL_RUN]) == 0
    assert characterize(["--config", str(CHARACTERIZE), "--out", str(par), *SMALL_RUN, *RAY]) == 0
    for sub in ("search", "levels", "raw", "engines"):  # the search's probes alike, each level's stamps
        assert _files(par, sub) == _files(seq, sub), sub
    assert json.loads((par / "search" / "search.json").read_text())["found"] == 35904
    a, b = pd.read_parquet(seq / "rows.parquet"), pd.read_parquet(par / "rows.parquet")
    assert list(a.columns) == list(b.columns) and (a.dtypes == b.dtypes).all()
    keys = ["config", "users", "budget", "max_num_seqs", "engine", "device"]
    assert (
        a[keys]
        .sort_values(keys[:2], ignore_index=True)
        .equals(b[keys].sort_values(keys[:2], ignore_index=True))
    )
    assert len(b) == 4 and (b["run_id"] == "ray").all() and (b["succeeded"] > 0).all()
    shards = {s["part"]: s for s in _manifest(par)["shards"]}
    assert shards.keys() == {"search", "found", "default"}
    assert shards["found"]["chunk"] == 35904 and shards["found"]["points"] == 2  # levels, for a sweep
    for s in shards.values():
        assert s["executor"] == "ray" and s["outcome"] == "done" and s["code"] == s["driver_code"]
        assert len(s["cores"]) == 1 and s["engine_version"].startswith("sim")
    assert {s["part"] for s in _manifest(seq)["shards"]} == {"search", "found", "default"}
    assert set(os.listdir(tmp_path)) == {"seq", "ray"}


def _worker_of(run: Path, chunk: int, points: int, proc: subprocess.Popen[str]) -> int:
    """The pid of the Ray worker measuring ``chunk`` once ``points`` of its records are in the run folder."""
    deadline = time.monotonic() + 120
    while True:
        assert proc.poll() is None and time.monotonic() < deadline, "the sweep ended before the kill"
        try:
            shards = [
                s for s in _manifest(run)["shards"] if s["chunk"] == chunk and s["outcome"] == "running"
            ]
        except (OSError, ValueError):
            shards = []
        if shards and len(list((run / "runs" / str(chunk)).glob("*.json"))) >= points:
            return int(shards[0]["pid"])
        time.sleep(0.05)


def test_a_killed_shard_task_loses_nothing_and_resume_measures_only_its_missing_points(
    tmp_path: Path,
) -> None:
    sweep = _sweep_file(tmp_path, [256, 1024, 2048])  # 6 points per shard
    run = tmp_path / "run"
    cmd = [sys.executable, "-m", "microbench.sweep", "--config", str(sweep), "--out", str(run), *RAY]
    proc = subprocess.Popen(cmd, text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    pid = _worker_of(run, 1024, 3, proc)
    engines = psutil.Process(pid).children(recursive=True)
    os.kill(pid, signal.SIGKILL)  # the shard's Ray task is lost, its worker with no chance to clean up
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 1, out[-3000:]
    assert "1 of 2 shard(s) did not finish" in out and "--resume" in out
    _, alive = psutil.wait_procs(engines, timeout=15)
    assert not alive, "the killed shard's engine outlived it"
    runs = run / "runs"
    assert len(list((runs / "512").glob("*.json"))) == 6  # the other shard finished
    before = {p.name: read_record(p, RunRecord).t_inject_ns for p in (runs / "1024").glob("*.json")}
    assert 3 <= len(before) < 6
    lost = [s for s in _manifest(run)["shards"] if s["chunk"] == 1024]
    assert [s["outcome"].split(":")[0] for s in lost] == ["failed"]
    observed_before = _files(run, "observed")
    assert all(read_record(run / rel, Observation) for rel in observed_before)  # every one whole

    code = main(["--resume", "--out", str(run), *RAY])
    records = [read_record(p, RunRecord) for p in runs.rglob("*.json")]
    assert code == (0 if all(r.validity.valid for r in records) else 1)
    after = {p.name: read_record(p, RunRecord).t_inject_ns for p in (runs / "1024").glob("*.json")}
    assert len(after) == 6 and all(after[name] == t for name, t in before.items())  # kept, not redone
    new = _files(run, "observed") - observed_before
    assert observed_before <= _files(run, "observed")  # nothing lost
    # nothing measured twice: every attempt the resume made is of a point of the lost shard it lacked
    assert {Path(rel).stem.rsplit("_a", 1)[0] for rel in new} == {
        Path(n).stem for n in set(after) - set(before)
    }
    assert all(rel.startswith("observed/1024/") for rel in new)
    shards = [(s["chunk"], s["outcome"], s["points"]) for s in _manifest(run)["shards"]]
    assert sorted(s for s in shards if s[1] == "done") == [
        (512, "done", 6),
        (1024, "done", 6 - len(before)),
    ]
    assert len(shards) == 3  # the finished shard was not submitted again
