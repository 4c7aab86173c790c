"""analysis.policy: round trip, interpolation, monotonicity in P, out-of-range errors, CLI."""

from __future__ import annotations

import itertools
import json
import math
from pathlib import Path

import numpy as np
import pytest

from analysis.breakeven import load_link, load_model_kv
from analysis.policy import OffloadPolicy, OutOfRangeError, build_policy, main
from analysis.synthetic import synthesize_run

DS, PS = (0, 1, 2, 4, 8), (512, 2048, 8192, 16384)


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return synthesize_run(
        tmp_path_factory.mktemp("p") / "syn", chunks=(2048, 8192), decode_batches=DS, prefill_tokens=PS,
        repetitions=2, failed_points=[(8192, 2, 2048, 0), (8192, 2, 2048, 1)],
    )  # fmt: skip


@pytest.fixture(scope="module")
def policy(run: Path) -> OffloadPolicy:
    return build_policy(run, load_link("roce-4x200g"), "bulk", None)


def test_round_trip(policy: OffloadPolicy, tmp_path: Path) -> None:
    csv_path, json_path = policy.save(tmp_path / "table")
    assert (
        csv_path.read_text()
        .splitlines()[0]
        .startswith(
            "chunk_size,decode_batch_size,new_prefill_tokens,interference_ms,transfer_ms,decision,margin_ms"
        )
    )
    loaded = OffloadPolicy.load(json_path)
    assert loaded.metadata == json.loads(json.dumps(policy.metadata))
    assert loaded.cells["decision"].tolist() == policy.cells["decision"].tolist()
    assert np.allclose(loaded.cells["interference_ms"], policy.cells["interference_ms"])
    meta = loaded.metadata
    assert meta["run_id"] == "syn" and meta["link"]["name"] == "roce-4x200g" and meta["mode"] == "bulk"
    # the run's engine served the bf16 config as float32: its KV is 2 × 4 layers × 1 head × 32 × 4 bytes
    assert (
        meta["model"]["kv_bytes_per_token"]
        == 1024
        == load_model_kv("qwen3-moe-tiny", "float32").kv_bytes_per_token
    )
    assert meta["fit"]["step_r2_interference"] > 0.99
    assert len(loaded.cells) == 2 * len(DS) * len(PS)
    assert OffloadPolicy.load(csv_path).cells.equals(loaded.cells)  # the CSV path finds its JSON


def test_decide_on_grid_matches_the_table(policy: OffloadPolicy) -> None:
    for _, row in policy.cells.iterrows():
        d = policy.decide(row.decode_batch_size, row.new_prefill_tokens, row.chunk_size)
        assert not d.interpolated
        assert d.interference_ms == pytest.approx(row.interference_ms)
        assert d.transfer_ms == pytest.approx(row.transfer_ms)
        assert d.offload == (row.decision == "offload")
    assert set(policy.cells["decision"]) == {"offload", "local"}


def test_missing_cell_falls_back_to_the_step_model(policy: OffloadPolicy) -> None:
    cells = policy.cells
    row = cells[
        (cells.chunk_size == 8192) & (cells.decode_batch_size == 2) & (cells.new_prefill_tokens == 2048)
    ]
    assert row.interference_source.tolist() == ["step_model"] and row.repetitions.tolist() == [0]
    assert (cells.interference_source != "step_model").sum() == len(cells) - 1


def test_interpolation(policy: OffloadPolicy) -> None:
    lo = policy.decide(4, 2048, 8192).interference_ms
    hi = policy.decide(4, 8192, 8192).interference_ms
    mid = policy.decide(4, 4096, 8192)  # the geometric middle: the mean in log P
    assert mid.interpolated and mid.interference_ms == pytest.approx((lo + hi) / 2)
    d6 = policy.decide(6, 8192, 8192).interference_ms
    assert d6 == pytest.approx(
        (policy.decide(4, 8192, 8192).interference_ms + policy.decide(8, 8192, 8192).interference_ms) / 2
    )
    assert policy.decide(4, 8192, 4000).chunk_used == 2048  # nearest in log: 4000/2048 < 8192/4000
    assert policy.decide(4, 8192, 6000).chunk_used == 8192


@pytest.mark.parametrize("chunk", [2048, 8192])
@pytest.mark.parametrize("d", [1, 2, 3, 4, 6, 8])
def test_decide_is_monotone_in_p(policy: OffloadPolicy, chunk: int, d: int) -> None:
    decisions = [policy.decide(d, float(p), chunk) for p in np.geomspace(512, 16384, 41)]
    costs = [x.interference_ms for x in decisions]
    assert all(b >= a for a, b in itertools.pairwise(costs))
    flags = [x.offload for x in decisions]
    assert flags == sorted(flags)  # local … local, offload … offload: one switch at most
    assert flags[-1]


def test_out_of_range(policy: OffloadPolicy) -> None:
    for args in [
        (4, 100, 8192),
        (4, 40000, 8192),
        (9, 8192, 8192),
        (-1, 8192, 8192),
        (4, 8192, 16384),
        (4, 8192, 1024),
    ]:
        with pytest.raises(OutOfRangeError):
            policy.decide(*args)


def test_cli(run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "cli_table"
    assert (
        main(["build", str(run), "--link", "measured-local", "--mode", "layerwise", "--out", str(out)]) == 0
    )
    built = json.loads(capsys.readouterr().out)
    assert Path(built["json"]).is_file() and Path(built["csv"]).is_file()
    assert main(["query", built["json"], "--D", "6", "--P", "12000", "--chunk", "8192"]) == 0
    answer = json.loads(capsys.readouterr().out)
    assert answer["chunk_used"] == 8192 and answer["interpolated"] and answer["offload"] in (True, False)
    assert math.isclose(answer["margin_ms"], answer["interference_ms"] - answer["transfer_ms"])
    assert main(["query", built["json"], "--D", "6", "--P", "99999", "--chunk", "8192"]) == 2
    assert "outside the measured P range" in capsys.readouterr().err
    assert main(["build", str(run), "--link", "no-such-link"]) == 2
    assert "unknown link profile" in capsys.readouterr().err


def test_the_kv_bytes_come_from_the_dtype_the_engine_ran(run: Path) -> None:
    from analysis.breakeven import run_model_kv
    from microbench.results.layout import RunFolder

    assert run_model_kv(run).kv_bytes_per_token == 1024  # engine spec dtype float32
    folder = RunFolder(run)
    manifest = folder.read_manifest()
    manifest.engine_argv = {"2048": ["python", "-m", "vllm", "--dtype", "bfloat16"]}
    folder.write_manifest(manifest)
    try:
        assert run_model_kv(run).kv_bytes_per_token == 512  # the argv the engine really got wins
    finally:
        manifest.engine_argv = {}
        folder.write_manifest(manifest)
