"""Where one load-generation process stops keeping its schedule, and what N worker processes reach.

The sim engine runs as ``--sims K`` subprocesses (default 1) on one port (SO_REUSEPORT), each pinned to
its own core at the top of the core list, taking whole physical cores (SMT siblings together;
``--time-scale 0``: answers at once, short outputs; with ``--sim-step-ms S`` every step takes S ms, so
requests share steps and a sim costs less per request), so the figure is the load generator's own. For
each rate of ``--rates`` (uniform spacing, ``--seconds`` of sends) and each worker count N of
``--workers``, interleaved and in alternating order, ``--reps`` times: schedule delay (actual − intended
send) p50/p99 over all first-round sends, the worst worker's p99, the achieved send rate, and the
client's CPU µs per request (the workers' CPU time from the stage's start to their last send, summed, per
request sent). That includes the spin before each send (the last millisecond) and the loop's polling for
timers under a millisecond away: from about 1000 req/s on, one worker is busy the whole gap (CPU µs/req ≈
10⁶/rate, with the spin or without: 497 µs at 2000 req/s with no spin on a 2-core VM, 2026-11-30), so the
figure says what the worker spends, not what a request costs; where it saturates is the knee. Worker k of
N runs pinned to the first core of the k-th physical core the sims leave free, its SMT siblings left idle
(two workers, or a worker and a sim, on siblings would share one core's throughput; the report gives the
topology it read); when they do not fit (2 workers beside 1 sim on a 2-core box) they share every core,
and their row is no scaling figure. No core left for the workers is refused. Beside them, two yardsticks
in the same run, on core 0: row ``timer``, the same schedule kept by a bare loop that sends nothing (the
lateness the box's own scheduling causes: on a shared, loaded box it sets the floor of every p99), and
its CPU per tick; row ``bare``, the same schedule, payloads and spin sent by a bare aiohttp + uvloop
client that per send only posts the body and stamps and keeps each read, the interpreter's collector left
at its defaults (a stamping client written the plain way on the same library; on an H200 machine's Xeon
core on 2026-11-30 it kept p99 ≤ 1 ms to 4000 req/s, one worker to 6000). ``ours/bare knee`` is one
worker's knee over the bare sender's. ``sim E2E p50``, ``sim CPU`` (the busiest sim's share of a core over
the run) and ``sim µs/req`` (the sims' CPU time over the run per request planned) say whether the sims kept
up (a sim that falls behind piles requests up, and each one past the connection pool is a new connection for
the client to open); ``overflows``: this host's handshakes dropped over the run because a server's accept
queue was full (``TcpExt: ListenOverflows``), each a request held up by a 1-s retransmit (the sims and
responders listen with ``API_LISTEN_BACKLOG``, 2048, vLLM's and SGLang's). With ``--server canned`` the K
processes are not sims but canned responders: a bare ``asyncio.Protocol`` on uvloop that answers every POST
with one write of the same vLLM-shaped stream (``engine_harness.sim.openai_wire.StreamEncoder``: 4 token
events with running usage, the usage event, ``[DONE]``) and every GET with a model list: a server far
cheaper per request than the sim, so the figures are the load generator's even where the sims would fall
behind (the ``sim`` columns are then the responders'). ``--warm-connections K``: each worker opens K
connections before its stage (``SessionSettings.warm_connections``), so a late burst reuses them instead of
connecting. With ``--vllm``, row ``vllm``: ``vllm bench serve``'s own loop (``get_request``, burstiness=inf,
and its request function on asyncio's loop), pinned like one worker; its intended time is ``start +
(i+1)/rate``.

The garbage collector's part: the collector passes that began in each run's sending window (every
worker's), their longest pause, and the late sends (later than ``--knee-ms``) that a pass could explain
(one ran, or had ended ≤ 5 ms before the send was due), beside the share of the window that near a pass
(what chance would give): ``microbench.loadgen.lateness``.

The knee of each row is the highest rate at which the median p99 stays ≤ ``--knee-ms`` (1 ms) and the
sends keep ≥ 98 % of the rate. ``best p99`` is the lowest p99 of the reps: the generator when the box
left it alone. Per N > 1 a line ``scaling N=…`` gives knee(N)/knee(1) and the peak sent rate of N over
one worker's, beside the aim 0.9·N. ``--quick``: rates 2000–5000, 2 reps of 1 s. A request still in
flight 3 s after the last send is cancelled (the figures are the sends').

    .venv/bin/python scripts/bench_loadgen_rate.py [--rates 1000 2000 4000 6000] [--workers 1 2] [--vllm]
        [--sims K] [--quick] [--out F]
    # a 16-core machine: 8 sims on cores 8-15, workers pinned to cores 0..N-1
    .venv/bin/python scripts/bench_loadgen_rate.py --sims 8 --workers 1 2 4 8 \\
        --rates 2000 4000 6000 8000 12000 16000 24000 30000 --out loadgen-16.json
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
import msgspec
import numpy as np
import psutil

from engine_harness.engines import API_LISTEN_BACKLOG
from engine_harness.launch import free_port
from engine_harness.process_group import child_preexec
from engine_harness.sim.openai_wire import DONE_EVENT, StreamEncoder
from microbench.client import aio
from microbench.client.requests import ApiSettings, RequestSpec, build_payload
from microbench.loadgen.handshakes import listen_overflows
from microbench.loadgen.lateness import gc_lateness
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


async def _wait_until(target: int) -> None:
    """Sleep until ``target``, yielding to the loop for the last millisecond, as ``LoadSession`` does."""
    if (remaining := target - time.perf_counter_ns() - 1_000_000) > 0:
        await asyncio.sleep(remaining / 1e9)
    while time.perf_counter_ns() < target:  # noqa: ASYNC110
        await asyncio.sleep(0)


async def _timer_floor(rate: float, n: int) -> list[int]:
    """The yardstick: the same schedule kept by a loop that sends nothing: the lateness this box's
    scheduler alone causes."""
    start, delays = time.perf_counter_ns() + 50_000_000, []
    for i in range(n):
        target = start + int(i * 1e9 / rate)
        await _wait_until(target)
        delays.append(time.perf_counter_ns() - target)
    return delays


def floor_run(rate: float, seconds: float, cores: list[int]) -> dict[str, Any]:
    n = max(int(rate * seconds), 10)
    os.sched_setaffinity(0, set(cores[:1]))
    cpu0 = time.process_time()
    delay_ms = np.array(aio.run(_timer_floor(rate, n)), dtype=float) / 1e6
    p99 = float(np.percentile(delay_ms, 99))
    return {"requests": n, "p50_ms": float(np.percentile(delay_ms, 50)), "p99_ms": p99,
            "worst_worker_p99_ms": p99, "achieved_rate": rate,
            "cpu_us_per_request": (time.process_time() - cpu0) / n * 1e6}  # fmt: skip


def _schedule_figures(n: int, sends_s: np.ndarray, delay_ms: np.ndarray) -> dict[str, Any]:
    """A sending row's schedule figures: ``n`` requests planned, sent at ``sends_s`` (any origin), each
    ``delay_ms`` after its intended time: delay p50/p99 (the worst worker's: the p99, one sender) and the
    rate achieved between the first send and the last."""
    span_s = float(sends_s.max() - sends_s.min())
    p99 = float(np.percentile(delay_ms, 99))
    achieved = (n - 1) / span_s if span_s > 0 else float("nan")
    return {"requests": n, "p50_ms": float(np.percentile(delay_ms, 50)), "p99_ms": p99,
            "worst_worker_p99_ms": p99, "achieved_rate": achieved}  # fmt: skip


async def _bare_sends(
    url: str, rate: float, bodies: list[bytes]
) -> tuple[list[int], list[int], list[int], float]:
    """The library's yardstick: the same schedule sent by a bare aiohttp + uvloop client that does per send
    only what every stamping client must (post the body; per read one stamp, the bytes kept): intended
    and actual send times, each request's span to its body's end (-1: it failed) and the CPU seconds
    from the first send to the last."""
    reads: list[list[tuple[int, bytes]]] = [[] for _ in bodies]
    sent, done = [0] * len(bodies), [-1] * len(bodies)
    headers = {"Content-Type": "application/json"}

    async def one(i: int) -> None:
        sent[i] = time.perf_counter_ns()
        try:
            async with http.post(url, data=bodies[i], headers=headers) as resp:
                async for data in resp.content.iter_any():
                    reads[i].append((time.perf_counter_ns(), data))
            done[i] = time.perf_counter_ns() - sent[i]
        except aiohttp.ClientError:
            pass

    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as http:
        start, tasks = time.perf_counter_ns() + 50_000_000, []
        intended = [start + int(i * 1e9 / rate) for i in range(len(bodies))]
        await _wait_until(start)
        cpu0 = time.process_time()
        for i, target in enumerate(intended):
            await _wait_until(target)
            tasks.append(asyncio.create_task(one(i)))
        issue_cpu_s = time.process_time() - cpu0
        _, late = await asyncio.wait(tasks, timeout=3)  # the workers' drain timeout
        for task in late:
            task.cancel()
    return intended, sent, done, issue_cpu_s


def bare_run(url: str, rate: float, seconds: float, cores: list[int]) -> dict[str, Any]:
    """The schedule kept by the bare sender (``_bare_sends``) on core ``cores[0]``, the same payloads as
    the workers' (``build_payload``), CPU µs per request over its sending window."""
    n = max(int(rate * seconds), 10)
    factory, api = PromptFactory(), ApiSettings(model="sim")
    bodies = [
        msgspec.json.encode({**build_payload(RequestSpec(factory.cold(PROMPT_TOKENS), PROMPT_TOKENS,
                                                         OUTPUT_TOKENS), api), "stream": True})
        for _ in range(n)
    ]  # fmt: skip
    os.sched_setaffinity(0, set(cores[:1]))
    intended, sent, done, issue_cpu_s = aio.run(_bare_sends(url + "/v1/completions", rate, bodies))
    sends = np.array(sent, dtype=float)
    ok = [d for d in done if d >= 0]
    return {**_schedule_figures(n, sends / 1e9, (sends - np.array(intended, dtype=float)) / 1e6),
            "ok": len(ok), "cpu_us_per_request": issue_cpu_s / n * 1e6,
            "e2e_p50_ms": float(np.median(ok) / 1e6) if ok else float("nan")}  # fmt: skip


def vllm_run(url: str, rate: float, seconds: float, cores: list[int]) -> dict[str, Any]:
    """``vllm bench serve``'s loop keeping the same schedule: its ``get_request`` with burstiness=inf
    (constant gaps) driving its request function, on asyncio's loop, pinned like one worker."""
    from vllm.benchmarks.datasets import SampleRequest
    from vllm.benchmarks.lib.endpoint_request_func import RequestFuncInput, async_request_openai_completions
    from vllm.benchmarks.serve import get_request

    n = max(int(rate * seconds), 10)
    factory = PromptFactory()
    samples = [SampleRequest(prompt=factory.cold(PROMPT_TOKENS), prompt_len=PROMPT_TOKENS,
                             expected_output_len=OUTPUT_TOKENS) for _ in range(n)]  # fmt: skip
    inputs = {id(s): RequestFuncInput(prompt=s.prompt, api_url=url + "/v1/completions",
                                      prompt_len=PROMPT_TOKENS, output_len=OUTPUT_TOKENS, model="sim",
                                      ignore_eos=True)
              for s in samples}  # fmt: skip

    async def go() -> tuple[float, float, list[Any]]:
        connector = aiohttp.TCPConnector(
            limit=0, limit_per_host=0, keepalive_timeout=60, enable_cleanup_closed=True
        )
        async with aiohttp.ClientSession(
            connector=connector, timeout=aiohttp.ClientTimeout(total=600)
        ) as http:
            tasks, start, cpu0 = [], time.perf_counter(), time.process_time()
            async for request, _ in get_request(samples, rate, burstiness=float("inf")):
                tasks.append(asyncio.create_task(async_request_openai_completions(inputs[id(request)], http)))
            issue_cpu_s = time.process_time() - cpu0  # over the sending window, as the workers' rows
            return start, issue_cpu_s, list(await asyncio.gather(*tasks))

    os.sched_setaffinity(0, set(cores[:1]))
    start, issue_cpu_s, outputs = asyncio.run(go())
    sends = np.array([o.start_time for o in outputs])
    delay_ms = np.array([(o.start_time - (start + (i + 1) / rate)) * 1e3 for i, o in enumerate(outputs)])
    return {**_schedule_figures(n, sends, delay_ms), "ok": sum(o.success for o in outputs),
            "cpu_us_per_request": issue_cpu_s / n * 1e6,
            "e2e_p50_ms": float(np.median([o.latency for o in outputs if o.success]) * 1e3)}  # fmt: skip


def one_run(
    url: str,
    rate: float,
    seconds: float,
    workers: int,
    cores: list[int],
    pinned: list[int] | None,
    knee_ms: float,
    warm: int = 0,
) -> dict[str, Any]:
    """``workers`` processes keeping the schedule, worker k on core ``pinned[k]`` (None: on ``cores``),
    each with ``warm`` connections opened before the stage."""
    n = max(int(rate * seconds), 10)
    factory = PromptFactory()
    specs = [RequestSpec(factory.cold(PROMPT_TOKENS), PROMPT_TOKENS, OUTPUT_TOKENS) for _ in range(n)]
    stage = Stage.scheduled("rate", parse_scheduler({"kind": "uniform", "rate": rate}), specs, max_requests=n)
    settings = SessionSettings.model_validate(
        {"base_url": url, "api": {"model": "sim"}, "drain_timeout_s": 3, "warm_connections": warm}
    )
    os.sched_setaffinity(0, set(cores) if pinned is None else set(pinned))
    result = aio.run(run_sessions(settings, [stage], workers, cores=pinned))
    outcome = result.stages[0]
    gc_figures = gc_lateness(
        outcome.gc_passes,
        (outcome.start_ns, outcome.issue_end_ns),
        [(r.intended_ns, r.stream.t_send_ns) for r in result.records if r.stream.t_send_ns],
        late_ms=knee_ms,
    )
    ok = [r for r in result.records if r.status == "ok"]
    sends = np.array([r.stream.t_send_ns for r in result.records], dtype=float)
    delay_ms = np.array([r.stream.t_send_ns - r.intended_ns for r in result.records], dtype=float) / 1e6
    per_worker = worker_delays(result)
    return {
        **_schedule_figures(n, sends / 1e9, delay_ms),
        "ok": len(ok),
        "worst_worker_p99_ms": max(w["p99_ms"] for w in per_worker.values()),
        # over the issuing window (start to last send), not the run's start-up, drain and parsing
        "cpu_us_per_request": outcome.issue_cpu_s / max(outcome.issued, 1) * 1e6,
        # did the sim keep up? A sim that falls behind piles up requests, each a new connection to open
        "max_in_flight": float(result.stages[0].max_in_flight),
        "e2e_p50_ms": float(np.median([r.stream.t_done_ns - r.stream.t_send_ns for r in ok]) / 1e6)
        if ok
        else float("nan"),
        "gc_passes": float(sum(gc_figures["passes_by_generation"])),
        "gc_pause_total_ms": gc_figures["pause_total_ms"],
        "gc_pause_max_ms": gc_figures["pause_max_ms"],
        "late_sends": float(gc_figures["late_sends"]),
        "late_sends_near_gc": float(gc_figures["late_sends_near_a_pass"]),
        "window_share_near_gc": gc_figures["window_share_near_a_pass"],
        "gc": gc_figures,
        "workers": per_worker,
    }


KNEE_SENT = 0.98  # a rate counts as kept when at least this share of it was sent
FIGURES = ("p50_ms", "p99_ms", "worst_worker_p99_ms", "achieved_rate", "cpu_us_per_request", "e2e_p50_ms",
           "gc_passes", "gc_pause_total_ms", "gc_pause_max_ms", "late_sends",
           "late_sends_near_gc", "window_share_near_gc", "sim_cpu_max", "sim_cpu_us_per_request",
           "listen_overflows")  # fmt: skip


def knees(table: dict[str, dict[str, dict[str, float]]], knee_ms: float) -> dict[str, float | None]:
    """Per row, the highest rate whose median p99 is ≤ ``knee_ms`` with ≥ 98 % of the rate sent."""
    return {
        row: max((float(r) for r, fig in rates.items()
                  if fig["p99_ms"] <= knee_ms and fig["achieved_rate"] >= KNEE_SENT * float(r)), default=None)
        for row, rates in table.items()
    }  # fmt: skip


def core_groups(cores: list[int], sysfs: Path = Path("/sys/devices/system/cpu")) -> list[list[int]]:
    """``cores`` grouped by physical core (SMT siblings together, from ``thread_siblings_list``), groups in
    order of their first core; a core whose topology is unreadable is a group of its own."""
    groups: dict[frozenset[int], list[int]] = {}
    for core in cores:
        try:
            text = (sysfs / f"cpu{core}" / "topology" / "thread_siblings_list").read_text().strip()
            siblings = frozenset(_cpu_list(text))
        except (OSError, ValueError):
            siblings = frozenset({core})
        groups.setdefault(siblings, []).append(core)
    return sorted(groups.values())


def _cpu_list(text: str) -> list[int]:
    """A kernel CPU list (``0-3,8,10-11``) as the cores it names."""
    out: list[int] = []
    for part in text.split(","):
        first, _, last = part.partition("-")
        out.extend(range(int(first), int(last or first) + 1))
    return out


def sim_placement(groups: list[list[int]], sims: int) -> list[int]:
    """The ``sims`` cores the sims run on: whole physical cores from the top, so no sim shares a physical
    core with a worker (an SMT sibling spinning beside a worker takes its core's throughput). No
    physical core left for the load generator is an error."""
    taken: list[int] = []
    for group in reversed(groups):
        if len(taken) >= sims:
            break
        taken = sorted(taken + group)
    if len(taken) < sims or len(taken) == sum(map(len, groups)):
        raise ValueError(
            f"{sims} sim process(es) and the load generator need more cores than the {sum(map(len, groups))} "
            f"this process may use ({len(groups)} physical: {groups}); ask for fewer --sims"
        )
    return taken[len(taken) - sims :]


def placement(groups: list[list[int]], workers: int, sim_cores: list[int]) -> list[int] | None:
    """The cores worker k of ``workers`` is pinned to: the first core of the k-th physical core the sims
    leave free (its SMT siblings stay idle), or None when there are fewer such physical cores than
    workers: they then share every core (not a scaling figure)."""
    free = [group[0] for group in groups if not set(group) & set(sim_cores)]
    return free[:workers] if workers <= len(free) else None


def scaling(knee: dict[str, float | None], peak: dict[str, float]) -> dict[str, dict[str, float | None]]:
    """Per worker count N: knee(N)/knee(1) and peak sent rate(N)/peak(1), beside the 0.9·N aim."""
    out: dict[str, dict[str, float | None]] = {}
    for row in (r for r in peak if r.isdigit() and r != "1"):
        k1, kn = knee.get("1"), knee.get(row)
        out[row] = {
            "knee_ratio": kn / k1 if k1 and kn else None,
            "peak_ratio": peak[row] / peak["1"] if peak.get("1") else None,
            "aim": 0.9 * int(row),
        }
    return out


def _cpu_s(procs: list[psutil.Process]) -> np.ndarray:
    return np.array([sum(p.cpu_times()[:2]) for p in procs])


def measure(
    args: argparse.Namespace,
    url: str,
    cores: list[int],
    pinned: dict[int, list[int] | None],
    sims: list[psutil.Process],
) -> dict[str, list[dict[str, Any]]]:
    """Every row at every rate, ``--reps`` times, interleaved and in alternating order; beside each run,
    the busiest sim's CPU share over it (≈ 1: that sim, not the load generator, set the pace)."""
    for w in args.workers:
        one_run(url, 200, 0.5, w, cores, pinned[w], args.knee_ms, args.warm_connections)  # warm every path
    bare_run(url, 200, 0.5, cores)
    rows: list[str] = ["timer", "bare", *map(str, args.workers), *(["vllm"] if args.vllm else [])]
    if args.vllm:
        vllm_run(url, 200, 0.5, cores)
    runs: dict[str, list[dict[str, Any]]] = {}
    for rep in range(args.reps):
        for rate in args.rates:
            for row in rows if rep % 2 == 0 else rows[::-1]:
                sim_cpu0, wall0, overflows0 = _cpu_s(sims), time.perf_counter(), listen_overflows()
                if row == "timer":
                    run = floor_run(rate, args.seconds, cores)
                elif row == "bare":
                    run = bare_run(url, rate, args.seconds, cores)
                elif row == "vllm":
                    run = vllm_run(url, rate, args.seconds, cores)
                else:
                    run = one_run(url, rate, args.seconds, int(row), cores, pinned[int(row)], args.knee_ms,
                                  args.warm_connections)  # fmt: skip
                sim_cpu = _cpu_s(sims) - sim_cpu0
                run["sim_cpu_max"] = float(max(sim_cpu) / (time.perf_counter() - wall0))
                run["sim_cpu_us_per_request"] = float(sum(sim_cpu) / run["requests"] * 1e6)
                overflows = listen_overflows()
                run["listen_overflows"] = (
                    float(overflows - overflows0)
                    if overflows is not None and overflows0 is not None
                    else float("nan")
                )
                runs.setdefault(f"{row}@{rate:g}", []).append(run)
                print(f"rep {rep} rate {rate:g} {row}: p99 {run['p99_ms']:.3g} ms", file=sys.stderr)
    return runs


def start_sims(port: int, sim_cores: list[int], step_ms: float = 0.0) -> list[subprocess.Popen[bytes]]:
    """One sim process per core of ``sim_cores``, all on ``port`` (SO_REUSEPORT: the kernel spreads the
    connections between them); ``wait_listening`` waits for them. ``step_ms`` 0: steps take no time (a
    request's 4 tokens are 4 steps of its own, ≈ 550-700 µs of a sim core per request on a Xeon core);
    else every step takes ``step_ms`` whatever it holds, so the requests that arrive meanwhile share the
    next one and the sims' cost per request falls with the rate (what a real engine's batching does)."""
    timing = ["--time-scale", "0"]
    if step_ms > 0:
        timing = ["--time-scale", "1", "--busy-wait-ms", "0", "--alpha-ms", str(step_ms), "--beta-d-ms", "0",
                  "--beta-c-ms", "0", "--gamma-ns", "0"]  # fmt: skip
    argv = [sys.executable, "-m", "engine_harness.sim", "--port", str(port), "--model", "sim", "--reuse-port",
            *timing, "--max-num-seqs", "4096"]  # fmt: skip
    return _one_per_core(argv, sim_cores)


def _one_per_core(argv: list[str], cores: list[int]) -> list[subprocess.Popen[bytes]]:
    """``argv`` started once per core of ``cores``, each pinned to its core, its stdout piped (the start
    line ``wait_listening`` reads)."""
    return [
        subprocess.Popen(
            argv, preexec_fn=child_preexec({core}), stdout=subprocess.PIPE, stderr=subprocess.DEVNULL
        )
        for core in cores
    ]


def canned_answer() -> bytes:
    """The canned responder's answer to a POST: a whole HTTP response, one write."""
    encoder = StreamEncoder("completion", "cmpl-canned", 0, "sim", PROMPT_TOKENS, True, True, "fp")
    events = [encoder.token_event("a", i + 1, "length" if i + 1 == OUTPUT_TOKENS else None)
              for i in range(OUTPUT_TOKENS)]  # fmt: skip
    body = b"".join(events) + encoder.usage_event(OUTPUT_TOKENS) + DONE_EVENT
    head = f"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncontent-length: {len(body)}\r\n\r\n"
    return head.encode() + body


_MODELS = b'{"object":"list","data":[{"id":"sim","object":"model"}]}'
_MODELS_ANSWER = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s" % (
    len(_MODELS),
    _MODELS,
)


