"""``battery compare`` on real battery folders: two in-process sims, one with slower steps (5.1 only)."""

from __future__ import annotations

from pathlib import Path

import pytest
from fixtures.inprocess_sim import InProcessSim

from benchcore.cli import BadInput
from engine_harness.sim import SimConfig, SimServer, SimStepModel
from microbench.battery.cli import main
from microbench.battery.compare import BatteryComparison, compare_reports, parse_price
from microbench.battery.context import BatteryContext
from microbench.battery.profiles import profile
from microbench.battery.runner import run_battery, write_report
from microbench.workloads.prompts import PromptFactory

pytestmark = [pytest.mark.integration, pytest.mark.clock]  # reads the clock: the clock pass

STEP = SimStepModel(alpha_ms=8.0, beta_d_ms=0.1, beta_c_ms=0.02, gamma_ns=2.0)
SIM = SimConfig(model="sim", max_num_batched_tokens=2048, max_num_seqs=8, step=STEP, time_scale=0.5, seed=1)
SMALL = profile("quick", output_cap=16, ttft_requests=60, probe_requests=12, level_duration_s=0.6,
                capacity_duration_s=0.5, capacity_max=8, search_probes=2)  # fmt: skip


async def _battery(out: Path, config: SimConfig, seed: int = 0) -> Path:
    async with SimServer(config) as sim:
        ctx = BatteryContext(engine=InProcessSim(sim), model="sim", profile=SMALL, out_dir=out, seed=seed,
                             max_model_len=sim.config.context_limit, cpu_count=2,
                             prompts=PromptFactory(salt=11))  # fmt: skip
        report = await run_battery(ctx, ["ttft"], cold_start=True, command="pytest")
    write_report(report, out)
    return out


async def test_a_slower_engine_is_worse_on_every_latency_percentile_and_a_reseeded_run_is_refused(
    tmp_path: Path,
) -> None:
    slower = SIM.model_copy(update={"step": STEP.model_copy(update={"alpha_ms": 24.0})})
    a = await _battery(tmp_path / "a", SIM)
    b = await _battery(tmp_path / "b", slower)
    c: BatteryComparison = compare_reports(a, b, parse_price("2/h"), parse_price("2/h"))
    assert c.status == "conditional" and c.conditions[:-1] == ["engine settings: the runs differ (§6.4)"]
    assert "at least 3 independent runs" in c.conditions[-1]
    ttft = [e for e in c.effects if e.label == "ttft" and e.metric in ("TPOT", "E2E")]
    assert len(ttft) == 6 and all(e.ratio is not None and e.ratio > 1.2 for e in ttft)
    assert all(e.verdict == "B worse" for e in ttft if e.q == 50)
    cost_a, cost_b = c.costs
    assert cost_a.usd_per_mtok is not None and cost_b.usd_per_mtok is not None
    assert cost_b.usd_per_mtok > cost_a.usd_per_mtok  # fewer tokens per device-hour at the same price
    reseeded = await _battery(tmp_path / "c", SIM, seed=5)
    with pytest.raises(BadInput, match="arrival seed"):
        compare_reports(a, reseeded)
    assert compare_reports(a, reseeded, allow_differences=True).status == "conditional"
    # the command: refused is exit 2 and writes nothing; allowed writes JSON, Markdown and HTML
    assert main(["compare", str(a), str(reseeded), "--out", str(tmp_path / "refused")]) == 2
    assert not (tmp_path / "refused" / "comparison.json").exists()
    out = tmp_path / "cmp"
    assert main(["compare", str(a), str(b), "--price-a", "2/h", "--price-b", "2/h", "--out", str(out)]) == 0
    md = (out / "comparison.md").read_text()
    assert "**Status: conditional**" in md and "B worse" in md and "US$ per 1M output tokens" in md
    assert "<table" in (out / "comparison.html").read_text()
    assert BatteryComparison.model_validate_json((out / "comparison.json").read_text()).effects
    # two runs per system: each run's percentile is one sample; fewer than §6.3's three is a condition
    a2, b2 = await _battery(tmp_path / "a2", SIM), await _battery(tmp_path / "b2", slower)
    runs = tmp_path / "runs"
    assert main(["compare", "--a", str(a), str(a2), "--b", str(b), str(b2), "--out", str(runs)]) == 0
    two = BatteryComparison.model_validate_json((runs / "comparison.json").read_text())
    assert two.runs_a == [str(a), str(a2)] and "fewer than 3 runs per system" in two.conditions[-1]
    tpot = [e for e in two.effects if e.label == "ttft" and e.metric == "TPOT"]
    assert tpot and all(e.runs_a == e.runs_b == 2 and e.ratio is not None and e.ratio > 1.2 for e in tpot)
    assert main(["compare", "--a", str(a), str(a2), "--b", str(reseeded), "--out", str(tmp_path / "x")]) == 2
