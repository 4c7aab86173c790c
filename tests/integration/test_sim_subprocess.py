"""The sim as engine kind ``sim``: launched by ``EngineProcess`` as a real process, like any engine."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import aiohttp
import pytest

from engine_harness.engines import EngineSpec
from engine_harness.launch import EngineProcess
from engine_harness.metric_names import VLLM_METRICS
from engine_harness.metrics import scrape
from microbench.client.streams import StreamCut, stream_request

pytestmark = pytest.mark.integration

USAGE_OPTS = {"include_usage": True, "continuous_usage_stats": True}


async def test_engine_process_launches_sim(tmp_path: Path) -> None:
    steps_file = tmp_path / "steps.jsonl"
    spec = EngineSpec.model_validate(
        dict(
            kind="sim",
            model="tiny",
            chunk_size=128,
            max_num_seqs=8,
            block_size=16,
            extra_args=["--time-scale", "0", "--alpha-ms", "2.5", "--step-log", str(steps_file)],
        )
    )
    async with EngineProcess(spec, log_path=tmp_path / "sim.log") as engine, aiohttp.ClientSession() as s:
        assert engine.version is not None and engine.version.startswith("sim-")
        url = f"{engine.base_url}/v1/completions"
        payload = {
            "model": "tiny",
            "prompt": list(range(300)),
            "max_tokens": 5,
            "ignore_eos": True,
            "stream_options": USAGE_OPTS,
        }
        rec = await stream_request(s, url, payload)
        snap = await scrape(s, engine.base_url)
        async with s.get(f"{engine.base_url}/sim/steps") as resp:
            steps = (await resp.json())["steps"]
        async with s.get(f"{engine.base_url}/sim/config") as resp:
            config = await resp.json()
        assert engine.alive()
    assert rec.completion_tokens == 5 and rec.prompt_tokens == 300
    # the flags EngineSpec passed arrived: budget 128 → a 300-token prompt takes 3 chunks
    assert config["max_num_batched_tokens"] == 128 and config["step"]["alpha_ms"] == 2.5
    assert [st["prefill_tokens"] for st in steps[:3]] == [128, 128, 44] and len(steps) == 3 + 4
    assert snap.total(VLLM_METRICS.iteration_tokens) is None and snap.histogram(VLLM_METRICS.iteration_tokens)
    assert snap.total(["vllm:iteration_tokens_total_count"]) == len(steps)
    assert snap.total(VLLM_METRICS.prompt_tokens) == 300
    logged = [json.loads(line) for line in steps_file.read_text().splitlines()]
    assert logged == steps
    assert all(st["model_duration_s"] >= 2.5e-3 for st in logged)


async def test_sim_process_dies_on_fault(tmp_path: Path) -> None:
    spec = EngineSpec.model_validate(
        {"kind": "sim", "model": "tiny", "extra_args": ["--time-scale", "0", "--die-after-requests", "1"]}
    )
    async with EngineProcess(spec, log_path=tmp_path / "sim.log") as engine, aiohttp.ClientSession() as s:
        url = f"{engine.base_url}/v1/completions"
        rec = await stream_request(s, url, {"model": "tiny", "prompt": [1], "max_tokens": 2})
        assert rec.completion_tokens == 2
        assert engine.proc is not None
        for _ in range(200):
            if not engine.alive():
                break
            await asyncio.sleep(0.02)
        assert not engine.alive() and engine.proc.returncode == 70
        with pytest.raises(StreamCut):
            await stream_request(s, url, {"model": "tiny", "prompt": [1], "max_tokens": 2})
    assert "sim engine died" in (tmp_path / "sim.log").read_text()
