"""A quick battery subset against the real CPU vLLM (fixture ``vllm_engine``): 5.1, 5.4, 5.7, 5.9.

The shared engine is reached as an external one (restarting it would cost minutes and disturb the other
e2e tests), so 5.7's cache-disabled arm is skipped with its reason and that test is "not compliant".
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from engine_harness.handles import ExternalEngine, served_model
from microbench.battery.context import BatteryContext
from microbench.battery.gate import check_report
from microbench.battery.profiles import profile
from microbench.battery.report import BatteryReport
from microbench.battery.runner import run_battery, write_report
from microbench.battery.sections.long_context import LongContextData
from microbench.battery.sections.prefix_cache import PrefixCacheData
from microbench.battery.sections.ttft import TtftData

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

CI = profile(
    "quick",
    output_cap=16,
    warmup_requests=8,
    warmup_probes=3,
    probe_requests=8,
    ttft_requests=20,
    itl_requests=6,
    prefix_requests=6,
    prefix_concurrency=2,
    context_lengths=[256, 1024, 2048],
    context_output=8,
    context_ramp_max=2,  # 5.9's throughput ramp c = 1, 2 (quick's 1…8 took 54 of the test's 104 s)
)


async def test_quick_battery_subset_produces_both_reports(vllm_engine: Any, tmp_path: Path) -> None:
    model, max_len = await served_model(vllm_engine.base_url)
    ctx = BatteryContext(
        engine=ExternalEngine(vllm_engine.base_url),
        model=model,
        profile=CI,
        out_dir=tmp_path,
        max_model_len=max_len,
        cpu_count=os.cpu_count() or 1,
    )
    report = await run_battery(ctx, ["ttft", "itl", "prefix_cache", "long_context"], command="pytest e2e")
    write_report(report, tmp_path)
    assert [t.status for t in report.tests] == ["ran"] * 4, [(t.name, t.reason) for t in report.tests]
    minimum = (tmp_path / "report-minimum.md").read_text()
    assert "TTFT P99:" in minimum and "not run" in minimum  # 5.2/5.3 were not part of this subset
    assert "Methodology Compliance" in (tmp_path / "report.md").read_text()
    assert BatteryReport.model_validate_json((tmp_path / "report.json").read_text()) == report
    # one capacity, measured before 5.1 scaled its load by it; the first page does not contradict itself
    assert report.capacity is not None and report.capacity.max_output_tps is not None
    assert check_report(report) == [] and "CONSISTENCY GATE FAILED" not in minimum
    ttft = report.result("ttft")
    assert ttft is not None and isinstance(ttft.data, TtftData)
    assert ttft.data.queue_mean_s is not None and ttft.data.prefill_mean_s is not None  # vLLM's histograms
    pc = report.result("prefix_cache")
    assert pc is not None and pc.verdict == "not compliant" and isinstance(pc.data, PrefixCacheData)
    _, warm = pc.data.arms
    assert warm.prefix_hit_rate is not None and warm.prefix_hit_rate > 0.5
    lc = report.result("long_context")
    assert lc is not None and isinstance(lc.data, LongContextData) and lc.data.fit is not None
    assert lc.data.lengths[-1].ttft.mean > lc.data.lengths[0].ttft.mean  # type: ignore[operator]
    print((tmp_path / "report-minimum.md").read_text())
    for t in report.tests:
        print(t.section, t.title, t.verdict, f"{t.duration_s:.1f} s")
