"""The load generator in worker processes against the in-process sim engine: one schedule between them,
every prompt once, the merged trace the same shape as one process's, each worker's delay measured."""

from __future__ import annotations

import itertools
import multiprocessing as mp
import os
from typing import Any

import numpy as np
import pytest

from engine_harness.sim import SimConfig, SimServer
from microbench.client.requests import RequestSpec
from microbench.loadgen.stages import SessionResult, SessionSettings, Stage, sweep_stages
from microbench.loadgen.trace import trace_frame
from microbench.loadgen.workers import run_sessions, worker_delays
from microbench.workloads.generator import Workload
from microbench.workloads.prompts import PromptFactory
from microbench.workloads.schedulers import parse_scheduler
from microbench.workloads.spec import WorkloadSpec

pytestmark = [pytest.mark.integration, pytest.mark.clock]  # reads the clock: the clock pass


def _requests(output: int = 4) -> Any:
    spec = WorkloadSpec.model_validate({
        "name": "small", "seed": 5, "aggregate_rate": 40,
        "clients": [{"id": "c", "input_length": {"type": "uniform", "min": 16, "max": 64},
                     "output_length": {"type": "fixed", "value": output}}],
    })  # fmt: skip
    return Workload(spec, PromptFactory(salt=9)).requests()


async def _run(sim: SimServer, stages: list[Stage], workers: int) -> SessionResult:
    settings = SessionSettings.model_validate({"base_url": sim.base_url, "api": {"model": "sim"}})
    return await run_sessions(settings, stages, workers)


async def test_two_workers_send_one_seeded_schedule_and_every_prompt_once() -> None:
    def stages() -> list[Stage]:
        poisson = parse_scheduler({"kind": "poisson", "rate": 200, "seed": 3})
        return sweep_stages(poisson, [200, 300], _requests(), max_requests=40)

    async with SimServer(SimConfig(time_scale=0)) as sim:
        one = await _run(sim, stages(), 1)
        two = await _run(sim, stages(), 2)
    rows_one, rows_two = trace_frame(one), trace_frame(two)
    assert (rows_two["status"] == "ok").all() and len(rows_two) == 80
    assert list(rows_two["request_id"]) == list(range(80))
    # the same items at the same offsets from their stage's start as one process sends
    for rows, res in ((rows_one, one), (rows_two, two)):
        rows["offset"] = rows["intended_ns"] - rows["stage"].map(
            {s.name: s.start_ns - res.t0_ns for s in res.stages}
        )
    key = ["stage", "offset", "prompt_tokens", "max_tokens"]
    assert (
        rows_two[key].sort_values(key).to_numpy().tolist()
        == rows_one[key].sort_values(key).to_numpy().tolist()
    )
    prompts = [tuple(r.spec.prompt) for r in two.records]
    assert len(set(prompts)) == 80  # no prompt sent twice: the workers' shares never meet
    assert set(prompts) == {tuple(r.spec.prompt) for r in one.records}  # one salt: the same prompts, any N
    assert {r.worker for r in two.records} == {0, 1}
    assert rows_two["worker"].tolist() == [r.worker for r in two.records] and set(rows_one["worker"]) == {0}
    assert [o.issued for o in two.stages] == [40, 40]
    assert all(o.issue_cpu_s > 0 for o in two.stages)  # the workers' CPU while issuing, summed
    delays = worker_delays(two)
    assert set(delays) == {0, 1} and sum(d["sent"] for d in delays.values()) == 80
    assert all(0 <= d["p50_ms"] < 50 for d in delays.values())


async def test_a_closed_loop_splits_its_slots_between_workers() -> None:
    closed = parse_scheduler({"kind": "concurrency", "concurrency": 3})
    stage = Stage.scheduled("c", closed, _requests(16), max_requests=30)
    async with SimServer(SimConfig(time_scale=1.0)) as sim:
        result = await _run(sim, [stage], 2)
    rows = trace_frame(result)
    assert (rows["status"] == "ok").all() and len(rows) == 30
    assert result.stages[0].max_in_flight <= 3  # 2 slots in worker 0, 1 in worker 1
    # the items alternate between the workers, whatever their slots
    assert np.bincount([r.worker for r in result.records]).tolist() == [15, 15]