class CannedResponder(asyncio.Protocol):
    """HTTP/1.1 keep-alive: per request (its head and ``content-length`` body read) one canned write."""

    def __init__(self, answer: bytes) -> None:
        self.answer, self.buffer = answer, b""
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's TCPTransport: a WriteTransport

    def data_received(self, data: bytes) -> None:
        assert self.transport is not None
        self.buffer += data
        while (end := self.buffer.find(b"\r\n\r\n")) >= 0:
            head = self.buffer[:end].lower()
            length, at = 0, head.find(b"content-length:")
            if at >= 0:
                stop = head.find(b"\r\n", at)  # -1: the head's last line
                length = int(head[at + 15 : stop if stop >= 0 else None])
            if len(self.buffer) < end + 4 + length:
                return
            self.buffer = self.buffer[end + 4 + length :]
            self.transport.write(self.answer if head.startswith(b"post") else _MODELS_ANSWER)


def serve_canned(port: int) -> None:
    """Run one canned responder on ``port`` (SO_REUSEPORT) until killed; prints its start line."""

    async def main() -> None:
        answer = canned_answer()
        loop = asyncio.get_running_loop()
        server = await loop.create_server(
            lambda: CannedResponder(answer), "127.0.0.1", port, reuse_port=True, backlog=API_LISTEN_BACKLOG
        )
        print("serving canned answers", flush=True)
        await server.serve_forever()

    aio.run(main())


