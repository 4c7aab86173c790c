"""The main job on the real CPU vLLM engine, as a user runs it: ``python -m microbench.sweep --config
sweeps/smoke.yaml``, with issue #22's real-engine row inside it.

The row: SIGKILL of vLLM's ``EngineCore`` process in the middle of a D = 4 point. It used to divide by zero
(the failed injection's histogram counted no chunk) or spend the point's attempts. Now the death is an
infrastructure fault: the engine is restarted, the point measured again, and the attempt the death
spoiled is either not stored or stored blamed on it — never counted against the point. One run carries
both checks: a second sweep would cost another engine start (about a minute of CI). Run it under
``flock /tmp/engine.lock`` on a shared machine.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd
import psutil
import pytest

from engine_harness.engines import EngineSpec, engine_kind
from engine_harness.environments import engine_env
from microbench.results.faults import infrastructure_reasons
from microbench.results.records import RunRecord, read_record

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1500)]

BARE_POINTS = 2 * 2  # D = 0: P × repetitions, measured first; one more record and D = 4 is measuring


def _engine_core(root: psutil.Process) -> psutil.Process | None:
    for p in root.children(recursive=True):
        try:
            if "EngineCore" in p.name() or "EngineCore" in " ".join(p.cmdline()):
                return p
        except psutil.Error:
            continue
    return None


def _kill_engine_core_mid_batch(proc: subprocess.Popen[str], run: Path) -> tuple[int, set[Path]]:
    """SIGKILL the engine core once a D = 4 point is stored (the next one is in flight); the kill's
    ``perf_counter_ns`` (CLOCK_MONOTONIC, the sweep's clock too) and the invalid attempts stored before it."""
    deadline = time.monotonic() + 900
    while len(list(run.glob("runs/2048/*.json"))) <= BARE_POINTS:
        assert proc.poll() is None and time.monotonic() < deadline, proc.stdout and proc.stdout.read()[-3000:]
        time.sleep(0.05)
    core = _engine_core(psutil.Process(proc.pid))
    assert core is not None, "no EngineCore process under the sweep"
    invalid_before = set(run.glob("invalid/*/*.json"))
    kill_ns = time.perf_counter_ns()
    core.send_signal(signal.SIGKILL)
    return kill_ns, invalid_before


def test_smoke_sweep_on_cpu_vllm_survives_a_sigkill_of_its_engine_core(
    tmp_path: Path, repo_root: Path
) -> None:
    run = tmp_path / "s"
    cmd = [sys.executable, "-m", "microbench.sweep", "--config", str(repo_root / "sweeps" / "smoke.yaml")]
    # a temporary folder of its own, short (the engines' Unix sockets go there): both engines' (the one
    # killed and its restart) must be gone with them; PyTorch's compile cache stays where it was
    tmp = Path(tempfile.mkdtemp(prefix="e2e-"))
    cache = engine_env(engine_kind("vllm"), EngineSpec(), sys.executable)["TORCHINDUCTOR_CACHE_DIR"]
    env = {**os.environ, "TMPDIR": str(tmp), "TORCHINDUCTOR_CACHE_DIR": cache}
    proc = subprocess.Popen(
        [*cmd, "--out", str(run)], cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env=env,
    )  # fmt: skip
    kill_ns, invalid_before = _kill_engine_core_mid_batch(proc, run)
    text, _ = proc.communicate(timeout=1200)
    assert proc.returncode == 0, text[-4000:]
    assert "Traceback" not in text and "restarting it" in text
    notes = json.loads((run / "manifest.json").read_text())["notes"]
    assert any("engine restarted" in n for n in notes), notes

    records = [read_record(p, RunRecord) for p in sorted((run / "runs" / "2048").glob("*.json"))]
    assert len(records) == 2 * 2 * 2  # D × P × repetitions: every point has its final record
    # every point valid: an attempt the protocol refused was retried (and kept under invalid/)
    assert all(r.validity.valid for r in records), [(r.config, r.validity.reasons) for r in records]
    for path in run.glob("invalid/*/*.json"):
        refused = read_record(path, RunRecord)
        assert not refused.validity.valid and refused.validity.reasons
        if path not in invalid_before and refused.t_inject_ns < kill_ns:
            # the attempt in flight at the kill: stored only blamed on the death, so it spent nothing
            assert infrastructure_reasons(refused.validity.reasons), refused.validity.reasons
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
    assert (run / "engine-2048.log").is_file() and (run / "telemetry" / "2048.parquet").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s"]  # nothing written beside --out
    assert os.listdir(tmp) == []  # nor left in the temporary folder (vLLM's sockets and vllm_dist_*)
    tmp.rmdir()