async def test_event_hooks_need_one_worker() -> None:
    settings = SessionSettings.model_validate({"base_url": "http://127.0.0.1:9", "api": {"model": "sim"}})
    with pytest.raises(ValueError, match="one worker"):
        await run_sessions(settings, [], 2, hooks=[lambda event: None])


async def test_workers_pinned_to_cores_and_the_affinity_given_back() -> None:
    cores = sorted(os.sched_getaffinity(0))

    def stage() -> Stage:
        return Stage.scheduled(
            "u", parse_scheduler({"kind": "uniform", "rate": 200}), _requests(), max_requests=20
        )

    async with SimServer(SimConfig(time_scale=0)) as sim:
        settings = SessionSettings.model_validate({"base_url": sim.base_url, "api": {"model": "sim"}})
        with pytest.raises(ValueError, match="2 workers need 2 cores"):
            await run_sessions(settings, [stage()], 2, cores=cores[:1])
        two = await run_sessions(settings, [stage()], 2, cores=[cores[0], cores[-1]])
        one = await run_sessions(settings, [stage()], 1, cores=[cores[-1]])
    assert [r.status for r in two.records + one.records] == ["ok"] * 40
    assert sorted(os.sched_getaffinity(0)) == cores  # one worker ran in this process, pinned for the run


def _first_blocks(result: SessionResult) -> list[tuple[int, ...]]:
    return [tuple(r.spec.prompt[:16]) for r in result.records]


async def test_runs_in_workers_one_after_another_never_repeat_a_prompt() -> None:
    """One factory across runs (the battery's): what the workers drew in one run is not drawn again in the
    next, in this process or in new workers, and a conversation's later rounds differ between workers."""
    factory = PromptFactory(salt=11)
    spec = WorkloadSpec.model_validate({
        "name": "talk", "seed": 5, "aggregate_rate": 40,
        "clients": [{"id": "c", "input_length": {"type": "uniform", "min": 16, "max": 64},
                     "output_length": {"type": "fixed", "value": 2},
                     "multi_turn": {"max_rounds": 3, "think_time_s": 0.0,
                                    "context_growth": "fixed"}}],
    })  # fmt: skip

    def stage(name: str) -> Stage:
        uniform = parse_scheduler({"kind": "uniform", "rate": 400})
        return Stage.scheduled(name, uniform, Workload(spec, factory).requests(), max_requests=12)

    async with SimServer(SimConfig(time_scale=0)) as sim:
        runs = [
            await _run(sim, [stage("a")], 2),
            await _run(sim, [stage("b")], 2),
            await _run(sim, [stage("c")], 1),
        ]
    blocks = [b for run in runs for b in _first_blocks(run)]
    assert [len(run.records) for run in runs] == [36, 36, 36]  # 12 conversations of 3 rounds each
    assert all(r.status == "ok" for run in runs for r in run.records)
    assert len(set(blocks)) == len(blocks) == 108


async def test_each_worker_builds_only_the_requests_it_sends() -> None:
    """Every draft of the plan is built once, by the worker that sends it: the others skip it unbuilt."""
    builds = mp.get_context("fork").Array("q", 60, lock=True)

    def drafts() -> Any:
        for i in itertools.count():

            def build(i: int = i) -> tuple[list[int], int]:
                with builds.get_lock():
                    builds[i] += 1
                return list(range(i, i + 20)), 20

            yield RequestSpec([], 20, 2, build_prompt=build)

    stage = Stage.scheduled("u", parse_scheduler({"kind": "uniform", "rate": 400}), drafts(), max_requests=60)
    async with SimServer(SimConfig(time_scale=0)) as sim:
        result = await _run(sim, [stage], 3)
    assert list(builds) == [1] * 60
    assert sorted(r.spec.prompt[0] for r in result.records) == list(range(60))
