"""The transfer benchmark against two simulated engines: the proxy's phase accounting, resume, and a
consumer that dies mid-run (reported with its log, never hung on)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pandas as pd
import pytest
import yaml

from microbench.results.records import read_record
from microbench.transfer.cli import main
from microbench.transfer.records import TransferRecord

pytestmark = pytest.mark.integration

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
        "request_timeout_s": 20,
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
    assert main(["--config", str(_config(tmp)), "--out", str(tmp), "--run-id", "t1"]) == 0
    return tmp / "t1"


def test_every_phase_is_stamped_in_order_and_the_phases_add_up(sim_run: Path) -> None:
    records = _records(sim_run)
    assert set(records) == {(m, p) for m in ("disaggregated", "colocated") for p in (256, 2048)}
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
    assert len(table) == 4 and {"producer_ms", "handoff_ms", "consumer_tokens_external"} <= set(table.columns)
    assert (sim_run / "transfer_breakdown.png").stat().st_size > 10_000
    assert (sim_run / "engine-producer.log").is_file() and (sim_run / "engine-consumer.log").is_file()


def test_resume_measures_only_what_is_missing(sim_run: Path) -> None:
    gone = sim_run / "runs" / "colocated" / "P256_r0.json"
    kept = sim_run / "runs" / "disaggregated" / "P2048_r0.json"
    before = kept.read_bytes()
    gone.unlink()
    assert main(["--resume", "--run-id", "t1", "--out", str(sim_run.parent)]) == 0
    assert gone.is_file() and kept.read_bytes() == before


def test_a_consumer_that_dies_mid_run_is_recorded_with_its_log_and_stops_the_run(tmp_path: Path) -> None:
    # consumer requests: warm-up, P=256 → then the sim consumer exits; P=2048's hand-off finds it dead
    cfg = _config(tmp_path, consumer_args=["--die-after-requests", "2"])
    t0 = time.perf_counter()
    code = main(["--config", str(cfg), "--out", str(tmp_path), "--run-id", "dies"])
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
