"""The SSE client against a bare stamping client and ``vllm bench serve``'s, as ratios in one run.

A local server (a subprocess pinned to the last core, aiohttp on uvloop) streams vLLM-shaped completion
chunks and records ``perf_counter_ns`` right before each write (one clock for both processes: Linux's
CLOCK_MONOTONIC). The clients run in this process, pinned to core 0 (the report says where each side
was allowed to run, and says so loudly when they share a core), interleaved and in alternating order,
``--reps`` times each after one full-size warm-up round that is thrown away:

- ``minimal``: aiohttp + uvloop, per read one stamp and a count of ``data:`` events, no JSON (the yardstick);
- ``ours_lazy``: ``stream_request(lazy=True)``, as the load generator runs it (parsed after the streams;
  the deferred parse is measured apart, ``parse_us_per_chunk``, and added in ``ours_lazy+parse``);
- ``ours_end``: ``stream_request`` default (parsed when each body ends);
- ``ours_live``: ``stream_request`` with ``on_chunk`` (parsed per read, as the sweep's decode streams);
- ``ours_usage``: ``ours_lazy`` asking for usage in every chunk (``continuous_usage_stats``, the load
  generator's default: exact tokens per chunk, a longer stream to parse);
- ``vllm``: ``vllm.benchmarks.lib.endpoint_request_func.async_request_openai_completions`` on asyncio's
  loop and ``vllm bench serve``'s connector, as that tool runs it.

Ingest: ``--streams`` × ``--tokens`` chunks written as fast as the server can; chunks/s (wall: bounded
by the server too) and chunks per client CPU second (``time.process_time`` of this process: the rate one
core can ingest; its inverse, µs/chunk, is in the JSON). Fidelity: ``--paced-streams`` × ``--paced-tokens``,
one chunk per stream every ``--step-ms``; per chunk lag = client stamp − server write stamp, |ITL error| =
|client gap − server gap|; p50/p99 over all chunks. Every figure is a median over reps, printed beside the
median over reps of its ratio to ``minimal`` in the same rep and a 95 % bootstrap interval of that
median (resampling the reps): absolute numbers move with the box (and with the other processes on the
client's core), ratios within a rep much less, and the interval says how far they still do.

    .venv/bin/python scripts/bench_client.py [--reps 15] [--quick] [--out FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import operator
import os
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
from aiohttp import web

from engine_harness.launch import free_port
from engine_harness.process_group import child_preexec
from microbench.client import aio
from microbench.client.streams import StreamRecord, stream_request

Stamps = list[list[int]]  # per stream, one client stamp per content chunk
CHUNK = (
    b'data: {"id":"cmpl-0","object":"text_completion","created":0,"model":"m","choices":[{"index":0,'
    b'"text":"x","logprobs":null,"finish_reason":null,"stop_reason":null}],"usage":null}\n\n'
)
CHUNK_USAGE = CHUNK.replace(b'"usage":null', b'"usage":{"prompt_tokens":1,"completion_tokens":%d}')
TAIL = b'data: {"choices":[],"usage":{"prompt_tokens":1,"completion_tokens":%d}}\n\ndata: [DONE]\n\n'
USAGE = {"stream_options": {"include_usage": True, "continuous_usage_stats": True}}


# ---- the server: stamps each write -------------------------------------------------------------------


def serve(port: int, step_ms: float) -> None:
    stamps: dict[str, list[int]] = {}

    async def completions(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        n, mine = int(body["max_tokens"]), stamps.setdefault(str(body["prompt"]), [])
        usage = bool(body.get("stream_options", {}).get("continuous_usage_stats"))
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        t0 = time.perf_counter_ns()
        for i in range(n):
            if step_ms > 0:
                await asyncio.sleep(max(t0 + int((i + 1) * step_ms * 1e6) - time.perf_counter_ns(), 0) / 1e9)
            mine.append(time.perf_counter_ns())
            await resp.write(CHUNK_USAGE % (i + 1) if usage else CHUNK)
        await resp.write(TAIL % n)
        return resp

    async def take_stamps(_: web.Request) -> web.Response:
        out = dict(stamps)
        stamps.clear()
        return web.json_response(out)

    app = web.Application()
    app.router.add_post("/v1/completions", completions)
    app.router.add_get("/stamps", take_stamps)
    app.router.add_get("/health", lambda _: web.Response(text="ok"))  # type: ignore[arg-type,return-value]
    web.run_app(app, host="127.0.0.1", port=port, print=None, loop=aio_loop())


def aio_loop() -> asyncio.AbstractEventLoop:
    import uvloop

    return uvloop.new_event_loop()


# ---- the clients -------------------------------------------------------------------------------------


async def minimal(url: str, ids: list[str], tokens: int) -> Stamps:
    async def one(http: aiohttp.ClientSession, pid: str) -> list[int]:
        t_reads, n_reads = [], []
        async with http.post(url, json={"model": "m", "prompt": pid, "max_tokens": tokens}) as resp:
            async for data in resp.content.iter_any():
                t_reads.append(time.perf_counter_ns())
                n_reads.append(data.count(b"data:"))
        return [t for t, n in zip(t_reads, n_reads, strict=True) for _ in range(n)][:tokens]

    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as http:
        return list(await asyncio.gather(*(one(http, p) for p in ids)))


class Ours:
    """``stream_request`` in one of its modes; ``records`` keeps the last round's (its deferred parse is
    timed by the caller)."""

    def __init__(self, mode: str, usage: bool = False) -> None:
        self.mode, self.usage = mode, usage
        self.records: list[StreamRecord] = []

    async def __call__(self, url: str, ids: list[str], tokens: int) -> Stamps:
        recs = [StreamRecord() for _ in ids]
        watch = (lambda r: None) if self.mode == "live" else None
        extra = USAGE if self.usage else {}
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as http:
            await asyncio.gather(*(
                stream_request(http, url, {"model": "m", "prompt": p, "max_tokens": tokens, **extra}, r,
                               on_chunk=watch, lazy=self.mode == "lazy")
                for p, r in zip(ids, recs, strict=True)
            ))  # fmt: skip
        self.records = recs
        return [r._chunk_t_ns for r in recs] if self.mode == "lazy" else [r.chunk_t_ns for r in recs]


async def vllm(url: str, ids: list[str], tokens: int) -> Stamps:
    from vllm.benchmarks.lib.endpoint_request_func import RequestFuncInput, async_request_openai_completions

    inputs = [
        RequestFuncInput(prompt=p, api_url=url, prompt_len=1, output_len=tokens, model="m") for p in ids
    ]
    connector = aiohttp.TCPConnector(
        limit=0, limit_per_host=0, keepalive_timeout=60, enable_cleanup_closed=True
    )
    async with aiohttp.ClientSession(
        connector=connector, timeout=aiohttp.ClientTimeout(total=6 * 3600)
    ) as http:
        outs = await asyncio.gather(*(async_request_openai_completions(i, http) for i in inputs))
    stamps = []
    for o in outs:
        assert o.success, o.error
        t = o.start_time + o.ttft + np.concatenate([[0.0], np.cumsum(o.itl)])
        stamps.append([int(x * 1e9) for x in t])
    return stamps


CLIENTS: dict[str, tuple[Callable[..., Any], Callable[..., Awaitable[Stamps]]]] = {
    "minimal": (aio.run, minimal),
    "ours_lazy": (aio.run, Ours("lazy")),
    "ours_end": (aio.run, Ours("end")),
    "ours_live": (aio.run, Ours("live")),
    "ours_usage": (aio.run, Ours("lazy", usage=True)),
    "vllm": (asyncio.run, vllm),
}


LAZY = ("ours_lazy", "ours_usage")  # parsed after the streams: the parse is timed apart


# ---- measuring ---------------------------------------------------------------------------------------


def _get_json(url: str) -> Any:
    async def go() -> Any:
        async with aiohttp.ClientSession() as http, http.get(url) as resp:
            return await resp.json()

    return asyncio.run(go())


def _start_server(step_ms: float, cpu: int) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    cmd = [sys.executable, __file__, "--serve", str(port), "--step-ms", str(step_ms)]
    proc = subprocess.Popen(cmd, preexec_fn=child_preexec({cpu}))
    base = f"http://127.0.0.1:{port}"
    for _ in range(200):
        try:
            _get_json(base + "/stamps")
            return proc, base
        except (aiohttp.ClientError, OSError):
            time.sleep(0.05)
    proc.kill()
    raise RuntimeError("the stamping server did not start")


def one_rep(name: str, base: str, streams: int, tokens: int, rep: int) -> dict[str, Any]:
    runner, client = CLIENTS[name]
    ids = [f"{name}-{rep}-{i}" for i in range(streams)]
    cpu0, t0 = time.process_time_ns(), time.perf_counter_ns()
    stamps = runner(client(base + "/v1/completions", ids, tokens))
    cpu, wall = time.process_time_ns() - cpu0, time.perf_counter_ns() - t0
    out: dict[str, Any] = {"chunks": streams * tokens, "wall_ns": wall, "cpu_ns": cpu}
    records = getattr(client, "records", None)
    if name in LAZY and records is not None:
        p0 = time.process_time_ns()
        for r in records:
            r.settle()
        out["parse_ns"] = time.process_time_ns() - p0
        stamps = [r.chunk_t_ns for r in records]
    server = _get_json(base + "/stamps")
    lag, itl = [], []
    for pid, mine in zip(ids, stamps, strict=True):
        c, s = np.asarray(mine, dtype=np.int64), np.asarray(server[pid], dtype=np.int64)
        assert len(c) == len(s) == tokens, (name, len(c), len(s))
        lag.append(c - s)
        itl.append(np.abs(np.diff(c) - np.diff(s)))
    lag_ms, itl_ms = np.concatenate(lag) / 1e6, np.concatenate(itl) / 1e6
    out |= {f"lag_p{q}_ms": float(np.percentile(lag_ms, q)) for q in (50, 99)}
    out |= {f"itl_err_p{q}_ms": float(np.percentile(itl_ms, q)) for q in (50, 99)}
    return out


def interleaved(base: str, streams: int, tokens: int, reps: int) -> dict[str, list[dict[str, Any]]]:
    """``reps`` rounds of every client in alternating order, after one full-size round that is thrown
    away (first connections, caches, the server's own warm-up)."""
    names = list(CLIENTS)
    runs: dict[str, list[dict[str, Any]]] = {n: [] for n in names}
    for rep in range(reps + 1):
        for name in names[:: 1 if rep % 2 == 0 else -1]:
            run = one_rep(name, base, streams, tokens, rep)
            if rep:
                runs[name].append(run)
    return runs


FIGURES: dict[str, tuple[str, Callable[[dict[str, Any]], float]]] = {
    "chunks_per_s": ("ingest", lambda r: r["chunks"] / r["wall_ns"] * 1e9),
    "chunks_per_cpu_s": ("ingest", lambda r: r["chunks"] / r["cpu_ns"] * 1e9),
    "cpu_us_per_chunk": ("ingest", lambda r: r["cpu_ns"] / r["chunks"] / 1e3),
    **{
        k: ("fidelity", operator.itemgetter(k))
        for k in ("lag_p50_ms", "lag_p99_ms", "itl_err_p50_ms", "itl_err_p99_ms")
    },
}


def median_ci(values: np.ndarray, n_boot: int = 2000, seed: int = 0) -> tuple[float, float, float]:
    """The median of ``values`` and a 95 % bootstrap interval of it (resampling the reps)."""
    rng = np.random.default_rng(seed)
    boots = np.median(rng.choice(values, size=(n_boot, values.size)), axis=1)
    return float(np.median(values)), float(np.percentile(boots, 2.5)), float(np.percentile(boots, 97.5))


def summarise(runs: dict[str, dict[str, list[dict[str, Any]]]]) -> dict[str, Any]:
    """Per client and figure: the median over reps, and the median over reps of its ratio to ``minimal``
    in the same rep (a rep the box slowed for every client keeps its ratios) with its 95 % bootstrap
    interval; a lazy client also with its deferred parse added (``+parse``)."""
    table: dict[str, dict[str, float]] = {}
    ratios: dict[str, dict[str, list[float]]] = {}
    for name in runs["ingest"]:
        table[name], ratios[name] = {}, {}
        for key, (kind, f) in FIGURES.items():
            mine = np.array([f(r) for r in runs[kind][name]])
            base = np.array([f(r) for r in runs[kind]["minimal"]])
            table[name][key] = float(np.median(mine))
            ratios[name][key] = list(median_ci(mine / base))
    base = np.array([FIGURES["cpu_us_per_chunk"][1](r) for r in runs["ingest"]["minimal"]])
    for name in LAZY:
        parse = np.array([r["parse_ns"] / r["chunks"] / 1e3 for r in runs["ingest"][name]])
        table[name]["parse_us_per_chunk"] = float(np.median(parse))
        cpu = np.array([FIGURES["cpu_us_per_chunk"][1](r) for r in runs["ingest"][name]]) + parse
        table[f"{name}+parse"] = {
            "cpu_us_per_chunk": float(np.median(cpu)),
            "chunks_per_cpu_s": float(np.median(1e6 / cpu)),
        }
        ratios[f"{name}+parse"] = {
            "cpu_us_per_chunk": list(median_ci(cpu / base)),
            "chunks_per_cpu_s": list(median_ci(base / cpu)),
        }
    return {"figures": table, "ratios_to_minimal": ratios}


def pinning(cores: list[int], servers: list[subprocess.Popen[bytes]]) -> str:
    """What this process and the servers are allowed to run on: a figure whose client and server share a
    core measures their contention, so the report says so."""
    mine = sorted(os.sched_getaffinity(0))
    theirs = sorted(set().union(*(os.sched_getaffinity(p.pid) for p in servers)))
    text = f"{os.cpu_count()} cores; client on core(s) {mine}, servers on {theirs}"
    if len(cores) < 2 or set(mine) & set(theirs):
        text += " — NOT apart: client and server share a core, the figures include their contention"
    return text


def _print(report: dict[str, Any]) -> None:
    cols = (
        "chunks_per_s",
        "chunks_per_cpu_s",
        "lag_p50_ms",
        "lag_p99_ms",
        "itl_err_p50_ms",
        "itl_err_p99_ms",
    )
    print(f"{report['machine']}; load average before/after {report['load_before']} / {report['load_after']}")
    print(f"{report['reps']} reps after a discarded warm-up rep; cells: median (median of per-rep ratios to "
          "minimal [95% bootstrap interval])")  # fmt: skip
    print(f"{'client':17}" + "".join(f"{c:>31}" for c in cols))
    for name, row in report["figures"].items():
        ratio = report["ratios_to_minimal"][name]
        cells = [
            f"{row[c]:.4g} ({ratio[c][0]:.2f}x [{ratio[c][1]:.2f},{ratio[c][2]:.2f}])" if c in row else "-"
            for c in cols
        ]
        print(f"{name:17}" + "".join(f"{c:>31}" for c in cells))
    for name in LAZY:
        print(f"{name} deferred parse: {report['figures'][name]['parse_us_per_chunk']:.3g} µs/chunk")


# many short reps rather than a few long ones: a stall of the box spoils one rep, and the median of
# per-rep ratios (and its interval) shrugs off a few spoiled ones
QUICK = {"reps": 8, "streams": 16, "tokens": 500, "paced_streams": 64, "paced_tokens": 100}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--reps", type=int, default=15, help="interleaved repetitions per client (medians)")
    parser.add_argument("--streams", type=int, default=32, help="ingest: concurrent streams")
    parser.add_argument("--tokens", type=int, default=2000, help="ingest: chunks per stream")
    parser.add_argument("--paced-streams", type=int, default=64, help="fidelity: concurrent streams")
    parser.add_argument("--paced-tokens", type=int, default=200, help="fidelity: chunks per stream")
    parser.add_argument("--step-ms", type=float, default=5.0, help="fidelity: one chunk per stream every …")
    parser.add_argument("--quick", action="store_true", help=f"{QUICK} (about 2 minutes)")
    parser.add_argument("--out", type=Path, help="also write the report as JSON here")
    parser.add_argument("--serve", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve(args.serve, args.step_ms)
        return
    if args.quick:
        vars(args).update(QUICK)
    if args.reps < 2 or min(args.streams, args.tokens, args.paced_streams, args.paced_tokens) < 2:
        parser.error("--reps and the stream counts and lengths must be ≥ 2")
    cores = sorted(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {cores[0]})
    import vllm.benchmarks.lib.endpoint_request_func  # noqa: F401  (a slow import: not inside a run)

    load_before = os.getloadavg()
    fast, fast_url = _start_server(0.0, cores[-1])
    paced, paced_url = _start_server(args.step_ms, cores[-1])
    try:
        machine = pinning(cores, [fast, paced])
        ingest = interleaved(fast_url, args.streams, args.tokens, args.reps)
        fidelity = interleaved(paced_url, args.paced_streams, args.paced_tokens, args.reps)
    finally:
        for proc in (fast, paced):
            proc.terminate()
            proc.wait()
    report = {
        "machine": machine,
        "load_before": [round(x, 2) for x in load_before],
        "load_after": [round(x, 2) for x in os.getloadavg()],
        "reps": args.reps,
        **summarise({"ingest": ingest, "fidelity": fidelity}),
        "runs": {"ingest": ingest, "fidelity": fidelity},
    }
    _print(report)
    if args.out:
        args.out.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
