"""§4.5 warm-up: enough requests and output tokens, a drained queue, and probe-latency verification.

``warm_up`` runs the battery workload closed-loop until both ``warmup_requests`` requests and
``warmup_output_tokens`` output tokens are done (the draft's "whichever is greater"), waits until the
engine reports no running or waiting request, then sends identical-shape probes one at a time, in rounds
of ``warmup_probes``, until the last round agrees ((max − min) / median < 10%: verified) or
``_PROBE_ROUNDS`` rounds were sent (the sweep's rule, DESIGN §3: the first probes after a load often
still vary while the engine settles; the report gives the last round's variation and the probe count).
Warm-up prompts are cold and unique, so they never populate the prefix cache. A cold-start run skips
all of it and says so.
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable

import numpy as np

from microbench.battery.compliance import Requirement, must, should
from microbench.battery.context import BatteryContext
from microbench.battery.report import WarmupResult
from microbench.loadgen.stages import Stage
from microbench.workloads.schedulers import parse_scheduler

__all__ = ["PROBE_INPUT", "PROBE_OUTPUT", "probe_variation", "settle", "warm_up", "warmup_requirement"]

PROBE_INPUT = 128
PROBE_OUTPUT = 16
_MAX_ROUNDS = 5
_PROBE_ROUNDS = 4


def probe_variation(latencies: list[float]) -> float | None:
    """(max − min) / median of probe latencies (None for fewer than two)."""
    if len(latencies) < 2:
        return None
    values = np.asarray(latencies, dtype=float)
    return float((values.max() - values.min()) / np.median(values))


async def settle(
    probe_round: Callable[[], Awaitable[list[float]]], rounds: int = _PROBE_ROUNDS
) -> tuple[list[float], float | None]:
    """Probe rounds until the last one varies by less than 10% (or ``rounds`` were sent): every probe
    latency, and the last round's variation."""
    probes: list[float] = []
    variation = None
    for _ in range(rounds):
        last = await probe_round()
        probes += last
        variation = probe_variation(last)
        if variation is not None and variation < 0.1:
            break
    return probes, variation


async def _probes(ctx: BatteryContext, count: int, label: str) -> list[float]:
    stage = Stage.scheduled(
        "probe",
        parse_scheduler({"kind": "concurrency", "concurrency": 1}),
        ctx.fixed_requests(PROBE_INPUT, PROBE_OUTPUT),
        max_requests=count,
    )
    lat = (await ctx.run(label, [stage])).stage("probe").latencies
    return lat.loc[lat["ok"], "e2e_s"].astype(float).tolist()


async def warm_up(ctx: BatteryContext, cold_start: bool = False) -> WarmupResult:
    """Warm the engine up (or declare a cold start) and verify it."""
    p = ctx.profile
    if cold_start:
        return WarmupResult(
            cold_start=True,
            requirements=[must("4.5.3", "cold-start measurement: warm-up skipped and declared", True)],
        )
    before = await _probes(ctx, 1, "warmup/probe-before")
    requests = tokens = 0
    source = ctx.requests(ctx.workload_spec())
    want = p.warmup_requests
    for _ in range(_MAX_ROUNDS):
        if want <= 0:
            break
        stage = Stage.scheduled(
            "warmup",
            parse_scheduler({"kind": "concurrency", "concurrency": p.probe_concurrency}),
            source,
            max_requests=want,
            warmup=True,
        )
        lat = (await ctx.run("warmup/load", [stage])).stage("warmup").latencies
        requests += len(lat)
        tokens += int(lat["output_tokens"].fillna(0).sum())
        missing_tokens = p.warmup_output_tokens - tokens
        per_request = tokens / max(requests, 1)
        want = 0 if missing_tokens <= 0 else math.ceil(missing_tokens / max(per_request, 1.0))
    drained = await ctx.wait_idle()
    after, variation = await settle(lambda: _probes(ctx, p.warmup_probes, "warmup/probes-after"))
    reqs = [
        must(
            "4.5.1",
            "at least 100 requests and 10,000 output tokens before measuring",
            requests >= 100 and tokens >= 10_000,
            f"{requests} requests, {tokens} output tokens",
        ),
        must(
            "4.5.1",
            "request queue drained",
            drained is not False,
            "engine reports an empty queue"
            if drained
            else (
                "every client request finished (the engine reports no queue)"
                if drained is None
                else "the engine still reported running or waiting requests"
            ),
        ),
        should(
            "4.5.2",
            "probe latency stable within 10% after warm-up",
            variation is not None and variation < 0.1,
            "–"
            if variation is None
            else f"{variation:.1%} over the last {min(p.warmup_probes, len(after))} of {len(after)} probes",
        ),
    ]
    return WarmupResult(
        cold_start=False,
        requests=requests,
        output_tokens=tokens,
        queue_drained=drained,
        probe_before_s=before[0] if before else None,
        probes_after_s=after,
        variation=variation,
        requirements=reqs,
    )


def warmup_requirement(warmup: WarmupResult) -> list[Requirement]:
    """The warm-up's requirements as they apply to every test of the run."""
    return [r.model_copy() for r in warmup.requirements]