def start_canned(port: int, cores: list[int]) -> list[subprocess.Popen[bytes]]:
    """One canned responder per core of ``cores``, all on ``port``; ``wait_listening`` waits for them."""
    return _one_per_core([sys.executable, __file__, "--serve-canned", str(port)], cores)


def wait_listening(sims: list[subprocess.Popen[bytes]]) -> None:
    """Return once every sim process has printed its start line (it listens)."""
    for sim in sims:
        assert sim.stdout is not None
        if b"serving" not in sim.stdout.readline():
            raise RuntimeError(f"a sim process did not start (exit status {sim.wait()})")


def summarize(runs: dict[str, list[dict[str, Any]]]) -> dict[str, dict[str, dict[str, float]]]:
    """Per row and rate, the median of each figure over the reps, and the best rep's p99."""
    table: dict[str, dict[str, dict[str, float]]] = {}
    for key, reps in runs.items():
        row, rate = key.split("@")
        table.setdefault(row, {})[rate] = {
            k: float(np.median([r.get(k, np.nan) for r in reps])) for k in FIGURES
        }
        # the least disturbed rep: what the generator does when the box leaves it alone
        table[row][rate]["best_p99_ms"] = float(min(r["p99_ms"] for r in reps))
    return table


def print_report(report: dict[str, Any], knee_ms: float) -> None:
    print(report["machine"], "; load average before/after", report["load_before"], "/", report["load_after"])
    print(f"{'row':>8} {'rate':>8} {'p50 ms':>9} {'p99 ms':>9} {'worst w p99':>12} {'achieved/s':>11} "
          f"{'best p99':>9} {'CPU µs/req':>11} {'sim E2E p50':>12} {'sim CPU':>8} {'sim µs/req':>11} "
          f"{'GC passes':>10} {'GC max ms':>10} {'late near GC/late (chance)':>27} "
          f"{'overflows':>9}")  # fmt: skip
    for row, rates in report["medians"].items():
        for rate, fig in rates.items():
            print(f"{row:>8} {rate:>8} {fig['p50_ms']:>9.3g} {fig['p99_ms']:>9.3g} "
                  f"{fig['worst_worker_p99_ms']:>12.3g} {fig['achieved_rate']:>11.0f} "
                  f"{fig['best_p99_ms']:>9.3g} {fig['cpu_us_per_request']:>11.0f} "
                  f"{fig['e2e_p50_ms']:>12.3g} {fig['sim_cpu_max']:>8.0%} "
                  f"{fig['sim_cpu_us_per_request']:>11.0f} {fig['gc_passes']:>10.3g} "
                  f"{fig['gc_pause_max_ms']:>10.3g} "
                  f"{fig['late_sends_near_gc']:>9.0f}/{fig['late_sends']:<6.0f} "
                  f"({fig['window_share_near_gc']:.0%}) {fig['listen_overflows']:>9.3g}")  # fmt: skip
    print(f"knee (highest rate with p99 ≤ {knee_ms:g} ms and ≥ {KNEE_SENT:.0%} of it sent):")
    for row, knee in report["knee_rate"].items():
        print(f"  {row:>6}: {'none' if knee is None else f'{knee:g} req/s'}")
    if report["knee_rate"].get("bare") and report["knee_rate"].get("1"):
        ratio = report["knee_rate"]["1"] / report["knee_rate"]["bare"]
        print(f"ours/bare knee: {ratio:.2f} (one worker over the bare sender's on the same core)")
    for row, fig in report["scaling"].items():
        knee_ratio = "n/a" if fig["knee_ratio"] is None else f"{fig['knee_ratio']:.2f}"
        peak_ratio = "n/a" if fig["peak_ratio"] is None else f"{fig['peak_ratio']:.2f}"
        shared = (
            "" if report["pinned"][row] else "  (workers share cores with the servers: not a scaling figure)"
        )
        print(f"scaling N={row}: knee(N)/knee(1) {knee_ratio}, peak sent(N)/peak(1) {peak_ratio}, "
              f"aim ≥ {fig['aim']:.1f}{shared}")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rates", type=float, nargs="+", default=[1000, 2000, 3000, 4000, 6000, 8000])
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--sims", type=int, default=1, help="server processes on one port, one core each")
    parser.add_argument(
        "--server",
        choices=("sim", "canned"),
        default="sim",
        help="sim: the sim engine; canned: a bare responder, one write of the same stream per request",
    )
    parser.add_argument("--serve-canned", type=int, help=argparse.SUPPRESS)
    parser.add_argument(
        "--warm-connections",
        type=int,
        default=0,
        help="each worker opens this many connections before its stage (SessionSettings.warm_connections)",
    )
    parser.add_argument("--seconds", type=float, default=2.0, help="seconds of sends per run")
    parser.add_argument(
        "--sim-step-ms",
        type=float,
        default=0.0,
        help="every sim step takes this long (0: no time; > 0: the requests arriving meanwhile share a step, "
        "so the sims cost less per request at high rates)",
    )
    parser.add_argument("--reps", type=int, default=3, help="interleaved repetitions (medians)")
    parser.add_argument(
        "--knee-ms", type=float, default=1.0, help="p99 schedule delay a kept schedule stays under"
    )
    parser.add_argument("--vllm", action="store_true", help="add vllm bench serve's loop as a row")
    parser.add_argument("--quick", action="store_true", help="rates 2000-5000, 2 reps of 1 s")
    parser.add_argument("--out", type=Path, help="also write the report as JSON here")
    args = parser.parse_args()
    if args.serve_canned:
        serve_canned(args.serve_canned)
        return
    if args.quick:
        args.rates, args.reps, args.seconds = [2000, 3000, 4000, 5000], 2, 1.0
    if (
        min(args.rates) <= 0
        or min(args.workers) < 1
        or args.reps < 1
        or args.seconds <= 0
        or args.sims < 1
        or args.sim_step_ms < 0
    ):
        parser.error("rates and seconds must be > 0, workers, sims and reps ≥ 1, --sim-step-ms ≥ 0")
    cores = sorted(os.sched_getaffinity(0))
    groups = core_groups(cores)
    try:
        sim_cores = sim_placement(groups, args.sims)
    except ValueError as exc:
        parser.error(str(exc))
    pinned = {w: placement(groups, w, sim_cores) for w in args.workers}
    if args.vllm:
        import vllm.benchmarks.serve  # noqa: F401  (a slow import: not inside a run)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    load_before = os.getloadavg()
    if args.server == "canned":
        sims = start_canned(port, sim_cores)
    else:
        sims = start_sims(port, sim_cores, args.sim_step_ms)
    try:
        wait_listening(sims)
        _wait_healthy(url)
        runs = measure(args, url, cores, pinned, [psutil.Process(sim.pid) for sim in sims])
    except RuntimeError as exc:
        sys.exit(f"error: {exc}")
    finally:
        for sim in sims:
            sim.terminate()
            sim.wait()
    table = summarize(runs)
    knee = knees(table, args.knee_ms)
    peak = {row: max(fig["achieved_rate"] for fig in rates.values()) for row, rates in table.items()}
    places = "; ".join(
        f"{w} worker(s) on {'cores ' + str(c) if c else 'any of ' + str(cores) + ' (shared)'}"
        for w, c in pinned.items()
    )
    report = {
        "machine": f"{os.cpu_count()} cores, physical (SMT siblings together) {groups}; "
        f"{args.sims} {'canned responder' if args.server == 'canned' else 'sim'}(s) on cores {sim_cores}"
        f"{'' if args.server == 'canned' else f', steps of {args.sim_step_ms:g} ms'}; {places}; "
        f"timer, bare and vllm rows on core {cores[0]}",
        "load_before": [round(x, 2) for x in load_before],
        "load_after": [round(x, 2) for x in os.getloadavg()],
        "pinned": {str(w): c for w, c in pinned.items()},
        "medians": table,
        "knee_rate": knee,
        "scaling": scaling(knee, peak),
        "runs": runs,
    }
    print_report(report, args.knee_ms)
    if args.out:
        args.out.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
