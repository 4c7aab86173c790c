"""Benchmark of the simulated engine: how fast it streams when it never sleeps (time_scale 0).

Three figures, each for ``--streams`` concurrent requests of ``--tokens`` generated tokens:

* ``engine``: the engine alone (no HTTP), its streams drained directly: the engine's own ceiling;
* ``http``: the sim server in-process, read over HTTP by the suite's own client (``stream_request``,
  continuous usage) in the same process, so client and server share one core under ``taskset -c 0``;
* ``split``: the sim as its own process (``python -m engine_harness.sim``), read by the suite's client;
  the CPU time is the sim process's alone, so its per-CPU-second rate is the sim's capacity on one core.

Wall-clock rates drop when other work shares the core; per-CPU-second rates do not.

Usage: ``taskset -c 0 .venv/bin/python scripts/bench_sim.py [--streams 64] [--tokens 500] [--only NAME]``.
"""

from __future__ import annotations

import argparse
import asyncio
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any

import aiohttp
import psutil

from engine_harness.sim import SimConfig, SimEngine, SimServer
from microbench.client.streams import stream_request

__all__ = ["BenchResult", "bench_engine", "bench_http", "bench_split", "main"]


@dataclass(frozen=True)
class BenchResult:
    name: str
    tokens: int
    steps: int
    wall_s: float
    cpu_s: float

    def line(self) -> str:
        return (
            f"{self.name:>6}: {self.tokens / self.wall_s:>9,.0f} tokens/s "
            f"{self.steps / self.wall_s:>7,.0f} steps/s"
            f" | per CPU-s: {self.tokens / self.cpu_s:>9,.0f} tokens {self.steps / self.cpu_s:>7,.0f} steps"
            f"  ({self.tokens} tokens, {self.steps} steps, {self.wall_s:.2f} s wall, {self.cpu_s:.2f} s CPU)"
        )


def _config(streams: int) -> SimConfig:
    return SimConfig(model="bench", time_scale=0.0, max_num_seqs=max(streams, 1), step_log_max=100_000)


def _payloads(streams: int, tokens: int) -> list[dict[str, Any]]:
    usage = {"include_usage": True, "continuous_usage_stats": True}
    return [
        {
            "model": "bench",
            "prompt": [i % 250, 1, 2, 3],
            "max_tokens": tokens,
            "ignore_eos": True,
            "stream_options": usage,
        }
        for i in range(streams)
    ]


async def bench_engine(streams: int, tokens: int) -> BenchResult:
    engine = SimEngine(_config(streams))
    await engine.start()

    async def drain(i: int) -> int:
        stream = engine.submit([i % 250, 1, 2, 3], tokens, ignore_eos=True)
        n = 0
        while chunk := await stream.next():
            n += len(chunk)
        return n

    try:
        t0, c0 = time.perf_counter(), time.process_time()
        counts = await asyncio.gather(*(drain(i) for i in range(streams)))
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    finally:
        await engine.stop()
    assert sum(counts) == streams * tokens
    return BenchResult("engine", sum(counts), engine.num_steps, wall, cpu)


async def bench_http(streams: int, tokens: int) -> BenchResult:
    async with SimServer(_config(streams)) as sim:
        connector = aiohttp.TCPConnector(limit=streams + 4)
        async with aiohttp.ClientSession(connector=connector) as session:
            url = f"{sim.base_url}/v1/completions"
            t0, c0 = time.perf_counter(), time.process_time()
            recs = await asyncio.gather(
                *(stream_request(session, url, p) for p in _payloads(streams, tokens))
            )
            wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        steps = sim.engine.num_steps
    total = sum(r.completion_tokens for r in recs)
    assert total == streams * tokens, total
    return BenchResult("http", total, steps, wall, cpu)


async def _wait_healthy(session: aiohttp.ClientSession, base: str, proc: asyncio.subprocess.Process) -> None:
    for _ in range(600):
        if proc.returncode is not None:
            raise RuntimeError(f"the sim exited with status {proc.returncode}")
        try:
            async with session.get(f"{base}/health") as resp:
                if resp.status == 200:
                    return
        except aiohttp.ClientError:
            pass
        await asyncio.sleep(0.05)
    raise RuntimeError("the sim did not become healthy")


async def bench_split(streams: int, tokens: int) -> BenchResult:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    argv = [
        sys.executable,
        "-m",
        "engine_harness.sim",
        "--model",
        "bench",
        "--port",
        str(port),
        "--time-scale",
        "0",
        "--max-num-seqs",
        str(max(streams, 1)),
        "--step-log-max",
        "100000",
    ]
    proc = await asyncio.create_subprocess_exec(*argv, stdout=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    try:
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=streams + 4)) as session:
            await _wait_healthy(session, base, proc)
            server = psutil.Process(proc.pid)
            c0 = sum(server.cpu_times()[:2])
            t0 = time.perf_counter()
            url = f"{base}/v1/completions"
            recs = await asyncio.gather(
                *(stream_request(session, url, p) for p in _payloads(streams, tokens))
            )
            wall = time.perf_counter() - t0
            cpu = sum(server.cpu_times()[:2]) - c0
            async with session.get(f"{base}/sim/steps", params={"since": str(1 << 40)}) as resp:
                steps = int((await resp.json())["next"])
    finally:
        proc.terminate()
        await asyncio.wait_for(proc.wait(), timeout=10)
    total = sum(r.completion_tokens for r in recs)
    assert total == streams * tokens, total
    return BenchResult("split", total, steps, wall, cpu)


BENCHMARKS: dict[str, Callable[[int, int], Coroutine[Any, Any, BenchResult]]] = {
    "engine": bench_engine,
    "http": bench_http,
    "split": bench_split,
}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--streams", type=int, default=64, help="concurrent requests")
    ap.add_argument("--tokens", type=int, default=500, help="generated tokens per request")
    ap.add_argument("--only", choices=sorted(BENCHMARKS), help="run one of the benchmarks")
    args = ap.parse_args(argv)
    print(f"sim benchmark: {args.streams} streams × {args.tokens} tokens, time_scale 0")
    for name, bench in BENCHMARKS.items():
        if args.only in (None, name):
            print(asyncio.run(bench(args.streams, args.tokens)).line())


if __name__ == "__main__":
    main()
