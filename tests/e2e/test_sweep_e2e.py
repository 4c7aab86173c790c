"""The interference sweep on the real CPU vLLM engine: sweeps/smoke.yaml end to end."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from microbench.results.records import RunRecord, read_record
from microbench.sweep.cli import main

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1500)]


def test_smoke_sweep_on_cpu_vllm(tmp_path: Path, repo_root: Path) -> None:
    assert main(["--config", str(repo_root / "sweeps" / "smoke.yaml"), "--out", str(tmp_path / "s")]) == 0
    run = tmp_path / "s"
    records = [read_record(p, RunRecord) for p in sorted((run / "runs" / "2048").glob("*.json"))]
    assert len(records) == 2 * 2 * 2  # D × P × repetitions: every point has its final record
    # every point valid: an attempt the protocol refused was retried (and kept under invalid/)
    assert all(r.validity.valid for r in records), [(r.config, r.validity.reasons) for r in records]
    assert all(
        r.interference.prefix_cache_hits == 0 and r.interference.cached_prompt_tokens == 0 for r in records
    )
    for r in records:
        # vLLM's own step log says how many steps carried the prefill: ceil(P / (2048 − D))
        assert r.interference.num_chunks_source == "engine_log"
        assert r.interference.num_chunks_actual == r.interference.num_chunks_expected
        assert (run / r.raw_file).is_file()
    big = [r for r in records if r.config.decode_batch_size == 4 and r.config.new_prefill_tokens == 4096]
    assert all(r.derived.penalty_ratio > 1 for r in big)  # the prefill slows the decodes down
    assert all(r.derived.aggregate_decode_delay_ms > 0 for r in big)
    for r in big:
        # from vLLM's own step record: two full chunks of 2044 tokens and a last one of 8, reported apart
        assert r.derived.penalty_source == "engine_steps" and r.interference.full_chunk_steps == 2
        assert r.derived.penalty_last_step_ms is not None
        assert r.derived.penalty_last_step_ms < r.derived.tpot_penalty_ms
        # seed 002's identity on the client's stamps agrees with the engine's per-step penalties
        assert 0.5 < r.derived.identity_check < 1.5, r.derived
        # the engine's /metrics split the TTFT: the front end is what is left, and it is not negative
        assert r.interference.frontend_ms is not None and r.interference.frontend_ms > -1.0
    table = pd.read_csv(run / "interference_table.csv")
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
    # attempts the protocol refused (e.g. a delivery stall in a baseline) were retried, kept with reasons
    for path in (run / "invalid").rglob("*.json"):
        refused = read_record(path, RunRecord)
        assert not refused.validity.valid and refused.validity.reasons
    assert (run / "engine-2048.log").is_file() and (run / "telemetry" / "2048.parquet").is_file()
