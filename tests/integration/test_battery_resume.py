"""A stopped battery run continues where it stopped: finished tests and the capacity are not redone."""

from __future__ import annotations

from pathlib import Path

import pytest
from fixtures.inprocess_sim import InProcessSim

from engine_harness.sim import SimConfig, SimServer, SimStepModel
from microbench.battery.context import BatteryContext
from microbench.battery.profiles import profile
from microbench.battery.runner import run_battery

pytestmark = [pytest.mark.integration, pytest.mark.clock]  # reads the clock: the clock pass

SIM = SimConfig(model="sim", max_num_seqs=8, step=SimStepModel(alpha_ms=4.0), seed=2)
TINY = profile(
    "quick", output_cap=8, warmup_requests=4, ttft_requests=10, level_duration_s=0.8, search_probes=2,
    tradeoff_levels=[0.5, 1.0], probe_requests=8,
)  # fmt: skip


def _ctx(sim: SimServer, out: Path) -> BatteryContext:
    return BatteryContext(
        engine=InProcessSim(sim), model="sim", profile=TINY, out_dir=out, max_model_len=4096, cpu_count=2
    )


async def test_a_second_run_into_the_same_folder_resumes(tmp_path: Path) -> None:
    lines: list[str] = []
    async with SimServer(SIM) as sim:
        first = await run_battery(_ctx(sim, tmp_path), ["ttft", "throughput"], emit=lines.append)
        assert any(line.startswith("battery plan") for line in lines)
        assert any(line.startswith("[2/2] throughput: ran") and "ETA" in line for line in lines)
        traces = {p.name for p in (tmp_path / "traces" / "capacity").iterdir()}
        lines.clear()
        ctx = _ctx(sim, tmp_path)
        second = await run_battery(ctx, ["ttft", "throughput", "tradeoff"], emit=lines.append)
    assert lines[0] == "resuming: ttft, throughput finished before; 1 to run"
    # the finished tests come back as saved (compared as stored: a NaN figure is not == itself); the
    # capacity is the one measured before, not a new one
    assert second.tests[0].model_dump_json() == first.tests[0].model_dump_json()
    saved, again = first.tests[1].data, second.tests[1].data
    assert saved is not None and again is not None and again.model_dump_json() == saved.model_dump_json()
    assert {p.name for p in (tmp_path / "traces" / "capacity").iterdir()} == traces
    tradeoff = second.result("tradeoff")
    assert tradeoff is not None and tradeoff.status == "ran"
    assert tradeoff.data.capacity_rps == first.tests[1].data.search.sustainable_rps  # type: ignore[union-attr]
    assert second.capacity is not None and len(second.capacity.entries) == len(ctx.ledger)
