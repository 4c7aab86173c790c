"""Benchmark of the load generator against the sim engine, side by side with vLLM's bundled client.

Figures (same run, same sim server, client pinned to one core and the sim to the other):

1. Schedule delay p50/p99 (actual send − intended send) at 100, 500 and 1000 req/s, constant spacing:
   ours (``LoadSession`` + ``uniform`` scheduler) vs vLLM's ``get_request`` (burstiness=inf) driving
   ``async_request_openai_completions`` exactly as ``vllm bench serve`` does. vLLM's intended time is
   ``start + (i+1)/rate``, ``start`` taken right before its generator is first awaited; its actual send
   time is the ``start_time`` its request function stamps.
2. SSE ingest: concurrent long streams from a sim that does not sleep (``--time-scale 0``); chunks per wall
   second, and chunks per CPU second of the client process (the ceiling one core can ingest, each chunk
   stamped with ``perf_counter``). ``ours`` reads the same stream as vLLM's client (usage only at the
   end); ``ours_continuous_usage`` is the load generator's default, usage in every chunk. Medians of
   ``--rounds`` interleaved rounds (this box's speed drifts by tens of percent between seconds).

    .venv/bin/python scripts/bench_loadgen.py [--seconds 3] [--streams 32] [--tokens 2000] [--out FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np

from engine_harness.launch import free_port
from microbench.client import aio
from microbench.client.requests import RequestSpec
from microbench.loadgen.session import LoadSession
from microbench.loadgen.stages import SessionSettings, Stage
from microbench.workloads.prompts import PromptFactory
from microbench.workloads.schedulers import parse_scheduler

PROMPT_TOKENS = 16


def _pin(cpu: int) -> None:
    if hasattr(os, "sched_setaffinity") and cpu < (os.cpu_count() or 1):
        os.sched_setaffinity(0, {cpu})


async def _wait_healthy(url: str) -> None:
    async with aiohttp.ClientSession() as http:
        for _ in range(200):
            try:
                async with http.get(url + "/health") as resp:
                    if resp.status == 200:
                        return
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(0.05)
    raise RuntimeError("sim did not become healthy")


def _specs(n: int, max_tokens: int) -> list[RequestSpec]:
    factory = PromptFactory()
    return [RequestSpec(factory.cold(PROMPT_TOKENS), PROMPT_TOKENS, max_tokens) for _ in range(n)]


def _settings(url: str, continuous_usage: bool = True) -> SessionSettings:
    api = {"model": "sim", "continuous_usage": continuous_usage}
    return SessionSettings.model_validate({"base_url": url, "api": api, "drain_timeout_s": 120})


def _ms(values: np.ndarray) -> dict[str, float]:
    return {
        "p50_ms": float(np.percentile(values, 50) / 1e6),
        "p99_ms": float(np.percentile(values, 99) / 1e6),
    }


async def ours_delay(url: str, rate: float, n: int) -> dict[str, float]:
    stage = Stage.scheduled(
        "bench", parse_scheduler({"kind": "uniform", "rate": rate}), _specs(n, 4), max_requests=n
    )
    async with LoadSession(_settings(url)) as session:
        result = await session.run([stage])
    ok = [r for r in result.records if r.status == "ok"]
    assert len(ok) == n, {r.status for r in result.records}
    return _ms(np.array([r.stream.t_send_ns - r.intended_ns for r in ok], dtype=float))


def _vllm_inputs(url: str, n: int, max_tokens: int) -> tuple[list[Any], list[Any]]:
    from vllm.benchmarks.datasets import SampleRequest
    from vllm.benchmarks.lib.endpoint_request_func import RequestFuncInput

    samples = [SampleRequest(prompt=s.prompt, prompt_len=PROMPT_TOKENS, expected_output_len=max_tokens)
               for s in _specs(n, max_tokens)]  # fmt: skip
    inputs = [
        RequestFuncInput(prompt=s.prompt, api_url=url + "/v1/completions", prompt_len=s.prompt_len,
                         output_len=max_tokens, model="sim", ignore_eos=True)
        for s in samples
    ]  # fmt: skip
    return samples, inputs


def _vllm_session() -> aiohttp.ClientSession:  # the connector settings of vllm bench serve
    connector = aiohttp.TCPConnector(
        limit=0, limit_per_host=0, keepalive_timeout=60, enable_cleanup_closed=True
    )
    return aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=6 * 3600))


async def vllm_delay(url: str, rate: float, n: int) -> dict[str, float]:
    from vllm.benchmarks.lib.endpoint_request_func import async_request_openai_completions
    from vllm.benchmarks.serve import get_request

    samples, inputs = _vllm_inputs(url, n, 4)
    by_id = {id(s): i for i, s in enumerate(samples)}
    async with _vllm_session() as http:
        tasks = []
        start = time.perf_counter()
        async for request, _ in get_request(samples, rate, burstiness=float("inf")):
            tasks.append(
                asyncio.create_task(async_request_openai_completions(inputs[by_id[id(request)]], http))
            )
        outputs = await asyncio.gather(*tasks)
    assert all(o.success for o in outputs), [o.error for o in outputs if not o.success][:1]
    delays = [(o.start_time - (start + (i + 1) / rate)) * 1e9 for i, o in enumerate(outputs)]
    return _ms(np.array(delays))


async def ours_ingest(url: str, streams: int, tokens: int, continuous_usage: bool) -> dict[str, float]:
    stage = Stage.scheduled("ingest", parse_scheduler({"kind": "max_throughput"}), _specs(streams, tokens),
                            max_requests=streams)  # fmt: skip
    cpu0, t0 = time.process_time(), time.perf_counter()
    async with LoadSession(_settings(url, continuous_usage)) as session:
        result = await session.run([stage])
    cpu, wall = time.process_time() - cpu0, time.perf_counter() - t0
    chunks = sum(len(r.stream.chunk_t_ns) for r in result.records if r.status == "ok")
    assert chunks == streams * tokens, chunks
    return {"chunks": chunks, "chunks_per_s": chunks / wall, "chunks_per_cpu_s": chunks / cpu}


async def vllm_ingest(url: str, streams: int, tokens: int) -> dict[str, float]:
    from vllm.benchmarks.lib.endpoint_request_func import async_request_openai_completions

    _, inputs = _vllm_inputs(url, streams, tokens)
    cpu0, t0 = time.process_time(), time.perf_counter()
    async with _vllm_session() as http:
        outputs = await asyncio.gather(*(async_request_openai_completions(i, http) for i in inputs))
    cpu, wall = time.process_time() - cpu0, time.perf_counter() - t0
    chunks = sum(len(o.itl) + 1 for o in outputs if o.success)
    assert chunks == streams * tokens, chunks
    return {"chunks": chunks, "chunks_per_s": chunks / wall, "chunks_per_cpu_s": chunks / cpu}


def measure(args: argparse.Namespace) -> dict[str, Any]:
    """Each client on the loop its tool runs on: ours on ``microbench.client.aio`` (uvloop), vLLM's on
    asyncio's default loop (``vllm bench serve`` calls ``asyncio.run``). One sim server serves both."""
    import vllm.benchmarks.serve  # noqa: F401  (slow import: not inside a measurement)

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    argv = ["-m", "engine_harness.sim", "--port", str(port), "--model", "sim", "--time-scale", "0"]
    sim = subprocess.Popen(
        [sys.executable, *argv, "--max-num-seqs", "4096"],
        preexec_fn=lambda: _pin(1), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        asyncio.run(_wait_healthy(url))
        aio.run(ours_delay(url, 50, 20))  # warm both paths and the server
        asyncio.run(vllm_delay(url, 50, 20))
        report: dict[str, Any] = {"event_loops": {"ours": aio.loop_name(), "vllm_bench": "asyncio"},
                                  "schedule_delay": {}, "ingest": {}}  # fmt: skip
        for rate in args.rates:
            n = int(rate * args.seconds)
            report["schedule_delay"][f"{rate:g}"] = {
                "ours": aio.run(ours_delay(url, rate, n)),
                "vllm_bench": asyncio.run(vllm_delay(url, rate, n)),
            }
        report["ingest"] = {"streams": args.streams, "tokens_per_stream": args.tokens, "rounds": args.rounds}
        clients = {
            # the same byte stream as vLLM's client gets (usage only in the last chunk)
            "ours": lambda: aio.run(ours_ingest(url, args.streams, args.tokens, continuous_usage=False)),
            "vllm_bench": lambda: asyncio.run(vllm_ingest(url, args.streams, args.tokens)),
            # our default: usage in every chunk (exact tokens per chunk), a larger stream to parse
            "ours_continuous_usage": lambda: aio.run(ours_ingest(url, args.streams, args.tokens, True)),
        }
        runs: dict[str, list[dict[str, float]]] = {name: [] for name in clients}
        for i in range(args.rounds):  # interleaved, order alternating: the box's drift hits all alike
            for name in list(clients)[:: 1 if i % 2 == 0 else -1]:
                runs[name].append(clients[name]())
        for name, results in runs.items():
            report["ingest"][name] = {
                key: float(np.median([r[key] for r in results]))
                for key in ("chunks_per_s", "chunks_per_cpu_s")
            }
            report["ingest"][name]["rounds"] = results
        return report
    finally:
        sim.terminate()
        sim.wait()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rates", type=float, nargs="+", default=[100, 500, 1000])
    parser.add_argument("--seconds", type=float, default=3.0, help="seconds of issuing per rate")
    parser.add_argument("--streams", type=int, default=32)
    parser.add_argument("--tokens", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=5, help="ingest rounds per client (medians reported)")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    _pin(0)
    report = measure(args)
    text = json.dumps(report, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
