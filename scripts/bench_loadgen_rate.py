"""Where one load-generation process stops keeping its schedule, and what N worker processes reach.

The sim engine runs as a subprocess pinned to the last core (``--time-scale 0``: answers at once, short
outputs), so the figure is the load generator's own. For each rate of ``--rates`` (uniform spacing,
``--seconds`` of sends) and each worker count of ``--workers``, interleaved and in alternating order,
``--reps`` times: schedule delay (actual − intended send) p50/p99 over all first-round sends, the worst
worker's p99, and the achieved send rate. One worker runs pinned to core 0 (the other core is the
sim's); N > 1 workers may use every core. Beside them, as a yardstick in the same run (worker count 0
in the table), the same schedule kept by a bare loop that sends nothing: the lateness the box's own
scheduling causes (on a shared, loaded box it sets the floor of every p99). The knee of a worker count
is the highest rate at which the median p99 stays ≤ ``--knee-ms`` (1 ms) and the sends keep ≥ 90 % of
the rate. ``best p99`` is the lowest p99 of the reps: the generator when the box left it alone.

    .venv/bin/python scripts/bench_loadgen_rate.py [--rates 1000 2000 4000 6000] [--workers 1 2] [--out F]
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
from microbench.loadgen.stages import SessionSettings, Stage
from microbench.loadgen.workers import run_sessions, worker_delays
from microbench.workloads.prompts import PromptFactory
from microbench.workloads.schedulers import parse_scheduler

PROMPT_TOKENS, OUTPUT_TOKENS = 16, 4


def _wait_healthy(url: str) -> None:
    async def go() -> bool:
        async with aiohttp.ClientSession() as http:
            try:
                async with http.get(url + "/health") as resp:
                    return resp.status == 200
            except aiohttp.ClientError:
                return False

    for _ in range(200):
        if aio.run(go()):
            return
        time.sleep(0.05)
    raise RuntimeError("the sim engine did not become healthy")


async def _timer_floor(rate: float, n: int) -> list[int]:
    """The yardstick: the same schedule kept by a loop that sends nothing (sleep, then yield to the loop
    for the last millisecond, as ``LoadSession`` does): the lateness this box's scheduler alone causes."""
    start, delays = time.perf_counter_ns() + 50_000_000, []
    for i in range(n):
        target = start + int(i * 1e9 / rate)
        if (remaining := target - time.perf_counter_ns() - 1_000_000) > 0:
            await asyncio.sleep(remaining / 1e9)
        while time.perf_counter_ns() < target:  # noqa: ASYNC110
            await asyncio.sleep(0)
        delays.append(time.perf_counter_ns() - target)
    return delays


def floor_run(rate: float, seconds: float, cores: list[int]) -> dict[str, Any]:
    n = max(int(rate * seconds), 10)
    os.sched_setaffinity(0, set(cores[:1]))
    delay_ms = np.array(aio.run(_timer_floor(rate, n)), dtype=float) / 1e6
    p99 = float(np.percentile(delay_ms, 99))
    return {"requests": n, "p50_ms": float(np.percentile(delay_ms, 50)), "p99_ms": p99,
            "worst_worker_p99_ms": p99, "achieved_rate": rate}  # fmt: skip


