"""The characterization against the sim engine with a known memory limit (``memory_tokens``).

40000 KV-token slots, one per batched token reserved by the start-up profile run, 16-token blocks, a
1024-token context and 4 sequences (64 decode tokens each: long enough that the client's staggered sends
cannot pass for a batch the engine queued): the decode batch at the full context needs 4 × 64 blocks, so the
largest budget whose corner-case batches all pass is 40000 − 256·16 = 35904; above 38976 the engine
refuses to start (its KV cache would be shorter than one 1024-token request).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from pathlib import Path

import pandas as pd
import pytest

from engine_harness.engines import engine_kind
from engine_harness.launch import EngineStartError
from engine_harness.sim import SimConfig, SimServer
from microbench.characterize.budget import BudgetSearchPlan, Candidate, search_budget
from microbench.characterize.cli import main
from microbench.characterize.probes import ProbeLimits

pytestmark = [pytest.mark.integration, pytest.mark.clock]  # reads the clock: the clock pass

CONFIG = Path(__file__).resolve().parents[2] / "sweeps" / "characterize" / "sim-memory.yaml"
BOUNDARY = 35904


class _Target:
    def __init__(self, server: SimServer) -> None:
        self.base_url = server.base_url
        self.auth_headers: dict[str, str] = {}
        self.metrics = engine_kind("sim").metrics


@contextlib.asynccontextmanager
async def _in_process(candidate: Candidate) -> AsyncIterator[_Target]:
    config = SimConfig(
        model="m",
        max_num_batched_tokens=candidate.budget,
        max_num_seqs=candidate.max_seqs,
        block_size=16,
        max_model_len=1024,
        memory_tokens=40000,
        activation_tokens=1,
    )
    server = SimServer(config)
    try:
        await server.start()
    except RuntimeError as exc:
        raise EngineStartError(f"sim exited; errors in the log:\n  {exc}\n") from None
    try:
        yield _Target(server)
    finally:
        await server.stop()


def test_search_finds_the_known_boundary_exactly() -> None:
    plan = BudgetSearchPlan(
        fixed=4, minimum=256, maximum=65536, initial=2048, limits=ProbeLimits(context=1024, decode_tokens=64)
    )
    result = asyncio.run(search_budget(plan, _in_process, "m"))  # type: ignore[arg-type]
    assert result.found == BOUNDARY
    by_budget = {p.candidate.budget: p for p in result.probes}
    assert by_budget[BOUNDARY].passed and [b.name for b in by_budget[BOUNDARY].batches] == [
        "all-prefill",
        "decode-at-max-context",
        "max-short-sequences",
        "one-max-prompt",
    ]
    just_over = by_budget[BOUNDARY + 1]
    assert not just_over.passed and just_over.started and just_over.why.startswith("decode-at-max-context")
    refused = [p for p in result.probes if not p.started]
    assert refused and all("max seq len (1024)" in p.why or "OutOfMemoryError" in p.why for p in refused)
    assert min(p.candidate.budget for p in refused) > 38976


def _cli(out: Path, *extra: str) -> int:
    return main(["--config", str(CONFIG), "--out", str(out), *extra])


def test_cli_searches_sweeps_stores_and_resumes(tmp_path: Path) -> None:
    out = tmp_path / "run"
    code = _cli(
        out,
        "--range",
        "35800:36000",
        "--initial",
        "35800",
        "--users",
        "1,2",
        "--level-duration",
        "1s",
        "--max-level-duration",
        "2s",
        "--dataset",
        str(tmp_path / "ds.parquet"),
    )
    assert code == 0
    search = json.loads((out / "search" / "search.json").read_text())
    assert search["found"] == BOUNDARY
    probes = sorted((out / "search" / "probes").glob("*.json"))
    assert len(probes) == len(search["probes"]) and all(json.loads(p.read_text())["why"] for p in probes)
    rows = pd.read_parquet(out / "rows.parquet")
    assert rows["users"].tolist() == [1, 2] and set(rows["budget"]) == {BOUNDARY}
    assert (rows["succeeded"] > 0).all() and (rows["ttft_s_p50"] > 0).all()
    # nTTFT = TTFT per input token; the workload's inputs are 128–512 tokens
    ratio = rows["ttft_s_p50"] / rows["nttft_s_per_token_p50"]
    assert ((ratio > 128 / 2) & (ratio < 512 * 2)).all()
    assert len(pd.read_parquet(tmp_path / "ds.parquet")) == 2
    assert (out / "raw" / "found" / "u2.parquet").is_file()
    mtimes = {p: p.stat().st_mtime_ns for p in probes}
    assert main(["--resume", "--out", str(out)]) == 0  # every probe and level stored: nothing runs again
    assert {p: p.stat().st_mtime_ns for p in probes} == mtimes
    assert len(pd.read_parquet(out / "rows.parquet")) == 2


def test_cli_names_a_range_the_engine_refuses(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = _cli(tmp_path / "r", "--range", "39000:65536", "--initial", "39000", "--no-sweep")
    assert code == 2
    err = capsys.readouterr().err
    assert "refused to start with every budget tried in [39000, 65536]" in err and "max seq len (1024)" in err


def test_cli_reports_a_setting_that_never_passes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # 64 sequences at the full context need 64 × 1024 KV tokens: more than any budget leaves
    code = _cli(
        tmp_path / "r", "--range", "256:512", "--initial", "256", "--max-num-seqs", "64", "--no-sweep"
    )
    assert code == 1
    assert "no setting passed, even the minimum (decode-at-max-context" in capsys.readouterr().err


def test_an_engine_dying_mid_sweep_keeps_the_levels_before(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)  # nothing may be written outside --out (no shared dataset unless asked)
    out = tmp_path / "r"
    code = _cli(
        out,
        "--no-search",
        "--engine-args",
        "--die-after-requests 12",
        "--users",
        "1,2,4,8",
        "--level-duration",
        "1s",
        "--max-level-duration",
        "1s",
    )
    assert code == 1
    err = capsys.readouterr().err
    assert "the engine died during default/u" in err and "--resume" in err
    stored = sorted(p.name for p in (out / "levels" / "default").glob("u*.json"))
    rows = pd.read_parquet(out / "rows.parquet")
    assert stored and len(rows) == len(stored) and (rows["succeeded"] == rows["requests"]).all()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r"]
