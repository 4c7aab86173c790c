"""The transfer benchmark against two simulated engines: the proxy's phase accounting, the link fit
against a sim link of known setup and bandwidth, resume (also after a failure), a consumer that dies
or hangs mid-run (detected, blamed, the run stopped), and a P too long refused before any start."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import threading
import time
from pathlib import Path

import pandas as pd
import psutil
import pytest
import yaml

from microbench.results.records import read_record
from microbench.results.transfer import TransferRecord
from microbench.transfer.cli import main

pytestmark = [pytest.mark.integration, pytest.mark.clock]  # reads the clock: the clock pass

STEP_ARGS = ["--alpha-ms", "4", "--beta-d-ms", "0.2", "--beta-c-ms", "0.02", "--gamma-ns", "20"]
STEP_ARGS += ["--enable-prompt-tokens-details"]  # usage.cached_tokens, as the suite runs vLLM
ORDER = [
    "t_client_send_ns",
    "t_recv_ns",
    "t_producer_send_ns",
    "t_producer_done_ns",
    "t_consumer_send_ns",
    "t_consumer_headers_ns",
    "t_consumer_first_token_ns",
    "t_client_first_token_ns",
]


def _config(tmp: Path, **over: object) -> Path:
    cfg = {
        "prefill_tokens": [256, 2048],
        "repetitions": 1,
        "connector": "none",
        "warmup_tokens": 64,
        "engine": {"kind": "sim", "chunk_size": 512, "extra_args": STEP_ARGS},
        "phase_timeout_s": 20,
        "stall_timeout_s": 10,
        "idle_sample_s": 0.5,
        "startup_timeout_s": 60,
    } | over
    path = tmp / "transfer.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def _records(run: Path) -> dict[tuple[str, int], TransferRecord]:
    out = {}
    for p in sorted((run / "runs").rglob("*.json")):
        r = read_record(p, TransferRecord)
        out[(r.mode, r.prefill_tokens)] = r
    return out


@pytest.fixture(scope="module")
def sim_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("transfer")
    assert main(["--config", str(_config(tmp)), "--out", str(tmp / "t1")]) == 0
    return tmp / "t1"


def test_every_phase_is_stamped_in_order_and_the_phases_add_up(sim_run: Path) -> None:
    records = _records(sim_run)
    assert set(records) == {(m, p) for m in ("disaggregated", "colocated", "alone") for p in (256, 2048)}
    assert all(r.valid for r in records.values()), [r.reasons for r in records.values()]
    for p in (256, 2048):
        r = records[("disaggregated", p)]
        stamps = [r.stamps[k] for k in ORDER]
        assert all(s is not None for s in stamps), r.stamps
        assert stamps == sorted(stamps), r.stamps
        ph = r.phases
        assert ph.producer_ms and ph.handoff_ms and ph.total_ttft_ms and ph.consumer_ttft_ms
        parts = ph.producer_ms + ph.handoff_ms + (ph.client_overhead_ms or 0)
        assert parts == pytest.approx(ph.total_ttft_ms, abs=1e-6)
        assert 0 <= ph.client_overhead_ms < 0.5 * ph.total_ttft_ms  # type: ignore[operator]
        assert ph.proxy_gap_ms is not None and ph.proxy_gap_ms <= ph.handoff_ms
        # without a connector the consumer computes the whole prompt again, and the producer did once
        assert r.consumer is not None and r.producer is not None
        assert r.consumer.prompt_tokens == p and r.producer.prompt_tokens == p
        assert r.consumer.prefill_ms and r.producer.prefill_ms
        assert r.consumer.prefill_ms == pytest.approx(r.producer.prefill_ms, rel=0.5)
        assert r.consumer.prefill_ms <= r.phases.consumer_ttft_ms  # type: ignore[operator]
        assert r.cached_tokens_producer == 0 and r.completion_tokens == r.decode_tokens
    # the sim's step model: a longer prompt takes longer on the producer, and on the consumer
    small, big = records[("disaggregated", 256)].phases, records[("disaggregated", 2048)].phases
    assert big.producer_ms > small.producer_ms and big.consumer_ttft_ms > small.consumer_ttft_ms  # type: ignore[operator]
    colocated = records[("colocated", 2048)]
    assert colocated.phases.handoff_ms is None and colocated.phases.total_ttft_ms is not None


def test_run_folder_has_manifest_raw_stamps_metrics_table_and_figure(sim_run: Path) -> None:
    manifest = json.loads((sim_run / "manifest.json").read_text())
    assert manifest["sweep"]["connector"] == "none" and set(manifest["engine_argv"]) == {
        "producer",
        "consumer",
    }
    assert any("colocated TTFT is measured on the producer" in n for n in manifest["notes"])
    for r in _records(sim_run).values():
        raw = pd.read_parquet(sim_run / r.raw_file)
        assert (raw["event"] == "client_chunk").sum() >= 1
        assert (sim_run / "metrics" / r.mode / f"P{r.prefill_tokens}_r0.json").is_file()
    table = pd.read_csv(sim_run / "transfer_table.csv")
    assert len(table) == 6 and {"producer_ms", "handoff_ms", "consumer_tokens_external"} <= set(table.columns)
    assert (sim_run / "transfer_breakdown.png").stat().st_size > 10_000
    assert (sim_run / "engine-producer.log").is_file() and (sim_run / "engine-consumer.log").is_file()


def test_resume_measures_only_what_is_missing(sim_run: Path) -> None:
    gone = sim_run / "runs" / "colocated" / "P256_r0.json"
    kept = sim_run / "runs" / "disaggregated" / "P2048_r0.json"
    before = kept.read_bytes()
    gone.unlink()
    assert main(["--resume", "--out", str(sim_run)]) == 0
    assert gone.is_file() and kept.read_bytes() == before


def test_a_consumer_that_dies_mid_run_is_recorded_with_its_log_and_stops_the_run(tmp_path: Path) -> None:
    # consumer requests: warm-up, P=256 → then the sim consumer exits; P=2048's hand-off finds it dead
    cfg = _config(tmp_path, consumer_args=["--die-after-requests", "2"])
    t0 = time.perf_counter()
    code = main(["--config", str(cfg), "--out", str(tmp_path / "dies")])
    elapsed = time.perf_counter() - t0
    assert code == 1
    assert elapsed < 60
    records = _records(tmp_path / "dies")
    assert records[("disaggregated", 256)].valid
    failed = records[("disaggregated", 2048)]
    assert not failed.valid and failed.failed_phase == "consumer"
    assert any("consumer failed" in r for r in failed.reasons), failed.reasons
    assert failed.engine_log_tail  # the dead consumer's log, for the reader
    assert ("colocated", 2048) not in records  # the run stopped instead of going on blind


def test_the_link_fit_recovers_the_sim_links_setup_and_bandwidth_within_10_percent(tmp_path: Path) -> None:
    # connector sim-link: every hand-off takes 20 ms + P × 8192 bytes at 1 Gbit/s on the consumer
    cfg = _config(
        tmp_path,
        connector="sim-link",
        prefill_tokens=[512, 1024, 2048, 4096],
        repetitions=3,
        colocated=False,
        alone=False,
    )
    assert main(["--config", str(cfg), "--out", str(tmp_path / "link")]) == 0
    run = tmp_path / "link"
    records = [read_record(p, TransferRecord) for p in (run / "runs" / "disaggregated").glob("*.json")]
    assert len(records) == 12 and all(r.valid for r in records), [r.reasons for r in records]
    for r in records:  # the consumer loaded the prompt instead of computing it, and NIXL's counters say so
        assert r.consumer is not None and r.consumer.kv_bytes == r.prefill_tokens * 8192
        assert r.consumer.tokens_external == r.prefill_tokens - 1 and r.consumer.kv_xfer_count == 1
        assert r.phases.consumer_ttft_ms >= r.consumer.kv_xfer_ms  # type: ignore[operator]  # it waited
    fit = json.loads((run / "fit.json").read_text())["kv_xfer"]
    assert fit["x_source"].startswith("connector bytes counter") and fit["resolvable"]
    assert fit["setup_ms"] == pytest.approx(20.0, rel=0.10)
    assert fit["bandwidth_gbit_s"] == pytest.approx(1.0, rel=0.10)
    lo, hi = fit["bandwidth_ci_gbit_s"]
    assert lo <= fit["bandwidth_gbit_s"] <= hi
    link = yaml.safe_load((run / "link-measured-local.yaml").read_text())
    assert link["basis"] == "measured" and link["run"].endswith("link")
    assert link["bandwidth_gbit_s"] == pytest.approx(1.0, rel=0.10)
    # the hand-off is more than the link: it also holds the consumer's first step
    handoff = json.loads((run / "fit.json").read_text())["handoff"]
    assert handoff["mean_ms"] > fit["mean_ms"]
    breakdown = pd.read_csv(run / "breakdown.csv", index_col=0)
    # the stacks add up to the total; the CSV keeps 4 decimals, each column rounded on its own
    assert (breakdown["stack_sum_ms"] - breakdown["total_ttft_ms"]).abs().max() <= 1.0001e-4


def _sim_pid(marker: str) -> int:
    for child in psutil.Process().children(recursive=True):
        with contextlib.suppress(psutil.Error):
            if marker in " ".join(child.cmdline()):
                return child.pid
    raise AssertionError(f"no sim engine with {marker!r} in its command line")


def test_a_hung_consumer_is_detected_blamed_and_stops_the_run(tmp_path: Path) -> None:
    # the consumer (seed 7) is stopped with SIGSTOP after the first point: its /metrics stops answering
    cfg = _config(tmp_path, consumer_args=["--seed", "7"], stall_timeout_s=2, phase_timeout_s=120)
    first = tmp_path / "hung" / "runs" / "disaggregated" / "P256_r0.json"
    stopped: list[int] = []

    def stop_the_consumer() -> None:  # beside the run (main() keeps the main thread for its signals)
        deadline = time.perf_counter() + 60
        while not first.is_file() and time.perf_counter() < deadline:
            time.sleep(0.02)
        pid = _sim_pid("--seed 7")
        os.kill(pid, signal.SIGSTOP)
        stopped.append(pid)

    helper = threading.Thread(target=stop_the_consumer, daemon=True)
    t0 = time.perf_counter()
    helper.start()
    code = main(["--config", str(cfg), "--out", str(tmp_path / "hung")])
    elapsed = time.perf_counter() - t0
    helper.join(timeout=5)
    assert stopped and code == 1
    assert elapsed < 45  # a stall of 2 s, not a phase timeout of 120 s
    failed = _records(tmp_path / "hung")[("disaggregated", 2048)]
    assert not failed.valid and failed.hung and failed.failed_phase == "consumer"
    assert any("consumer engine made no progress" in r and "stopped" in r for r in failed.reasons), (
        failed.reasons
    )
    assert ("alone", 256) not in _records(tmp_path / "hung")  # the run stopped
    pid = stopped[0]
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE


def test_a_stalled_producer_step_is_blamed_on_the_producer_not_the_client(tmp_path: Path) -> None:
    # the producer's 6th step (P=256's prefill; warm-ups took 5) stalls 600 s: /metrics answers, nothing moves
    cfg = _config(tmp_path, producer_args=["--stall-step", "5", "--stall-s", "600"], stall_timeout_s=2)
    code = main(["--config", str(cfg), "--out", str(tmp_path / "stall")])
    assert code == 1
    failed = [r for r in _records(tmp_path / "stall").values() if not r.valid]
    assert len(failed) == 1 and failed[0].failed_phase == "producer" and failed[0].hung
    assert any("still answers but no counter moved" in r for r in failed[0].reasons), failed[0].reasons


def test_a_producer_past_its_phase_timeout_is_blamed_on_the_producer_not_the_client(tmp_path: Path) -> None:
    # the same stalled step, but the phase timeout (2 s) comes before the stall timeout (8 s): the
    # proxy's producer leg times out first and says so; the next point finds the producer hung
    cfg = _config(
        tmp_path,
        producer_args=["--stall-step", "5", "--stall-s", "600"],
        phase_timeout_s=2,
        stall_timeout_s=8,
    )
    t0 = time.perf_counter()
    code = main(["--config", str(cfg), "--out", str(tmp_path / "slow")])
    assert code == 1 and time.perf_counter() - t0 < 60
    records = _records(tmp_path / "slow")
    timed_out = records[("disaggregated", 256)]
    assert timed_out.failed_phase == "producer" and not timed_out.hung
    assert any("producer failed: TimeoutError" in r for r in timed_out.reasons), timed_out.reasons
    hung = records[("colocated", 256)]
    assert hung.failed_phase == "producer" and hung.hung and ("disaggregated", 2048) not in records


def test_resume_after_a_failure_measures_the_failed_point_again(tmp_path: Path) -> None:
    # the consumer dies after 2 finished requests: warm-up + P=256; P=2048's hand-off fails
    cfg = _config(tmp_path, consumer_args=["--die-after-requests", "2"])
    assert main(["--config", str(cfg), "--out", str(tmp_path / "again")]) == 1
    assert not _records(tmp_path / "again")[("disaggregated", 2048)].valid
    # resumed: fresh engines; the consumer's warm-up and the failed point are its two requests
    assert main(["--resume", "--out", str(tmp_path / "again")]) == 0
    records = _records(tmp_path / "again")
    assert records[("disaggregated", 2048)].valid and len(records) == 6
    assert all(r.valid for r in records.values())
    assert list((tmp_path / "again" / "invalid" / "disaggregated").glob("P2048_r0_a*.json"))


def test_a_prompt_longer_than_the_model_is_refused_before_any_engine_starts(tmp_path: Path) -> None:
    cfg = _config(tmp_path, engine={"kind": "sim", "max_model_len": 1024, "extra_args": STEP_ARGS})
    t0 = time.perf_counter()
    code = main(["--config", str(cfg), "--out", str(tmp_path / "long")])
    assert code == 2 and time.perf_counter() - t0 < 5
    assert not (tmp_path / "long").exists()
