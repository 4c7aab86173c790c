"""Compliance verdicts, the typed report's JSON round trip, and its Markdown/HTML renderings."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from engine_harness.engines import DEFAULT_MODEL
from microbench.battery.compliance import must, should, verdict
from microbench.battery.render import markdown_full, markdown_minimum
from microbench.battery.report import BatteryReport, SystemInfo, TestResult, WarmupResult
from microbench.battery.runner import ordered_tests, write_report
from microbench.battery.sections.capacity import is_oom
from microbench.battery.sections.long_context import LengthRow, LongContextData
from microbench.battery.sections.prefix_cache import population_requests
from microbench.battery.sections.ttft import TtftData
from microbench.client.requests import RequestSpec
from microbench.measure.scaling import fit_scaling
from microbench.measure.stats import summarize
from microbench.workloads.prompts import TextRenderer, load_tokenizer


def test_verdicts_follow_the_draft_wording() -> None:
    ok_must, bad_must = must("5.1", "a", True), must("5.1", "b", False)
    ok_should, bad_should = should("5.1", "c", True), should("5.1", "d", False)
    assert verdict([ok_must, ok_should]) == "unconditionally compliant"
    assert verdict([ok_must, bad_should]) == "conditionally compliant"
    assert verdict([bad_must, ok_should]) == "not compliant"


def test_tests_are_registered_in_section_order() -> None:
    tests = ordered_tests()
    assert [t.section for t in tests] == [f"5.{i}" for i in range(1, 11)]
    assert [t.name for t in ordered_tests(["itl", "ttft"])] == ["ttft", "itl"]


def _report() -> BatteryReport:
    samples = list(np.linspace(0.05, 0.4, 50))
    ttft = TtftData(
        workload="synthetic-uniform",
        load="open loop, Poisson 2.00 req/s",
        rate=2.0,
        requests=50,
        succeeded=50,
        duration_s=25.0,
        ttft=summarize(samples),
        tpot=summarize([0.01] * 50),
        samples_s=samples,
        by_length=[],
    )
    rows = [
        LengthRow(length=n, ttft=summarize([n * 1e-5]), output_tps=10.0, samples_s=[n * 1e-5])
        for n in (1024, 4096)
    ]
    long = LongContextData(
        output_tokens=16,
        concurrency=1,
        lengths=rows,
        dropped=[131072],
        fit=fit_scaling([1024, 4096], [0.01024, 0.04096]),
    )
    reqs = [must("5.1.2.1", "at least 1000 samples for P99", False, "50 samples")]
    return BatteryReport(
        created_at="2026-01-01T00:00:00.000+00:00",
        command="python -m microbench.battery run",
        profile="quick",
        seed=0,
        workload="synthetic-uniform",
        system=SystemInfo(
            model="tiny", engine_kind="sim", base_url="http://x", hardware="cpu", accelerators=0, cpu_count=2
        ),
        warmup=WarmupResult(cold_start=True),
        tests=[
            TestResult(
                name="ttft",
                section="5.1",
                title="Time to First Token",
                status="ran",
                requirements=reqs,
                verdict=verdict(reqs),
                data=ttft,
            ),
            TestResult(
                name="long_context",
                section="5.9",
                title="Long Context Scaling",
                status="ran",
                verdict="unconditionally compliant",
                data=long,
            ),
            TestResult(
                name="guardrail",
                section="5.10",
                title="Guardrail Overhead",
                status="skipped",
                reason="needs two configurations",
            ),
        ],
    )


def test_report_round_trips_through_json_with_typed_data() -> None:
    report = _report()
    back = BatteryReport.model_validate_json(report.model_dump_json())
    assert back == report
    assert isinstance(back.tests[0].data, TtftData) and isinstance(back.tests[1].data, LongContextData)
    assert back.tests[1].data.fit is not None and abs(back.tests[1].data.fit.exponent - 1.0) < 1e-9


def test_markdown_reports_carry_the_drafts_tables_and_compliance() -> None:
    report = _report()
    minimum = markdown_minimum(report)
    assert "=== LLM Benchmark Report (Minimum) ===" in minimum and "TTFT P99: 396.5 ms" in minimum
    assert "Max Throughput: not measured (no load level ran)" in minimum
    assert "cold-start measurement" in minimum
    assert "5.1 Time to First Token: not compliant: MUST 5.1.2.1 at least 1000 samples for P99" in minimum
    full = markdown_full(report)
    for heading in (
        "System Identification",
        "Test Configuration",
        "Results",
        "Methodology Compliance",
        "Reproduction Information",
        "TTFT Results (Table 1)",
        "Long Context Scaling (Table 12)",
    ):
        assert heading in full
    assert "| TTFT P99.9 |" in full and "*skipped*: needs two configurations" in full


def test_write_report_embeds_figures_in_self_contained_html(tmp_path: Path) -> None:
    report = _report()
    write_report(report, tmp_path)
    assert sorted(p.name for p in (tmp_path / "figures").iterdir()) == ["long_context.png", "ttft.png"]
    html = (tmp_path / "report.html").read_text()
    assert html.count("data:image/png;base64,") == 2 and "<img" in html and "src='figures" not in html
    back = BatteryReport.model_validate_json((tmp_path / "report.json").read_text())
    assert back.tests[0].figures == ["ttft.png"]


def test_unknown_test_names_are_refused() -> None:
    with pytest.raises(KeyError, match="unknown battery test 'nope'; known: capacity, fairness"):
        ordered_tests(["ttft", "nope"])


def test_oom_errors_are_recognised() -> None:
    assert is_oom("HTTP 500: CUDA error: out of memory") and is_oom("torch.OutOfMemoryError: ...")
    assert not is_oom("HTTP 429: too many requests") and not is_oom(None)


def test_prefix_population_sends_each_shared_prefix_once() -> None:
    shared = list(range(32))
    requests = [
        RequestSpec(
            prompt=[*shared, 100 + i], prompt_tokens=33, max_tokens=8, prefix_group="repo/0", prefix_tokens=32
        )
        for i in range(3)
    ] + [RequestSpec(prompt=[1, 2, 3], prompt_tokens=3, max_tokens=8)]
    (only,) = population_requests(requests)
    assert only.prompt == shared and only.max_tokens == 1


def test_a_text_prompt_s_prefix_is_cut_by_the_model_s_tokenizer() -> None:
    text = TextRenderer(load_tokenizer(DEFAULT_MODEL))
    requests = [
        RequestSpec(
            prompt="sharedpfx" + tail, prompt_tokens=12, max_tokens=4, prefix_group="g/0", prefix_tokens=9
        )
        for tail in ("abc", "xyz")
    ]
    (only,) = population_requests(requests, text)
    assert only.prompt == "sharedpfx" and only.prompt_tokens == 9
    with pytest.raises(ValueError, match="needs the tokenizer"):
        population_requests(requests)
