"""SGLang on this CPU box, for real: the sweep in both scheduling modes, and bad input refused early.

Needs SGLang's own environment, ``.venv-sglang`` (``SETUP_ENGINE=sglang-cpu bash scripts/setup.sh``;
``bash scripts/setup.sh`` sets it up too when CI=true); skipped with that reason where it is absent.
Each mode starts its own engine (≈ 35-60 s on a 2-core box) and measures one cold injection with D = 4.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pandas as pd
import pytest
import yaml

from engine_harness.engines import resolve_spec
from engine_harness.environments import find_venv_python
from engine_harness.launch import EngineProcess, EngineStartError
from engine_harness.sglang_kind import SGLANG_VENV
from microbench.client.prompts import BLOCK_TOKENS
from microbench.results.records import Manifest, RunRecord, read_record
from microbench.sweep.cli import main

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.sglang,
    pytest.mark.timeout(1500),
    pytest.mark.skipif(
        find_venv_python(SGLANG_VENV) is None,
        reason=f"SGLang is not set up ({SGLANG_VENV} is absent): "
        "run `SETUP_ENGINE=sglang-cpu bash scripts/setup.sh`",
    ),
]


@pytest.mark.parametrize(
    ("preset", "scheduling", "chunks", "isolate"),
    [("sglang-cpu", "exclusive", 2, False), ("sglang-cpu-mixed", "mixed", 3, True)],
)
def test_one_cold_injection_next_to_decodes_in_each_scheduling_mode(
    tmp_path: Path, preset: str, scheduling: str, chunks: int, isolate: bool
) -> None:
    """The mixed mode with its scheduler isolated (isolate_worker: no second engine start for it)."""
    sweep = {
        "chunks": [2048],
        "decode_batch_sizes": [4],
        "prefill_tokens": [4096],
        "repetitions": 1,
        "decode_context": 1024,
        "max_attempts": 4,
        "engine": {"preset": preset, "max_model_len": 16384, "isolate_worker": isolate},
    }
    path = tmp_path / "sglang.yaml"
    path.write_text(yaml.safe_dump(sweep))
    run = tmp_path / "s"
    assert main(["--config", str(path), "--out", str(run)]) == 0
    (record_path,) = sorted((run / "runs" / "2048").glob("*.json"))
    rec = read_record(record_path, RunRecord)
    assert rec.validity.valid, rec.validity.reasons
    assert rec.config.scheduling == scheduling and rec.config.engine == "sglang"
    itf = rec.interference
    # cold: no prefix-cache hit on the request's own usage (--enable-cache-report) or on /metrics (the
    # scheduler's per-prefill count, sglang:prefill_effective_tokens_total{mode="device_hit"}) but what the
    # protocol counts as chance: SGLang's radix cache (page size 1) matching a cold prompt's first id or
    # few (256 ids, no BOS on token-id prompts; CI of 2026-11-29 saw a 1-token hit), under one block
    assert itf.cached_prompt_tokens is not None and itf.cached_prompt_tokens < BLOCK_TOKENS
    assert itf.prefix_cache_hits is not None and itf.prefix_cache_hits < BLOCK_TOKENS
    # the step source: SGLang's scheduler log, one line per step
    assert itf.num_chunks_source == "engine_log" and itf.engine_steps_log
    # exclusive: ceil(4096 / 2048) steps without decodes; mixed: ceil(4096 / (2048 − 4)) steps with them
    assert itf.num_chunks_actual == itf.num_chunks_expected == chunks
    prefill_steps = [s for s in itf.engine_steps_log if s.prefill_tokens]
    # the prompt less its chance hit (CI 41 saw 4095: a 1-token hit, so one token fewer was computed)
    assert sum(s.prefill_tokens for s in prefill_steps) == 4096 - itf.cached_prompt_tokens
    assert all(s.decode_tokens == (4 if scheduling == "mixed" else 0) for s in prefill_steps)
    assert itf.step_time_full_chunk_ms is not None and itf.step_time_full_chunk_ms > 0
    assert rec.derived.aggregate_decode_delay_ms is not None and rec.derived.aggregate_decode_delay_ms > 0
    assert rec.derived.penalty_ratio is not None and rec.derived.penalty_ratio > 1
    table = pd.read_csv(run / "interference_table.csv")
    assert list(table["scheduling"]) == [scheduling]
    pinned = "### isolate_worker: 1 process(es) 'sglang::scheduler' pinned to core(s)"
    assert (pinned in (run / "engine-2048.log").read_text()) == isolate
    argv = " ".join(read_manifest_argv(run))
    assert ("--enable-mixed-chunk" in argv) is (scheduling == "mixed")


def read_manifest_argv(run: Path) -> list[str]:
    return read_record(run / "manifest.json", Manifest).engine_argv["2048"]


def test_a_flag_sglang_does_not_accept_is_refused_before_start_with_its_message(tmp_path: Path) -> None:
    spec = resolve_spec("sglang-cpu", chunk_size=2048, extra_args=["--no-such-flag", "3"])
    engine = EngineProcess(spec, tmp_path / "engine.log")
    t = time.perf_counter()
    with pytest.raises(EngineStartError, match="unrecognized arguments: --no-such-flag 3"):
        asyncio.run(engine.start())
    assert engine.proc is None and not (tmp_path / "engine.log").exists()  # nothing was started
    assert time.perf_counter() - t < 120  # SGLang's parser, not a minute of server imports
