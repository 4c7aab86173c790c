"""The route experiment on a simulated engine pair with a simulated KV link (known step model, known link):
the router driven by the table those two predict beats both fixed policies on a workload whose boundary
falls inside it, and matches the better fixed policy on workloads entirely on one side (known answers)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from analysis.breakeven import LinkProfile
from engine_harness.model_kv import ModelKV
from engine_harness.step_model import StepModel
from microbench.results.layout import RouteFolder
from microbench.route.cli import main
from microbench.route.predicted import predicted_policy
from microbench.route.report import RouteReport
from microbench.route.workload import COLD, RouteWorkload, shapes

pytestmark = [pytest.mark.integration, pytest.mark.clock]  # reads the clock: the clock pass

STEP = StepModel(alpha_ms=20, beta_d_ms=0.5, beta_c_ms=0.05, gamma_ns=20)
SETUP_MS, GBIT, BYTES = 400.0, 1.0, 8192  # a slow hand-off: small prompts must stay local
CHUNK = 512
STEP_ARGS = ["--alpha-ms", "20", "--beta-d-ms", "0.5", "--beta-c-ms", "0.05", "--gamma-ns", "20"]
STEP_ARGS += ["--enable-prompt-tokens-details"]  # steps of 20+ ms: the sim's own overhead stays small
SMALL, LARGE = 256, 8192


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_link_and_table(tmp_path_factory.mktemp("route"))


def write_link_and_table(tmp: Path) -> Path:
    """The sim link's connector preset and the table its step model and link predict, in ``tmp``."""
    link_args = ["--kv-transfer-setup-ms", str(SETUP_MS), "--kv-transfer-gbit-s", str(GBIT)]
    preset = {
        "name": "sim-slow-link", "run_here": True, "requires": [], "env": {},
        "sim_args": [*link_args, "--kv-bytes-per-token", str(BYTES)],
        "prefill_kv_transfer_params": {"do_remote_decode": True, "do_remote_prefill": False},
        "transfer_time_metric": "vllm:nixl_xfer_time_seconds",
    }  # fmt: skip
    (tmp / "connector.yaml").write_text(yaml.safe_dump(preset))
    link = LinkProfile(
        name="sim-slow-link", basis="assumed", assumption="the sim's own link", setup_latency_ms=SETUP_MS,
        bandwidth_gbit_s=GBIT,
    )  # fmt: skip
    model = ModelKV("sim", layers=1, kv_heads=1, head_dim=BYTES // 8, dtype_bytes=4)
    assert model.kv_bytes_per_token == BYTES
    table = predicted_policy(
        STEP, link, model, CHUNK, range(0, 9), [64, 128, 256, 512, 1024, 2048, 4096, 8192]
    )
    table.save(tmp / "table")
    # the known answer at the workload's points: small prompts local, large ones offloaded, at D = 4
    assert not table.decide(4, SMALL, CHUNK).offload and table.decide(4, LARGE, CHUNK).offload
    assert not table.decide(3, 64, CHUNK).offload  # a decode stream's own short prompt stays local
    return tmp


def _run(tmp: Path, name: str, cold_tokens: list[int], seed: int, reps: int) -> RouteReport:
    workload = RouteWorkload(
        decode_streams=4, decode_tokens=110, cold_tokens=cold_tokens, bursts=3, burst_size=2, burst_gap_s=0.5,
        first_burst_s=0.25, burst_spread_s=0.05,
    )  # fmt: skip
    cfg = {
        "name": name, "table": str(tmp / "table.json"), "connector": str(tmp / "connector.yaml"),
        "repetitions": reps, "seed": seed, "workload": workload.model_dump(), "pause_s": 0.1,
        "engine": {"kind": "sim", "chunk_size": CHUNK, "extra_args": STEP_ARGS}, "startup_timeout_s": 60,
        "slo_ttft_ms": 1000, "slo_tpot_ms": 50,
    }  # fmt: skip
    path = tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    out = tmp / name
    assert main(["--config", str(path), "--out", str(out)]) == 0
    report = RouteReport.model_validate_json((out / "report.json").read_text())
    assert all(f.valid for f in report.replays) and len(report.replays) == 3 * reps
    assert (out / "report.html").is_file() and (out / "timeline.png").stat().st_size > 10_000
    return report


def _total(report: RouteReport, policy: str) -> float:
    cell = report.cell(policy, "total_latency_s")
    assert cell is not None and cell.median is not None
    return cell.median


def _offload(report: RouteReport, policy: str) -> float:
    cell = report.cell(policy, "offload_fraction")
    assert cell is not None and cell.median is not None
    return cell.median


def test_the_table_beats_both_fixed_policies_when_its_boundary_falls_inside_the_workload(setup: Path) -> None:
    seed = 0
    colds = [
        s.prompt_tokens
        for s in shapes(RouteWorkload(cold_tokens=[SMALL, LARGE], bursts=3, burst_size=2), seed)
        if s.kind == COLD
    ]
    assert SMALL in colds and LARGE in colds  # both sides of the boundary are in the workload
    report = _run(setup, "mixed", [SMALL, LARGE], seed, reps=2)
    table, colocated, disaggregated = (_total(report, p) for p in ("table", "colocated", "disaggregated"))
    assert table < 0.95 * colocated and table < 0.95 * disaggregated, (table, colocated, disaggregated)
    # it offloaded exactly the large prompts: the share of cold prompts that are large
    share = sum(c == LARGE for c in colds) / len(colds)
    assert _offload(report, "table") == pytest.approx(share)
    assert _offload(report, "colocated") == 0 and _offload(report, "disaggregated") == 1
    # every offloaded request's decision logged its inputs, and the frames carry them
    frames = [f for r, f in RouteFolder(setup / "mixed").replays() if r.policy == "table"]
    cold = frames[0][frames[0]["client_id"] == COLD]
    assert (cold["offload"] == (cold["prompt_tokens"] == LARGE)).all()
    assert (cold["decode_running"] >= 4).all() and (cold["chunk"] == CHUNK).all()
    assert cold["interference_ms"].notna().all() and cold["transfer_ms"].notna().all()
    # the experiment's own boundary (measured decode delay against measured hand-off) agrees with the table
    says = {b.prompt_tokens: (b.table_offload_share, b.experiment_says) for b in report.boundary}
    assert says == {SMALL: (0.0, "local"), LARGE: (1.0, "offload")}


def test_on_small_prompts_only_the_table_keeps_them_local_and_matches_colocated(setup: Path) -> None:
    report = _run(setup, "small", [SMALL], 0, reps=1)
    table, colocated, disaggregated = (_total(report, p) for p in ("table", "colocated", "disaggregated"))
    assert _offload(report, "table") == 0
    assert colocated < disaggregated  # the better fixed policy here is colocated
    assert table == pytest.approx(colocated, rel=0.1)


def test_on_large_prompts_only_the_table_offloads_them_all_and_matches_disaggregated(setup: Path) -> None:
    report = _run(setup, "large", [LARGE], 0, reps=1)
    table, colocated, disaggregated = (_total(report, p) for p in ("table", "colocated", "disaggregated"))
    assert _offload(report, "table") == 1
    assert disaggregated < colocated  # the better fixed policy here is disaggregated
    assert table <= 1.1 * disaggregated
