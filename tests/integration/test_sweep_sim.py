"""The interference sweep end to end against the simulated engine, whose step times are known."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import psutil
import pytest
import yaml

from microbench.results.records import Observation, RunRecord, read_record
from microbench.sweep.cli import main

pytestmark = [pytest.mark.integration, pytest.mark.clock]  # reads the clock: the clock pass

STEP_ARGS = ["--alpha-ms", "4", "--beta-d-ms", "0.2", "--beta-c-ms", "0.02", "--gamma-ns", "20"]


def _sweep_file(tmp_path: Path, **over: object) -> Path:
    sweep = {
        "chunks": [512],
        "decode_batch_sizes": [0, 4],
        "prefill_tokens": [256, 2048],
        "repetitions": 2,
        "decode_context": 256,
        "engine": {"kind": "sim", "extra_args": STEP_ARGS},
    } | over
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump(sweep))
    return path


def _records(run: Path) -> list[RunRecord]:
    return [read_record(p, RunRecord) for p in sorted((run / "runs").rglob("*.json"))]


@pytest.fixture(scope="module")
def sim_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("sweep")
    assert main(["--config", str(_sweep_file(tmp)), "--out", str(tmp / "r1")]) == 0
    return tmp / "r1"


def test_every_point_is_valid_and_files_are_where_the_design_says(sim_run: Path) -> None:
    records = _records(sim_run)
    assert len(records) == 2 * 2 * 2
    assert all(r.validity.valid for r in records), [r.validity.reasons for r in records]
    assert all(r.interference.prefix_cache_hits == 0 for r in records)
    for r in records:
        assert (sim_run / r.raw_file).is_file()
    manifest = json.loads((sim_run / "manifest.json").read_text())
    assert manifest["sweep"]["prefill_tokens"] == [256, 2048] and manifest["engine_version"].startswith("sim")
    warm = manifest["warmup"]["512"]
    assert warm["verified"] and len(warm["probes_ms"]) >= 3  # probes settled within 10% before measuring
    assert (sim_run / "baselines" / "512" / "D4_b0.json").is_file()
    assert (sim_run / "telemetry" / "512.parquet").is_file()
    table = pd.read_csv(sim_run / "interference_table.csv")
    assert list(table.columns[:9]) == [
        "chunk_size",
        "decode_batch_size",
        "new_prefill_tokens",
        "tpot_baseline_ms",
        "tpot_interference_ms",
        "tpot_penalty_ms",
        "penalty_ratio",
        "num_chunks",
        "prefill_duration_ms",
    ]
    assert len(table) == 4 and (table.repetitions == 2).all()


def test_chunk_counts_match_the_engine(sim_run: Path) -> None:
    for r in _records(sim_run):
        d, p, c = r.config.decode_batch_size, r.config.new_prefill_tokens, r.config.chunk_size
        # the sim schedules like vLLM V1: D decode tokens first, then chunk − D prefill tokens a step
        assert (
            r.interference.num_chunks_actual == math.ceil(p / (c - d)) == r.interference.num_chunks_expected
        )
        assert r.interference.num_chunks_source == "engine_log"


def test_measured_delay_and_penalty_match_the_sims_ground_truth(sim_run: Path) -> None:
    # Step model of the sim: 4 ms + 0.2 ms per decode token + 0.02 ms per prefill token + 20 ns per
    # chunk token × context token. Decode-only step with D = 4: 4.8 ms.
    decode_step = 4 + 0.2 * 4
    for r in _records(sim_run):
        if r.config.decode_batch_size == 0:
            continue
        steps = r.interference.engine_steps_log
        truth_per_stream = sum(s.elapsed_ms - decode_step for s in steps)  # extra time each decode waited
        measured = r.derived.aggregate_decode_delay_ms / r.config.decode_batch_size
        # within 20%, or one decode step: the client reads tokens a little late on a loaded machine
        assert measured == pytest.approx(truth_per_stream, rel=0.2, abs=decode_step), r.config
        # the baseline the client saw is the decode step the sim ran
        assert r.baseline.tpot_p50_ms == pytest.approx(decode_step, rel=0.1)
        # the penalty per prefill step: the mean extra time of the steps that carried the prefill
        mixed_steps = [s.elapsed_ms for s in steps if s.prefill_tokens > 0]
        truth_penalty = sum(mixed_steps) / len(mixed_steps) - decode_step
        assert r.derived.tpot_penalty_ms == pytest.approx(truth_penalty, rel=0.2, abs=decode_step), r.config
        if r.config.new_prefill_tokens == 2048:  # 5 chunks: the window median is a mixed step
            mixed = sorted(s.elapsed_ms for s in steps)
            assert mixed[0] * 0.9 <= r.interference.tpot_during_prefill_p50_ms <= mixed[-1] * 1.1
            assert r.derived.tpot_penalty_ratio > 2


def test_an_injection_that_hits_the_prefix_cache_is_invalid(tmp_path: Path, monkeypatch) -> None:
    # Seed 002's original bug: the same prompt every repetition. Repetition 1 then hits the cache.
    import microbench.measure.interference as protocol

    real = protocol.cold_prompt
    fixed = real(1024, protocol.TokenSpace(0, 256))
    monkeypatch.setattr(protocol, "cold_prompt", lambda n, space: fixed if n == 1024 else real(n, space))
    sweep = _sweep_file(tmp_path, decode_batch_sizes=[0], prefill_tokens=[1024], max_attempts=2)
    assert main(["--config", str(sweep), "--out", str(tmp_path / "hit")]) == 1  # a point finally invalid
    r0, r1 = _records(tmp_path / "hit")
    assert r0.validity.valid
    assert not r1.validity.valid and r1.validity.attempt == 1
    assert any("hit the prefix cache" in why for why in r1.validity.reasons)
    assert len(list((tmp_path / "hit" / "invalid").rglob("*.json"))) == 2  # both attempts kept
    table = pd.read_csv(tmp_path / "hit" / "interference_table.csv")
    assert table.repetitions.tolist() == [1] and table.invalid.tolist() == [2]  # attempts; never averaged in


def _sweep_until(tmp_path: Path, run_id: str, points: int, **popen: object) -> subprocess.Popen[str]:
    """A sweep subprocess (12 points) on the sim, returned once ``points`` records are on disk."""
    sweep = _sweep_file(tmp_path, decode_batch_sizes=[0, 4], prefill_tokens=[256, 1024, 2048], repetitions=2)
    cmd = [sys.executable, "-m", "microbench.sweep", "--config", str(sweep), "--out", str(tmp_path / run_id)]
    proc = subprocess.Popen(cmd, text=True, **popen)  # type: ignore[call-overload]
    runs = tmp_path / run_id / "runs"
    deadline = time.monotonic() + 120
    while len(list(runs.rglob("*.json"))) < points:
        assert proc.poll() is None and time.monotonic() < deadline
        time.sleep(0.05)
    return proc


def test_killed_sweep_resumes_without_measuring_anything_twice(tmp_path: Path) -> None:
    proc = _sweep_until(
        tmp_path, "k", 8, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
    )
    runs = tmp_path / "k" / "runs"
    engines = psutil.Process(proc.pid).children()  # the sim engine runs in a session of its own
    assert engines
    os.killpg(proc.pid, signal.SIGKILL)  # the sweep, with no chance to clean up
    proc.wait()
    _, alive = psutil.wait_procs(engines, timeout=15)
    assert not alive, "the engine outlived the killed sweep"
    first = {p.name: read_record(p, RunRecord).t_inject_ns for p in runs.rglob("*.json")}
    assert 8 <= len(first) < 12  # into D = 4: a decode batch's baseline is stored
    baselines = {p: p.read_bytes() for p in (tmp_path / "k" / "baselines").rglob("*.json")}
    assert baselines
    assert main(["--resume", "--out", str(tmp_path / "k")]) == 0
    after = {p.name: read_record(p, RunRecord).t_inject_ns for p in runs.rglob("*.json")}
    assert len(after) == 12
    assert all(after[name] == t for name, t in first.items())  # kept, not measured again
    # the points kept still derive from the baseline they were measured against: none was overwritten
    assert all(p.read_bytes() == data for p, data in baselines.items())
    for path in (tmp_path / "k" / "observed").rglob("*.json"):
        baseline = read_record(path, Observation).baseline_file
        assert baseline is None or (tmp_path / "k" / baseline).is_file()


def test_bad_sweep_input_is_a_clear_error(tmp_path: Path, capsys) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("chunks: [2048]\nrepetitons: 3\n")
    assert main(["--config", str(bad), "--out", str(tmp_path)]) == 2
    assert "repetitons: Extra inputs are not permitted" in capsys.readouterr().err
    assert main(["--chunk", "8", "--D", "12", "--out", str(tmp_path)]) == 2
    assert "leave no room for prefill" in capsys.readouterr().err
    assert main(["--resume", "--out", str(tmp_path / "nothing")]) == 2
    assert "has no manifest.json; nothing to resume" in capsys.readouterr().err


@pytest.mark.parametrize(("signum", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_a_stop_signal_ends_cleanly_with_everything_measured_on_disk(
    tmp_path: Path, signum: int, code: int
) -> None:
    proc = _sweep_until(tmp_path, "c", 3, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    runs = tmp_path / "c" / "runs"
    engines = psutil.Process(proc.pid).children()
    proc.send_signal(signum)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == code
    assert f"Continue with: python -m microbench.sweep --resume --out {tmp_path / 'c'}" in out
    _, alive = psutil.wait_procs(engines, timeout=15)
    assert not alive
    measured = list(runs.rglob("*.json"))
    assert len(measured) >= 3 and all(read_record(p, RunRecord).validity.valid for p in measured)
    table = pd.read_csv(tmp_path / "c" / "interference_table.csv")  # written from what was measured
    assert table.repetitions.sum() == len(measured)


def test_off_a_terminal_an_eta_is_printed_from_the_third_point_on(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    sweep = _sweep_file(tmp_path, decode_batch_sizes=[0], prefill_tokens=[256, 1024, 2048], repetitions=2)
    assert main(["--config", str(sweep), "--out", str(tmp_path / "eta")]) == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if " points, " in line]
    assert lines and lines[0].startswith("3/6 points, "), lines  # the first ETA comes at once
    assert all(" in, ETA " in line and " in, ETA –" not in line for line in lines), lines
