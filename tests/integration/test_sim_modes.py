"""Scheduling modes and time scaling of the sim, end to end over HTTP."""

from __future__ import annotations

import asyncio
import math

import aiohttp
import pytest

from engine_harness.sim import SimConfig, SimServer, SimStepModel
from microbench.client.streams import StreamRecord, stream_request

pytestmark = [pytest.mark.integration, pytest.mark.clock]  # reads the clock: the clock pass

USAGE_OPTS = {"include_usage": True, "continuous_usage_stats": True}


async def _decodes_then_prefill(cfg: SimConfig, d: int, p: int) -> tuple[SimServer, list[StreamRecord]]:
    async with SimServer(cfg) as sim, aiohttp.ClientSession() as s:
        url = f"{sim.base_url}/v1/completions"
        recs = [StreamRecord() for _ in range(d)]
        tasks = [
            asyncio.create_task(
                stream_request(
                    s,
                    url,
                    {
                        "model": "sim",
                        "prompt": [40 + i, 1],
                        "max_tokens": 60,
                        "ignore_eos": True,
                        "stream_options": USAGE_OPTS,
                    },
                    rec,
                )
            )
            for i, rec in enumerate(recs)
        ]
        for _ in range(10_000):
            if all(len(r.chunk_t_ns) >= 5 for r in recs):
                break
            await asyncio.sleep(0.001)
        await stream_request(
            s, url, {"model": "sim", "prompt": [(3 * i) % 250 for i in range(p)], "max_tokens": 1}
        )
        await asyncio.gather(*tasks)
    return sim, recs


@pytest.mark.parametrize(
    ("mode", "expected_steps"),
    [("vllm", "ceil(P/(B-D))"), ("sglang", "ceil(P/B)"), ("sglang-mixed", "ceil(P/(B-D))")],
)
async def test_mode_chunk_counts_over_http(mode: str, expected_steps: str) -> None:
    budget, d, p = 128, 4, 1000
    cfg = SimConfig(model="sim", mode=mode, time_scale=0.0, max_num_batched_tokens=budget)  # type: ignore[arg-type]
    sim, recs = await _decodes_then_prefill(cfg, d, p)
    cold = [st for st in sim.step_log if any(n > 2 for _, n, _ in st.prefill_chunks)]
    want = math.ceil(p / budget) if expected_steps == "ceil(P/B)" else math.ceil(p / (budget - d))
    assert len(cold) == want
    assert all(st.decode_tokens == (0 if mode == "sglang" else d) for st in cold)
    assert all(r.completion_tokens == 60 for r in recs)


async def test_accelerated_mode_scales_wall_time_and_jitter_is_seeded() -> None:
    logs = []
    for _ in range(2):
        cfg = SimConfig(model="sim", time_scale=0.05, seed=5, step=SimStepModel(alpha_ms=40.0, jitter=0.1))
        async with SimServer(cfg) as sim, aiohttp.ClientSession() as s:
            await stream_request(
                s, f"{sim.base_url}/v1/completions", {"model": "sim", "prompt": [1], "max_tokens": 40}
            )
        logs.append(sim.step_log)
    a, b = logs
    assert [st.model_duration_s for st in a] == [st.model_duration_s for st in b]  # same seed, same steps
    assert len({st.model_duration_s for st in a}) > 30  # jitter on
    # the busy period's wall time over its model time (a step after a late one is logged short: it catches
    # up on the model's step grid, so single steps scatter around 0.05 both ways)
    ratio = sum(st.duration_ns for st in a) / 1e9 / sum(st.model_duration_s for st in a)
    print(f"\naccelerated ×0.05: wall/model time of the busy period {ratio:.4f}")
    assert 0.05 <= ratio < 0.2  # ≈2 ms of wall time per 40 ms model step (more on a starved CPU)
