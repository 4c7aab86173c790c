"""The executors' pure parts: core claims and their text, the relay's writes, what a worker is sent,
the manifest's shard entries, and the flags' bad combinations (issue #39)."""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import os
from pathlib import Path
from typing import Any

import pandas as pd
import psutil
import pytest

from benchcore.cli import BadInput
from engine_harness.engines import EngineSpec
from engine_harness.process_group import core_text
from microbench.executors import add_executor_flags, executor_from_args
from microbench.executors import relay as relay_module
from microbench.executors.placement import (
    CoreClaim,
    PlacementError,
    cluster_capacity,
    record_shard,
    visible_gpus,
)
from microbench.executors.relay import Files, Relay, SinkCall, seed_files
from microbench.measure.plan import ShardPlan
from microbench.measure.shard import ShardEvents
from microbench.measure.sink import FolderSink
from microbench.results.layout import RunFolder, new_manifest
from microbench.results.records import Baseline, ShardRun


def _plan(kind: str = "vllm") -> ShardPlan:
    return ShardPlan(
        spec=EngineSpec(kind=kind, chunk_size=512),
        chunk=512,
        decode_batch_sizes=[0],
        prefill_tokens=[256],
        repetitions=1,
        decode_context=256,
        seed=0,
        decode_budgets={},
        hardware="CPU: test",
    )


def _folder(tmp_path: Path) -> RunFolder:
    folder = RunFolder(tmp_path / "run")
    folder.root.mkdir()
    folder.write_manifest(new_manifest(folder, {"chunks": [512]}, {"kind": "sim"}))
    return folder


def test_core_text_writes_runs_as_ranges() -> None:
    assert core_text([5, 0, 1, 2]) == "0-2,5"
    assert core_text({3}) == "3"
    assert core_text([0, 2, 4]) == "0,2,4"
    assert core_text([]) == ""


def test_visible_gpus_reads_cuda_visible_devices() -> None:
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": "2,3"}) == ["2", "3"]
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": ""}) == visible_gpus({}) == []
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": "-1"}) == []


def test_two_shards_never_hold_the_same_core_and_a_third_is_refused(tmp_path: Path) -> None:
    mine = sorted(os.sched_getaffinity(0))
    first = CoreClaim(1, tmp_path)
    rest = CoreClaim(len(mine) - 1, tmp_path) if len(mine) > 1 else None
    got = first.acquire()
    others = rest.acquire() if rest is not None else []
    assert len(got) == 1 and not set(got) & set(others)
    assert sorted(got + others) == mine
    with pytest.raises(PlacementError, match="cannot isolate a shard"):
        CoreClaim(1, tmp_path).acquire()
    first.release()  # a released core (or a dead shard's: the kernel drops its locks) is free again
    with CoreClaim(1, tmp_path) as again:
        assert again == got
    if rest is not None:
        rest.release()


def test_a_shard_asking_for_more_cores_than_it_may_use_is_refused(tmp_path: Path) -> None:
    with pytest.raises(PlacementError, match="--shard-cpus"):
        CoreClaim(len(os.sched_getaffinity(0)) + 1, tmp_path).acquire()


class _Events(ShardEvents):
    def __init__(self) -> None:
        self.stored_points: list[Any] = []

    def stored(self, stored: Any) -> None:
        self.stored_points.append(stored)


