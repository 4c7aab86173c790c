"""The load generator against the real CPU vLLM engine (fixture ``vllm_engine`` from tests/conftest.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from microbench.client.requests import ApiSettings
from microbench.loadgen.session import LoadSession
from microbench.loadgen.stages import SessionSettings, Stage
from microbench.loadgen.trace import TRACE_COLUMNS, read_trace, write_trace
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
