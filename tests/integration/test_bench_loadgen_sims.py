"""scripts/bench_loadgen_rate.py's sims: steps of no time by default, of ``--sim-step-ms`` when asked."""

import asyncio
import os
import time

import aiohttp
import pytest

from engine_harness.launch import free_port
from microbench.client.requests import RequestSpec
from microbench.loadgen.session import LoadSession
from microbench.loadgen.stages import SessionSettings, Stage
from microbench.workloads.schedulers import parse_scheduler
from tests.unit.test_bench_loadgen_rate import bench  # the script, loaded once

pytestmark = pytest.mark.integration
STEP_MS = 10.0


async def _e2e_ms(url: str) -> float:
    body = {"model": "sim", "prompt": "one two three", "max_tokens": 4, "ignore_eos": True}
    async with aiohttp.ClientSession() as http:
        t0 = time.perf_counter_ns()
        async with http.post(url + "/v1/completions", json=body) as resp:
            answer = await resp.json()
        e2e = (time.perf_counter_ns() - t0) / 1e6
    assert resp.status == 200 and answer["usage"]["completion_tokens"] == 4
    return e2e


@pytest.mark.parametrize("step_ms", [0.0, STEP_MS])
def test_the_sims_answer_and_take_their_steps_time(step_ms: float) -> None:
    port = free_port()
    sims = bench.start_sims(port, [sorted(os.sched_getaffinity(0))[-1]], step_ms)
    try:
        bench.wait_listening(sims)
        url = f"http://127.0.0.1:{port}"
        bench._wait_healthy(url)
        e2e = asyncio.run(_e2e_ms(url))
    finally:
        for sim in sims:
            sim.terminate()
            sim.wait()
    if step_ms:  # 4 tokens: the prompt's step and 3 decode steps, each step_ms at least
        assert e2e >= 4 * step_ms, e2e


def test_the_bare_sender_keeps_the_schedule_and_every_request_streams_to_its_end() -> None:
    """Row ``bare``, the library's yardstick: the same payloads as the workers', each request answered in
    full, no send before its time, its CPU taken over the sending window."""
    cores = sorted(os.sched_getaffinity(0))
    port = free_port()
    sims = bench.start_sims(port, cores[-1:])
    try:
        bench.wait_listening(sims)
        url = f"http://127.0.0.1:{port}"
        bench._wait_healthy(url)
        run = bench.bare_run(url, 200, 0.5, cores)
    finally:
        os.sched_setaffinity(0, cores)
        for sim in sims:
            sim.terminate()
            sim.wait()
    assert run["requests"] == 100 and run["ok"] == 100
    # not ahead of the schedule; how far behind depends on the box (this tier also runs at nice 19 beside
    # other tests, where local CI 64 saw 97 req/s sent of the 200 asked), so no bound on lateness here
    assert 0 <= run["p50_ms"] <= run["p99_ms"]
    assert run["achieved_rate"] > 0
    assert run["e2e_p50_ms"] > 0 and run["cpu_us_per_request"] > 0


async def _one_session(url: str) -> list[str]:
    settings = SessionSettings.model_validate({"base_url": url, "api": {"model": "sim"}})
    specs = [RequestSpec(list(range(16)), 16, 4) for _ in range(20)]
    stage = Stage.scheduled("u", parse_scheduler({"kind": "uniform", "rate": 500}), specs, max_requests=20)
    async with LoadSession(settings) as session:
        result = await session.run([stage])
    assert all(r.stream.usage and r.stream.usage["completion_tokens"] == 4 for r in result.records)
    assert all(sum(r.stream.chunk_tokens) == 4 for r in result.records)
    return [r.status for r in result.records]


def test_the_load_generator_reads_the_canned_responders_stream_as_a_complete_answer() -> None:
    port = free_port()
    servers = bench.start_canned(port, [sorted(os.sched_getaffinity(0))[-1]])
    try:
        bench.wait_listening(servers)
        url = f"http://127.0.0.1:{port}"
        bench._wait_healthy(url)
        assert asyncio.run(_one_session(url)) == ["ok"] * 20
    finally:
        for server in servers:
            server.terminate()
            server.wait()
