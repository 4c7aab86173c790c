"""5.10 with engine-settings configurations: the launched subprocess sim restarted with overrides."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine_harness.engines import resolve_spec
from engine_harness.handles import EngineOverrides, ExternalEngine, LaunchedEngine
from engine_harness.launch import EngineProcess
from engine_harness.sim import SimConfig, SimServer
from microbench.battery.context import BatteryContext
from microbench.battery.profiles import profile
from microbench.battery.runner import run_battery
from microbench.battery.sections.guardrail import GuardrailData

pytestmark = [pytest.mark.integration, pytest.mark.clock]  # reads the clock: the clock pass

TINY = profile("quick", output_cap=16, warmup_requests=4, probe_requests=12, level_duration_s=0.6)
SERIAL = EngineOverrides({"max_num_seqs": 1})


async def test_engine_settings_restart_the_engine_and_restore_it(tmp_path: Path) -> None:
    log = tmp_path / "engine-sim.log"
    spec = resolve_spec(kind="sim", model="sim", extra_args=["--alpha-ms", "4", "--time-scale", "0.5"])
    async with EngineProcess(spec, log) as process, SimServer(SimConfig(model="sim")) as upstream:
        engine = LaunchedEngine(process)
        configs: dict[str, str | EngineOverrides] = {
            "bare": EngineOverrides(),
            "upstream": upstream.base_url,
            "serial": SERIAL,
        }
        ctx = BatteryContext(
            engine=engine, model="sim", profile=TINY, out_dir=tmp_path, guardrail_configs=configs
        )
        report = await run_battery(ctx, ["guardrail"], cold_start=True)
        assert process.spec == spec and process.alive()  # restored: later tests see the engine as launched
    result = report.tests[0]
    assert result.status == "ran", result.reason
    data = result.data
    assert isinstance(data, GuardrailData)
    assert data.configs == {
        "bare": "engine: as launched",
        "upstream": upstream.base_url,
        "serial": "engine: max_num_seqs=1",
    }
    assert [lv.config for lv in data.levels] == ["bare", "upstream", "serial"]
    # one sequence at a time: the probe's 4 concurrent requests run one by one, not batched, and at the
    # baseline's rates requests queue behind each other
    tp = data.max_throughput
    assert tp["serial"] < 0.6 * tp["bare"], tp
    bare, _, serial = data.levels
    assert serial.ttft.p50 > 2 * bare.ttft.p50  # type: ignore[operator]
    starts = [line for line in log.read_text().splitlines() if " starting: " in line]
    assert ["--max-num-seqs 1" in line for line in starts] == [False, True, False]
    assert "engine restarted for engine: max_num_seqs=1 and warmed up (4 requests)" in result.notes
    assert "engine restarted as launched after the last configuration" in result.notes
    disclosed = next(r for r in result.requirements if r.text == "guardrail configuration disclosed")
    assert "serial = engine: max_num_seqs=1" in disclosed.detail and report.system.engine_settings == {
        "kind": "sim",
        "model": "sim",
        "extra_args": spec.extra_args,
    }


async def test_engine_settings_fail_clearly_on_an_external_engine() -> None:
    ctx = BatteryContext(
        engine=ExternalEngine("http://127.0.0.1:9"),
        model="sim",
        profile=TINY,
        guardrail_configs={"bare": EngineOverrides(), "serial": SERIAL},
    )
    report = await run_battery(ctx, ["guardrail"], cold_start=True)
    result = report.tests[0]
    assert result.status == "failed" and result.reason is not None
    assert result.reason.startswith(
        "NotRestartable: configurations bare, serial restart the battery's engine"
    )
    assert result.reason.endswith("engine-settings configurations need --engine vllm|sim")
