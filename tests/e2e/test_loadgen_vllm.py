"""The load generator against the real CPU vLLM engine (fixture ``vllm_engine`` from tests/conftest.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from engine_harness.engines import engine_kind
from engine_harness.metrics import scrape
from microbench.client.requests import ApiSettings
from microbench.client.session import engine_session
from microbench.loadgen.session import LoadSession
from microbench.loadgen.stages import SessionSettings, Stage
from microbench.loadgen.trace import TRACE_COLUMNS, read_trace, write_trace
from microbench.loadgen.workers import run_sessions
from microbench.workloads.generator import Workload
from microbench.workloads.prompts import PromptFactory
from microbench.workloads.schedulers import parse_scheduler
from microbench.workloads.spec import WorkloadSpec

pytestmark = pytest.mark.e2e


async def test_poisson_run_produces_a_complete_trace(vllm_engine: Any, tmp_path: Path) -> None:
    spec = WorkloadSpec.model_validate(
        {
            "name": "tiny",
            "seed": 1,
            "clients": [
                {
                    "id": "c",
                    "input_length": {"type": "uniform", "min": 32, "max": 256},
                    "output_length": {"type": "uniform", "min": 4, "max": 16},
                }
            ],
        }
    )
    work = Workload(spec, PromptFactory())
    settings = SessionSettings(
        base_url=vllm_engine.base_url, api=ApiSettings.model_validate({"model": vllm_engine.spec.model_name})
    )
    warm = parse_scheduler({"kind": "concurrency", "concurrency": 2})
    poisson = parse_scheduler({"kind": "poisson", "rate": 4, "seed": 1})
    stages = [
        Stage.scheduled("warmup", warm, work.requests(), max_requests=2, warmup=True),
        Stage.scheduled("poisson", poisson, work.requests(), max_requests=8),
    ]
    async with LoadSession(settings) as session:
        result = await session.run(stages)
    header = write_trace(tmp_path, result, workload={"name": "tiny"}, seed=1)
    _, rows = read_trace(tmp_path)
    assert tuple(rows.columns) == TRACE_COLUMNS and len(rows) == 10
    assert (rows["status"] == "ok").all(), rows["error"].dropna().tolist()
    assert (rows["input_tokens"] == rows["prompt_tokens"]).all()  # token-id prompts: exact lengths
    assert (rows["output_tokens"] == rows["max_tokens"]).all()  # ignore_eos + min_tokens
    assert all(sum(t) == o for t, o in zip(rows["chunk_tokens"], rows["output_tokens"], strict=True))
    assert rows["tokens_from_usage"].all()
    assert header.stages[1].issued == 8 and header.stages[1].status_counts == {"ok": 8}


async def test_runs_in_two_workers_one_after_another_hit_no_cached_block(vllm_engine: Any) -> None:
    """One prompt factory across runs in two worker processes (the battery's use): the engine's prefix
    cache finds no block of one run's prompts in the next (before prompts were counted, the second run
    re-drew the first's: the parent's generator never moved while its workers drew)."""
    spec = WorkloadSpec.model_validate({
        "name": "cold", "seed": 2,
        "clients": [{"id": "c", "input_length": {"type": "uniform", "min": 300, "max": 400},
                     "output_length": {"type": "fixed", "value": 2}}],
    })  # fmt: skip
    factory = PromptFactory()
    settings = SessionSettings(
        base_url=vllm_engine.base_url, api=ApiSettings.model_validate({"model": vllm_engine.spec.model_name})
    )
    names = engine_kind("vllm").metrics
    closed = parse_scheduler({"kind": "concurrency", "concurrency": 2})
    async with engine_session() as http:
        before = await scrape(http, vllm_engine.base_url)
        for name in ("first", "second"):
            stage = Stage.scheduled(name, closed, Workload(spec, factory).requests(), max_requests=6)
            result = await run_sessions(settings, [stage], 2)
            assert [r.status for r in result.records] == ["ok"] * 6
            assert {r.worker for r in result.records} == {0, 1}
        after = await scrape(http, vllm_engine.base_url)
    assert (after.delta(before, names.prefix_cache_queries) or 0) >= 12 * 300
    assert after.delta(before, names.prefix_cache_hits) == 0
