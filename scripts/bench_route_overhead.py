"""Benchmark of the route job's router: the latency it adds in front of an engine.

One sim engine (a subprocess: 5 ms steps, real time) and, in this process, the client and the router
(as in ``python -m microbench.route``). Interleaved rounds; in each, the same number of sequential
requests (64-token cold prompt, 32 tokens) go (a) straight to the engine — the yardstick —, (b) through
the router with the colocated policy (a pass-through), (c) through the router with the table policy (a
table lookup per request). Printed: median TTFT and inter-chunk gap per path, the router's added TTFT
and gap (path − direct, median over rounds of the per-round medians) and its decision time p50/p99.

    .venv/bin/python scripts/bench_route_overhead.py [--rounds 5] [--requests 20] [--out FILE]
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

import aiohttp
import numpy as np

from analysis.breakeven import LinkProfile
from engine_harness.launch import free_port
from engine_harness.model_kv import ModelKV
from engine_harness.step_model import StepModel
from microbench.client.prompts import FALLBACK_SPACE, cold_prompt
from microbench.client.requests import completion_body
from microbench.client.streams import stream_request
from microbench.route.predicted import predicted_policy
from microbench.route.router import OffloadRouter


async def _wait(url: str) -> None:
    async with aiohttp.ClientSession() as http:
        for _ in range(200):
            try:
                async with http.get(url + "/health") as r:
                    if r.status == 200:
                        return
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(0.05)
    raise RuntimeError("sim engine did not come up")


async def _path(http: aiohttp.ClientSession, url: str, n: int) -> tuple[list[float], list[float]]:
    ttft, gaps = [], []
    for _ in range(n):
        body = completion_body("sim", cold_prompt(64, FALLBACK_SPACE), 32)
        rec = await stream_request(http, url + "/v1/completions", body)
        ttft.append((rec.chunk_t_ns[0] - rec.t_send_ns) / 1e6)
        gaps += list(np.diff(rec.chunk_t_ns) / 1e6)
    return ttft, gaps


async def main(rounds: int, requests: int) -> dict[str, object]:
    port = free_port()
    sim = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "engine_harness.sim", "--model", "sim", "--port", str(port), "--alpha-ms", "5",
        "--beta-d-ms", "0", "--beta-c-ms", "0.01", "--gamma-ns", "0",
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    link = LinkProfile(name="l", basis="assumed", assumption="bench", setup_latency_ms=50, bandwidth_gbit_s=8)
    table = predicted_policy(StepModel(), link, ModelKV("m", 1, 1, 512, 2), 2048, range(9), [64, 1024, 16384])
    results: dict[str, dict[str, list[float]]] = {}
    decide_us: list[float] = []
    try:
        await _wait(url)
        routers = {
            "colocated": OffloadRouter(url, url, None, "colocated", 2048),
            "table": OffloadRouter(url, url, None, "table", 2048, table),
        }
        for r in routers.values():
            await r.start()
        async with aiohttp.ClientSession() as http:
            await _path(http, url, 3)  # warm-up
            for _ in range(rounds):
                for name, target in [("direct", url), *((k, v.base_url) for k, v in routers.items())]:
                    ttft, gaps = await _path(http, target, requests)
                    row = results.setdefault(name, {"ttft": [], "gap": []})
                    row["ttft"].append(float(np.median(ttft)))
                    row["gap"].append(float(np.median(gaps)))
        decide_us = [ns / 1e3 for ns in routers["table"].decide_ns.values()]
        for r in routers.values():
            await r.stop()
    finally:
        sim.terminate()
        await asyncio.wait_for(sim.wait(), 10)
    out: dict[str, object] = {
        "rounds": rounds,
        "requests_per_round": requests,
        "load_avg_1m": os.getloadavg()[0],
    }
    direct = results["direct"]
    for name, row in results.items():
        figures = {"ttft_ms_p50": float(np.median(row["ttft"])), "gap_ms_p50": float(np.median(row["gap"]))}
        if name != "direct":
            figures |= {
                "added_ttft_ms": float(np.median(np.subtract(row["ttft"], direct["ttft"]))),
                "added_gap_ms": float(np.median(np.subtract(row["gap"], direct["gap"]))),
            }
        out[name] = figures
    out["table_decide_us"] = {
        "p50": float(np.percentile(decide_us, 50)),
        "p99": float(np.percentile(decide_us, 99)),
    }
    return out


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--requests", type=int, default=20)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    t0 = time.perf_counter()
    figures = asyncio.run(main(args.rounds, args.requests))
    figures["wall_s"] = round(time.perf_counter() - t0, 1)
    text = json.dumps(figures, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