def test_the_relay_writes_measured_files_before_the_points_record(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = _folder(tmp_path)
    order: list[str] = []
    real = relay_module.atomic_write_bytes
    monkeypatch.setattr(relay_module, "atomic_write_bytes", lambda p, b: (order.append(p.name), real(p, b)))
    files = [("runs/512/D0_P256_r0.json", b"{}"), ("invalid/512/x.json", b"{}"), ("raw/512/y.parquet", b"1")]
    Relay(FolderSink(folder), _Events()).apply(Files(files))
    assert order == ["y.parquet", "x.json", "D0_P256_r0.json"]  # runs/ last: done only once all is there
    assert (folder.root / "raw" / "512" / "y.parquet").read_bytes() == b"1"


def test_the_relay_refuses_a_file_outside_the_run_folder(tmp_path: Path) -> None:
    folder = _folder(tmp_path)
    for bad in ("../escape.json", "/tmp/escape.json", "runs/../../escape.json"):
        with pytest.raises(ValueError, match="outside its run folder"):
            Relay(FolderSink(folder), _Events()).apply(Files([(bad, b"x")]))
    assert not (tmp_path / "escape.json").exists()


def test_the_relay_replays_manifest_changes_and_ignores_unknown_calls(tmp_path: Path) -> None:
    folder = _folder(tmp_path)
    relay = Relay(FolderSink(folder), _Events())
    relay.apply(SinkCall("note", ("chunk 512: HTTP 500 (no attempt spent)",)))
    relay.apply(SinkCall("write_manifest", (None,)))  # not a sink call a worker may make: ignored
    assert folder.read_manifest().notes == ["chunk 512: HTTP 500 (no attempt spent)"]


def test_a_worker_is_sent_the_manifest_and_its_chunks_records_only(tmp_path: Path) -> None:
    folder = _folder(tmp_path)
    stored = ("runs/512/a.json", "invalid/512/b.json", "observed/512/c.json", "baselines/512/D4_b0.json")
    for rel in (*stored, "raw/512/d.parquet"):
        (folder.root / rel).parent.mkdir(parents=True, exist_ok=True)
        (folder.root / rel).write_bytes(b"{}")
    (folder.root / "runs" / "1024").mkdir()
    (folder.root / "runs" / "1024" / "e.json").write_bytes(b"{}")
    sent = [rel for rel, _ in seed_files(folder, 512)]
    assert sent == ["manifest.json", *stored]  # the baselines: a resumed shard's batches take new names


def test_a_resumed_shards_first_batch_never_overwrites_a_stored_baseline(tmp_path: Path) -> None:
    folder = _folder(tmp_path)
    first = folder.root / folder.baseline_name(512, 4, 0)
    first.parent.mkdir(parents=True)
    first.write_bytes(b"{}")
    baseline = Baseline(tpot_p50_ms=3.0, tpot_p90_ms=3.2, tpot_p99_ms=3.5, n_gaps=100)
    rel = FolderSink(folder).baseline(512, 4, 0, baseline, 50.0, pd.DataFrame({"t_ns": [1, 2]}))
    assert rel == "baselines/512/D4_b1.json" and first.read_bytes() == b"{}"


def test_a_shards_entry_is_replaced_by_its_later_state_and_others_are_kept(tmp_path: Path) -> None:
    folder = _folder(tmp_path)
    common: dict[str, Any] = dict(executor="ray", host="n1", device="GPU 0", cores_exclusive=True)
    a = ShardRun(chunk=512, pid=1, started_utc="t0", **common)
    b = ShardRun(chunk=1024, pid=2, started_utc="t0", **common)
    record_shard(folder, a)
    record_shard(folder, b)
    record_shard(folder, a.model_copy(update={"outcome": "done", "wall_s": 3.0}))
    shards = folder.read_manifest().shards
    assert [(s.chunk, s.outcome) for s in shards] == [(1024, "running"), (512, "done")]


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_executor_flags(parser.add_argument_group("executor"))
    return parser.parse_args(list(argv))


def test_ray_flags_without_the_ray_executor_are_bad_input() -> None:
    with pytest.raises(BadInput, match="--executor ray"):
        executor_from_args(_args("--ray-address", "auto"))
    assert executor_from_args(_args()).name == "local"


def test_the_ray_executor_without_ray_installed_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "ray" else real(name, *a)
    )
    with pytest.raises(BadInput, match=r"pip install '\.\[ray\]'"):
        executor_from_args(_args("--executor", "ray"))


