"""``python -m engine_harness inspect`` against the simulated engine, and the CLI's clear errors."""

from __future__ import annotations

import aiohttp
import pytest

from engine_harness.__main__ import _inspect, main
from engine_harness.sim.server import SimServer

pytestmark = pytest.mark.integration


async def test_inspect_reports_model_version_and_metrics_that_moved() -> None:
    async with SimServer(model="tiny", time_scale=0) as sim:
        async with aiohttp.ClientSession() as session:
            payload = {"model": "tiny", "prompt": list(range(40)), "max_tokens": 5, "stream": False}
            async with session.post(f"{sim.base_url}/v1/completions", json=payload) as resp:
                assert resp.status == 200
        summary = await _inspect(sim.base_url, "vllm")
    assert summary["version"] == "sim-0.1.0" and summary["models"] == ["tiny"]
    metrics = summary["metrics"]
    assert metrics["prompt_tokens"] == 40 and metrics["generation_tokens"] == 5
    assert metrics["requests_running"] == 0 and metrics["engine_steps"] >= 5


def test_cli_errors_are_one_clear_line(capsys: pytest.CaptureFixture[str]) -> None:
    from engine_harness.launch import free_port

    assert main(["inspect", f"http://127.0.0.1:{free_port()}"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "Cannot connect" in err
    with pytest.raises(SystemExit):
        main(["serve", "--engine", "tgi"])  # argparse names the choices
    assert "invalid choice: 'tgi'" in capsys.readouterr().err