def one_run(url: str, rate: float, seconds: float, workers: int, cores: list[int]) -> dict[str, Any]:
    n = max(int(rate * seconds), 10)
    factory = PromptFactory()
    specs = [RequestSpec(factory.cold(PROMPT_TOKENS), PROMPT_TOKENS, OUTPUT_TOKENS) for _ in range(n)]
    stage = Stage.scheduled("rate", parse_scheduler({"kind": "uniform", "rate": rate}), specs, max_requests=n)
    settings = SessionSettings.model_validate(
        {"base_url": url, "api": {"model": "sim"}, "drain_timeout_s": 60}
    )
    os.sched_setaffinity(0, set(cores[:1]) if workers == 1 else set(cores))
    result = aio.run(run_sessions(settings, [stage], workers))
    ok = [r for r in result.records if r.status == "ok"]
    sends = np.array([r.stream.t_send_ns for r in result.records], dtype=float)
    delay_ms = np.array([r.stream.t_send_ns - r.intended_ns for r in result.records], dtype=float) / 1e6
    span_s = (sends.max() - sends.min()) / 1e9
    per_worker = worker_delays(result)
    return {
        "requests": n,
        "ok": len(ok),
        "p50_ms": float(np.percentile(delay_ms, 50)),
        "p99_ms": float(np.percentile(delay_ms, 99)),
        "worst_worker_p99_ms": max(w["p99_ms"] for w in per_worker.values()),
        "achieved_rate": (n - 1) / span_s if span_s > 0 else float("nan"),
        "workers": per_worker,
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rates", type=float, nargs="+", default=[1000, 2000, 3000, 4000, 6000, 8000])
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--seconds", type=float, default=2.0, help="seconds of sends per run")
    parser.add_argument("--reps", type=int, default=3, help="interleaved repetitions (medians)")
    parser.add_argument(
        "--knee-ms", type=float, default=1.0, help="p99 schedule delay a kept schedule stays under"
    )
    parser.add_argument("--out", type=Path, help="also write the report as JSON here")
    args = parser.parse_args()
    if min(args.rates) <= 0 or min(args.workers) < 1 or args.reps < 1 or args.seconds <= 0:
        parser.error("rates and seconds must be > 0, workers and reps ≥ 1")
    cores = sorted(os.sched_getaffinity(0))
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    argv = [sys.executable, "-m", "engine_harness.sim", "--port", str(port), "--model", "sim"]
    sim = subprocess.Popen(
        [*argv, "--time-scale", "0", "--max-num-seqs", "4096"],
        preexec_fn=lambda: os.sched_setaffinity(0, {cores[-1]}), stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )  # fmt: skip
    load_before = os.getloadavg()
    runs: dict[str, list[dict[str, Any]]] = {}
    try:
        _wait_healthy(url)
        for w in args.workers:
            one_run(url, 200, 0.5, w, cores)  # warm both paths and the sim
        for rep in range(args.reps):
            for rate in args.rates:
                order = [0, *args.workers]  # 0: the timer floor, the yardstick
                for w in order if rep % 2 == 0 else order[::-1]:
                    if w == 0:
                        run = floor_run(rate, args.seconds, cores)
                    else:
                        run = one_run(url, rate, args.seconds, w, cores)
                    runs.setdefault(f"{w}@{rate:g}", []).append(run)
                    print(f"rep {rep} rate {rate:g} workers {w}: p99 {run['p99_ms']:.3g} ms", file=sys.stderr)
    finally:
        sim.terminate()
        sim.wait()
    table: dict[str, dict[str, dict[str, float]]] = {}
    for key, reps in runs.items():
        w, rate = key.split("@")
        table.setdefault(w, {})[rate] = {
            k: float(np.median([r[k] for r in reps]))
            for k in ("p50_ms", "p99_ms", "worst_worker_p99_ms", "achieved_rate")
        }
        # the least disturbed rep: what the generator does when the box leaves it alone
        table[w][rate]["best_p99_ms"] = float(min(r["p99_ms"] for r in reps))
    knees = {
        w: max((float(r) for r, row in rows.items()
                if row["p99_ms"] <= args.knee_ms and row["achieved_rate"] >= 0.9 * float(r)), default=None)
        for w, rows in table.items()
    }  # fmt: skip
    report = {
        "machine": f"{os.cpu_count()} cores; 1 worker on core {cores[0]}, the sim on core {cores[-1]}",
        "load_before": [round(x, 2) for x in load_before],
        "load_after": [round(x, 2) for x in os.getloadavg()],
        "medians": table,
        "knee_rate": knees,
        "runs": runs,
    }
    print(report["machine"], "; load average before/after", report["load_before"], "/", report["load_after"])
    print(f"{'workers':>8} {'rate':>8} {'p50 ms':>9} {'p99 ms':>9} {'worst w p99':>12} {'achieved/s':>11} "
          f"{'best p99':>9}")  # fmt: skip
    for w, rows in table.items():
        for rate, row in rows.items():
            print(f"{w:>8} {rate:>8} {row['p50_ms']:>9.3g} {row['p99_ms']:>9.3g} "
                  f"{row['worst_worker_p99_ms']:>12.3g} {row['achieved_rate']:>11.0f} "
                  f"{row['best_p99_ms']:>9.3g}")  # fmt: skip
    print(f"knee (highest rate with p99 ≤ {args.knee_ms:g} ms and ≥ 90% of it sent):", knees)
    if args.out:
        args.out.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
