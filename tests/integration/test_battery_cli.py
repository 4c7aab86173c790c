"""``python -m microbench.battery`` end to end with the subprocess sim (a launched, restartable engine)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from microbench.battery.cli import main
from microbench.battery.report import BatteryReport
from microbench.loadgen.trace import read_trace
from microbench.results.layout import job_folder

pytestmark = pytest.mark.integration


def test_list_names_every_test(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    assert [line.split()[1] for line in out.splitlines()] == [
        "ttft",
        "throughput",
        "tradeoff",
        "itl",
        "capacity",
        "fairness",
        "prefix_cache",
        "memory_pressure",
        "long_context",
        "guardrail",
    ]


def test_bad_arguments_fail_clearly(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", "--tests", "ttft", "nope", "--out", str(tmp_path)]) == 2
    assert "unknown battery test 'nope'" in capsys.readouterr().err
    assert main(["run", "--engine", "external", "--out", str(tmp_path)]) == 2
    assert "needs --url" in capsys.readouterr().err
    assert main(["run", "--resume", "--out", str(tmp_path)]) == 2
    assert "holds no stopped battery run" in capsys.readouterr().err


def test_slo_flags_want_a_unit(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["run", "--ttft-slo", "500"])
    assert exc.value.code == 2 and "give a number with a unit" in capsys.readouterr().err


def test_cli_runs_tests_against_a_launched_sim_and_restarts_it(tmp_path: Path) -> None:
    cmd = [
        sys.executable,
        "-m",
        "microbench.battery",
        "run",
        "--engine",
        "sim",
        "--engine-args",
        "--alpha-ms 4 --time-scale 0.5",
        "--tests",
        "prefix_cache",
        "guardrail",
        "--profile",
        "quick",
        "--cold-start",
        "--out",
        str(tmp_path),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = BatteryReport.model_validate_json((tmp_path / "report.json").read_text())
    assert [t.status for t in report.tests] == ["ran", "skipped"]
    assert "needs two or more named configurations" in report.tests[1].reason
    prefix = report.tests[0]
    assert [r.met for r in prefix.requirements if r.ref == "5.7.2"] == [True]  # the restart happened
    declared = [
        r.met for r in prefix.requirements if r.text == "cold-start measurement: warm-up skipped and declared"
    ]
    assert declared == [True]
    assert (
        report.warmup.cold_start and "cold-start measurement" in (tmp_path / "report-minimum.md").read_text()
    )
    assert "--no-prefix-caching" in (tmp_path / "engine-sim.log").read_text()
    assert job_folder(tmp_path).read_manifest().job == "battery"  # the one run-folder convention


def test_an_api_key_reaches_a_launched_engine_only_through_its_environment(tmp_path: Path) -> None:
    secret = "sk-battery-planted-41c9e2"
    cmd = [sys.executable, "-m", "microbench.battery", "run", "--engine", "sim", "--api-key-env", "BENCH_KEY"]
    cmd += ["--engine-args", "--alpha-ms 4 --time-scale 0.5", "--tests", "prefix_cache", "--profile", "quick"]
    cmd += ["--cold-start", "--api", "chat", "--out", str(tmp_path / "run")]
    env = {k: v for k, v in os.environ.items() if k != "BENCH_KEY"}
    # the variable named but not set: a clear error before any engine starts
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 2 and "BENCH_KEY: that variable is not set" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=180, env=env | {"BENCH_KEY": secret})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = BatteryReport.model_validate_json((tmp_path / "run" / "report.json").read_text())
    prefix = report.tests[0]
    # the sim answers 401 on /v1 without the key: every request carried it, before and after the restart
    assert [(a.succeeded, a.requests) for a in prefix.data.arms] == [
        (a.requests, a.requests) for a in prefix.data.arms
    ]
    assert [r.met for r in prefix.requirements if r.ref == "5.7.2"] == [True]
    # chat: text prompts of exact counts through the bundled tokenizer, which the report declares (4.4.1)
    assert report.disclosures is not None and report.disclosures.prompts["form"] == "text"
    assert report.disclosures.tokenizer["vocab_size"] == 259
    assert "| Tokenizer | qwen3-moe-tiny, 259 tokens, sha256 " in (tmp_path / "run" / "report.md").read_text()
    head, rows = read_trace(next((tmp_path / "run" / "traces").glob("prefix-cache/cache-*")))
    assert head.prompts["salt"] == report.disclosures.prompts["salt"] and head.seed == 42
    assert report.workload_spec["name"] == "synthetic-uniform" and report.workload_spec["seed"] == 42
    assert (rows["status"] == "ok").all() and (rows["input_tokens"] - rows["prompt_tokens"] == 19).all()
    for path in (tmp_path / "run").rglob("*"):
        assert not path.is_file() or secret.encode() not in path.read_bytes(), path


async def test_an_engine_refusing_the_key_is_named_as_such(monkeypatch: pytest.MonkeyPatch) -> None:
    from benchcore.cli import BadInput
    from engine_harness.handles import checked_endpoint
    from engine_harness.sim import SimServer

    monkeypatch.setenv("SIM_API_KEY", "right")
    async with SimServer(model="sim") as sim:
        monkeypatch.setenv("BENCH_KEY", "wrong")
        with pytest.raises(BadInput, match=r"refused the key in \$BENCH_KEY \(HTTP 401\).*--api-key-env"):
            await checked_endpoint(sim.base_url, "BENCH_KEY")
        with pytest.raises(BadInput, match="refused no API key"):
            await checked_endpoint(sim.base_url, None)
        monkeypatch.setenv("BENCH_KEY", "right")
        assert (await checked_endpoint(sim.base_url, "BENCH_KEY"))[0] == "sim"