def test_the_default_path_never_imports_ray() -> None:
    import subprocess
    import sys

    code = (
        "import sys, microbench.sweep.cli, microbench.characterize.cli, microbench.characterize.shards\n"
        "import microbench.executors.local, microbench.executors.shard_task\n"
        "from microbench.executors import executor_from_args\n"
        "assert 'ray' not in sys.modules, 'ray was imported'\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]


def _node(cpus: float, gpus: float = 0, alive: bool = True) -> dict[str, Any]:
    return {"Alive": alive, "Resources": {"CPU": cpus} | ({"GPU": gpus} if gpus else {})}


def test_a_shard_asks_for_a_gpu_where_there_are_gpus_else_a_whole_nodes_cores(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    ray_executor = pytest.importorskip("microbench.executors.ray")
    nodes = [_node(16, 8), _node(64, 0, alive=False)]
    monkeypatch.setattr(ray_executor.ray, "nodes", lambda: nodes)
    resources, options = ray_executor.RayExecutor()._resources()
    assert resources == {"num_gpus": 1, "num_cpus": 1} and options.cores is None  # Ray's GPU is the shard's
    nodes[:] = [_node(8), _node(4)]
    resources, options = ray_executor.RayExecutor()._resources()
    assert resources == {"num_cpus": 8} and options.cores == 8  # default: one shard per (largest) node
    resources, options = ray_executor.RayExecutor(shard_cpus=2)._resources()
    assert resources == {"num_cpus": 2} and options.cores == 2
    with pytest.raises(BadInput, match="--shard-cpus 9: no node"):
        ray_executor.RayExecutor(shard_cpus=9)._resources()


async def test_the_ray_executor_refuses_an_engine_every_shard_would_share(tmp_path: Path) -> None:
    ray_executor = pytest.importorskip("microbench.executors.ray")
    plan = dataclasses.replace(_plan("vllm"), spec=EngineSpec(kind="external", url="http://127.0.0.1:1"))
    with pytest.raises(BadInput, match="use --executor local"):
        context = argparse.Namespace(console=None, timing=None, events=None)  # refused before any use
        await ray_executor.RayExecutor().run([plan], FolderSink(_folder(tmp_path)), context)  # type: ignore[arg-type]


def test_a_dead_workers_scratch_folder_is_removed_and_a_live_ones_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import tempfile

    from microbench.executors import shard_task

    monkeypatch.setattr(tempfile, "gettempdir", lambda: str(tmp_path))
    dead = max(psutil.pids()) + 100_000  # no such process
    live = tmp_path / f"microbench-shard-{os.getpid()}-512-abc"
    gone = tmp_path / f"microbench-shard-{dead}-512-abc"
    for folder in (live, gone):
        (folder / "runs").mkdir(parents=True)
    shard_task._remove_orphans()
    assert live.is_dir() and not gone.exists()


def test_cluster_capacity_counts_shards_that_can_each_be_alone() -> None:
    def node(alive: bool = True, **resources: float) -> dict[str, Any]:
        return {"Alive": alive, "Resources": resources}

    assert cluster_capacity([node(CPU=16, GPU=4), node(CPU=16, GPU=4), node(False, GPU=8)], 1) == 8
    assert cluster_capacity([node(CPU=2)], 1) == 2  # this box, a core per shard
    assert cluster_capacity([node(CPU=2)], 2) == 1  # the default: a whole node per shard
    assert cluster_capacity([node(CPU=3), node(CPU=3)], 2) == 2  # a shard never spans nodes
    assert cluster_capacity([node(CPU=1)], 2) == 1  # never below one at a time
    assert cluster_capacity([], None) == 1


def test_a_shard_on_a_node_with_other_code_ends_before_its_engine_starts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from microbench.executors import shard_task
    from microbench.executors.relay import Finished, Started

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")  # a GPU shard: no cores to claim and pin
    monkeypatch.setattr(shard_task, "running_code", lambda: "pd-interference-bench 0.1.0 @ aaaa")
    monkeypatch.setattr(shard_task, "measure_shard", pytest.fail)  # no engine may start
    options = shard_task.TaskOptions(driver_code="pd-interference-bench 0.1.0 @ bbbb")
    started, finished = list(shard_task.stream_shard(_plan(), "run", [], options))
    assert isinstance(started, Started) and started.code.endswith("@ aaaa")  # the driver records both
    assert isinstance(finished, Finished) and finished.error is not None
    assert "@ aaaa" in finished.error and "the driver: pd-interference-bench 0.1.0 @ bbbb" in finished.error
    same = shard_task.TaskOptions(driver_code="pd-interference-bench 0.1.0 @ aaaa")
    monkeypatch.setattr(shard_task, "_Loop", _NoLoop)
    messages = list(shard_task.stream_shard(_plan(), "run", [], same))
    assert [type(m) for m in messages] == [Started, Finished] and messages[1].error is None


class _NoLoop:
    """A shard loop that ends at once (what the shard's body does is not this test's subject)."""

    def __init__(self, name: str, body: Any, out: Any) -> None:
        from microbench.executors import shard_task
        from microbench.executors.relay import Finished

        self.thread = argparse.Namespace(start=lambda: (out.put(Finished([])), out.put(shard_task._END)))

    def stop(self) -> None:
        pass


def test_the_code_identity_names_the_commit_and_uncommitted_changes(tmp_path: Path) -> None:
    import subprocess

    from benchcore.provenance import code_identity

    repo = tmp_path / "repo"
    repo.mkdir()
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    (repo / "a.py").write_text("x = 1\n")
    subprocess.run([*git, "add", "a.py"], check=True)
    subprocess.run([*git, "commit", "-qm", "a"], check=True)
    clean = code_identity(repo, "pytest")
    commit = subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    assert clean == f"pytest {pytest.__version__} @ {commit}"
    (repo / "a.py").write_text("x = 2\n")
    edited = code_identity(repo, "pytest")
    (repo / "a.py").write_text("x = 3\n")
    assert clean != edited != code_identity(repo, "pytest") and edited.startswith(clean + "+")
    assert code_identity(tmp_path, "pytest").endswith("@ no git checkout")


def test_a_split_deals_each_chunks_batched_d_values_into_groups_and_keeps_the_grid() -> None:
    from microbench.measure.plan import split_plans

    seed = dataclasses.replace(_plan(), decode_batch_sizes=[0, 1, 2, 4, 6, 8, 12], prefill_tokens=[512, 1024])
    plans = [seed, dataclasses.replace(seed, chunk=2048)]
    assert split_plans(plans, 2) == plans == split_plans(plans, 3)  # no more devices than chunk sizes
    parts = split_plans(plans, 8)  # 4 groups per chunk size
    assert [p.name for p in parts[:4]] == ["512-D1_8", "512-D2_12", "512-D4", "512-D0_6"]
    for chunk, plan in ((512, seed), (2048, plans[1])):
        mine = [p for p in parts if p.chunk == chunk]
        assert sorted(pt for p in mine for pt in p.points()) == sorted(plan.points())  # the whole grid, once
        assert all(p.repetitions == plan.repetitions and p.seed == plan.seed for p in mine)
    assert len(split_plans(plans, 100)) == 12  # at most one group per batched level (D 0 rides along)
    assert split_plans([dataclasses.replace(seed, decode_batch_sizes=[0])], 4)[0].part is None


def test_a_local_ray_instances_token_lives_in_its_scratch_folder_unless_the_user_gave_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("ray")
    from microbench.executors.ray import local_token

    for name in ("RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH"):
        monkeypatch.delenv(name, raising=False)
    first, second, third = (tmp_path / name for name in "abc")
    for folder in (first, second, third):
        folder.mkdir()
    assert local_token(first) == ["RAY_AUTH_TOKEN_PATH"]
    token = first / "auth_token"
    assert os.environ["RAY_AUTH_TOKEN_PATH"] == str(token)
    assert token.stat().st_mode & 0o777 == 0o600 and len(token.read_text()) == 64
    monkeypatch.delenv("RAY_AUTH_TOKEN_PATH")
    local_token(second)  # one token per process: Ray's loader keeps the first it read
    assert (second / "auth_token").read_text() == token.read_text()
    monkeypatch.setenv("RAY_AUTH_TOKEN", "the user's")  # a token the user gave stands
    monkeypatch.delenv("RAY_AUTH_TOKEN_PATH")
    assert local_token(third) == [] and not any(third.iterdir())
    assert "RAY_AUTH_TOKEN_PATH" not in os.environ


def test_a_local_ray_instance_that_fails_to_start_leaves_no_folder_and_no_token_variable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ray_executor = pytest.importorskip("microbench.executors.ray")
    for name in ("RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(ray_executor.tempfile, "tempdir", str(tmp_path))
    monkeypatch.setattr(ray_executor.ray, "is_initialized", lambda: False)

    def refused(**_: Any) -> None:  # as Ray 2.60's GCS refused a driver with a stale auth mode
        raise RuntimeError("Failed to start GCS")

    monkeypatch.setattr(ray_executor.ray, "init", refused)
    with pytest.raises(RuntimeError, match="GCS"):
        ray_executor.RayExecutor()._connect()
    assert not any(tmp_path.iterdir()) and "RAY_AUTH_TOKEN_PATH" not in os.environ
