"""Transfer benchmark pieces without an engine: connector presets, config rules, phase math, the fit."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from analysis.breakeven import LinkProfile
from analysis.transfer.fit import (
    NoTransferFit,
    TransferFit,
    fit_transfer,
    link_profile,
    write_link,
)
from engine_harness.kv_connectors import role_spec
from microbench.measure.pd_proxy import PhaseStamps
from microbench.transfer.config import TransferConfig, TransferConfigError, load_transfer_config
from microbench.transfer.measure import phases_from

REPO = Path(__file__).resolve().parents[2]


def test_role_spec_puts_the_connector_config_and_a_distinct_side_channel_port_per_engine() -> None:
    cfg = TransferConfig()
    preset = cfg.connector_preset()
    p = role_spec(cfg.producer_spec(), preset, "producer", "/tmp/kv")
    c = role_spec(cfg.consumer_spec(), preset, "consumer", "/tmp/kv")
    kv = json.loads(p.extra_args[p.extra_args.index("--kv-transfer-config") + 1])
    assert kv == {"kv_connector": "NixlConnector", "kv_role": "kv_both", "kv_buffer_device": "cpu"}
    assert p.env["VLLM_NIXL_SIDE_CHANNEL_PORT"] != c.env["VLLM_NIXL_SIDE_CHANNEL_PORT"]
    assert int(p.env["VLLM_NIXL_SIDE_CHANNEL_PORT"]) > 0
    assert (p.cpu_threads_bind, c.cpu_threads_bind) == ("0", "1")


def test_storage_connector_gets_roles_path_and_a_producer_budget_covering_the_largest_p() -> None:
    cfg = TransferConfig(connector="example-storage", prefill_tokens=[1024, 16384])
    assert cfg.producer_spec().chunk_size is not None and cfg.producer_spec().chunk_size >= 16384
    spec = role_spec(cfg.consumer_spec(), cfg.connector_preset(), "consumer", "/run/kv")
    kv = json.loads(spec.extra_args[-1])
    assert (
        kv["kv_role"] == "kv_consumer" and kv["kv_connector_extra_config"]["shared_storage_path"] == "/run/kv"
    )
    with pytest.raises(ValueError, match="chunks the prompt"):
        TransferConfig(connector="example-storage", prefill_tokens=[16384], producer_chunk=2048)


def test_config_errors_name_the_field_and_unknown_connectors_list_the_known_ones(tmp_path: Path) -> None:
    bad = tmp_path / "t.yaml"
    bad.write_text(yaml.safe_dump({"prefill_tokens": [1024], "repetitons": 2}))
    with pytest.raises(TransferConfigError, match="repetitons"):
        load_transfer_config(bad, {})
    with pytest.raises(TransferConfigError, match="nixl-cpu"):
        load_transfer_config(None, {"connector": "rdma-magic"})
    cfg = load_transfer_config(REPO / "sweeps" / "transfer-smoke.yaml", {"repetitions": 2})
    assert cfg.prefill_tokens == [1024, 4096] and cfg.repetitions == 2 and cfg.name == "transfer-smoke"
    # per repetition and P: disaggregated and colocated on the pair, then the lone engine's points
    points = cfg.points()
    assert len(points) == 2 * 2 * 3 and points[-4:] == [("alone", p, r) for r in (0, 1) for p in (1024, 4096)]
    assert len(load_transfer_config(None, {"alone": False, "colocated": False}).points()) == 5 * 3


def test_a_p_longer_than_the_model_is_refused_with_the_length_and_its_source(tmp_path: Path) -> None:
    with pytest.raises(TransferConfigError, match=r"P \[32768\] \+ 4 decode tokens exceed .* 20480"):
        load_transfer_config(REPO / "sweeps" / "transfer-cpu.yaml", {"prefill_tokens": [1024, 32768]})
    # the model's own config.json limits too (whatever the engine's max_model_len)
    model = tmp_path / "m"
    model.mkdir()
    cfg = json.loads((REPO / "engine_harness" / "models" / "qwen3-moe-tiny" / "config.json").read_text())
    (model / "config.json").write_text(json.dumps(cfg | {"max_position_embeddings": 2048}))
    with pytest.raises(TransferConfigError, match="max_position_embeddings"):
        load_transfer_config(
            None, {"prefill_tokens": [4096], "engine": {"preset": "cpu", "model": str(model)}}
        )


def test_phases_add_up_to_the_client_ttft() -> None:
    ms = 1_000_000
    st = PhaseStamps(
        request_id="x",
        t_recv_ns=1 * ms,
        t_producer_send_ns=2 * ms,
        t_producer_done_ns=52 * ms,
        t_consumer_send_ns=53 * ms,
        t_consumer_headers_ns=60 * ms,
        t_consumer_first_token_ns=70 * ms,
        t_consumer_done_ns=80 * ms,
    )
    ph = phases_from(0, 71 * ms, st)
    assert (ph.producer_ms, ph.proxy_gap_ms, ph.consumer_ttft_ms, ph.handoff_ms) == (50, 1, 17, 18)
    assert ph.total_ttft_ms == 71
    assert ph.client_overhead_ms == pytest.approx(71 - 50 - 18)
    colocated = phases_from(0, 30 * ms, None)
    assert colocated.total_ttft_ms == 30 and colocated.handoff_ms is None


def _synthetic(setup_ms: float, gbit_s: float, kv: int, noise_ms: float, seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    rows = []
    for p in (1024, 2048, 4096, 8192, 16384):
        for rep in range(4):
            wire = p * kv * 8 / (gbit_s * 1e9) * 1e3
            rows.append(
                {
                    "mode": "disaggregated",
                    "prefill_tokens": p,
                    "repetition": rep,
                    "valid": True,
                    "handoff_ms": setup_ms + wire + rng.normal(0, noise_ms),
                    "kv_xfer_ms": wire,
                    "kv_bytes": float(p * kv),
                }
            )
    rows.append(
        {
            "mode": "colocated",
            "prefill_tokens": 1024,
            "repetition": 0,
            "valid": True,
            "handoff_ms": 1e6,
            "kv_bytes": 1.0,
        }
    )
    rows.append(
        {"mode": "disaggregated", "prefill_tokens": 1024, "repetition": 9, "valid": False, "handoff_ms": 1e6}
    )
    return pd.DataFrame(rows)


def test_fit_recovers_setup_and_bandwidth_and_writes_a_link_profile_the_analysis_loads(
    tmp_path: Path,
) -> None:
    kv = 64 * 1024
    fit = fit_transfer(_synthetic(5.0, 10.0, kv, 0.05), kv, "handoff")
    assert isinstance(fit, TransferFit) and fit.n == 20
    assert fit.setup_ms == pytest.approx(5.0, abs=0.1)
    assert fit.bandwidth_gbit_s == pytest.approx(10.0, rel=0.02)
    assert fit.r2 is not None and fit.r2 > 0.99
    lo, hi = fit.bandwidth_ci_gbit_s or (0, 0)
    assert lo < 10.0 < hi
    assert fit.kv_bytes_per_token_measured == pytest.approx(kv)
    path = tmp_path / "measured-local-handoff.yaml"
    write_link(path, link_profile(fit, "results/run-1", "nixl-cpu"))
    link = LinkProfile.model_validate(yaml.safe_load(path.read_text()))
    assert link.name == "measured-local-handoff" and link.basis == "measured" and link.run == "results/run-1"
    assert link.describe() == "measured-local-handoff: measured (run results/run-1)"
    assert link.transfer_ms(8192 * kv) == pytest.approx(5.0 + 8192 * kv * 8 / 10e9 * 1e3, rel=0.03)


def test_one_stalled_transfer_does_not_tilt_the_link_and_the_fit_reports_its_out_of_sample_error() -> None:
    kv = 64 * 1024
    table = _synthetic(5.0, 10.0, kv, 0.05)
    clean = fit_transfer(table, kv, "handoff")
    assert isinstance(clean, TransferFit) and clean.lopo_error_pct is not None and clean.lopo_error_pct < 2.0
    # one hand-off at the smallest P stalls for 400 ms (a scheduler hiccup): OLS would tilt the line
    # (setup +20 ms, the slope pulled down); the robust fit keeps setup and bandwidth
    stalled = table.copy()
    first = stalled.index[(stalled["mode"] == "disaggregated") & (stalled["prefill_tokens"] == 1024)][0]
    stalled.loc[first, "handoff_ms"] += 400.0
    fit = fit_transfer(stalled, kv, "handoff")
    assert isinstance(fit, TransferFit)
    assert fit.setup_ms == pytest.approx(5.0, abs=0.3)
    assert fit.bandwidth_gbit_s == pytest.approx(10.0, rel=0.02)
    assert fit.lopo_error_pct is not None and fit.lopo_error_pct < 5.0  # the median ignores the one stall
    assert fit.downweighted_ms == [pytest.approx(stalled.loc[first, "handoff_ms"])]
    assert "1 of 20 times down-weighted as outliers" in fit.verdict
    assert fit.r2 is not None and fit.r2 > 0.99  # weighted as the fit weighted: the stall does not sink it
    # two P only: no line is left when one is held out, so no out-of-sample figure rather than a fake one
    two = table[table["prefill_tokens"].isin([1024, 2048])]
    two_fit = fit_transfer(two, kv, "handoff")
    assert isinstance(two_fit, TransferFit) and two_fit.lopo_error_pct is None


def test_a_slope_whose_interval_spans_zero_is_not_resolvable_and_gives_a_flat_profile() -> None:
    kv = 1024
    flat = _synthetic(3.0, 1e9, kv, 0.2, seed=3)  # 1 Pbit/s: the size term is far below the noise
    fit = fit_transfer(flat, kv, "handoff")
    assert isinstance(fit, TransferFit) and not fit.resolvable
    lo, hi = fit.ms_per_mib_ci
    assert lo < 0 < hi and "not resolvable at these sizes" in fit.verdict
    profile = link_profile(fit, "results/r", "nixl-cpu")
    assert profile["fixed_ms"] == pytest.approx(fit.mean_ms, abs=1e-3) and "bandwidth_gbit_s" not in profile
    assert "not resolvable" in LinkProfile.model_validate(profile).description
    one_p = fit_transfer(flat[flat["prefill_tokens"] == 1024], kv, "handoff")
    assert isinstance(one_p, NoTransferFit) and "over 1 P" in one_p.reason


def test_the_bytes_axis_is_the_connectors_counter_when_present_else_the_model_config() -> None:
    kv = 4096
    table = _synthetic(2.0, 20.0, kv, 0.01)
    counted = fit_transfer(table, None, "kv_xfer")  # no model config needed: NIXL counted the bytes
    assert isinstance(counted, TransferFit) and counted.x_source.startswith("connector bytes counter")
    assert counted.bandwidth_gbit_s == pytest.approx(20.0, rel=1e-6) and counted.resolvable
    no_bytes = table.drop(columns="kv_bytes")
    no_axis = fit_transfer(no_bytes, None, "kv_xfer")
    assert isinstance(no_axis, NoTransferFit) and "no bytes axis" in no_axis.reason
    modelled = fit_transfer(no_bytes, kv, "kv_xfer")
    assert isinstance(modelled, TransferFit) and modelled.x_source.startswith("P × kv_bytes_per_token")


def test_link_profiles_say_measured_with_their_run_or_assumed_with_the_assumption() -> None:
    from analysis.breakeven import list_links, load_link

    for name in list_links():
        link = load_link(name)
        assert link.describe().startswith(f"{name}: {link.basis}")
        if link.basis == "measured":
            assert link.run and (REPO / link.run / "manifest.json").is_file(), "the cited run is committed"
        else:
            assert link.assumption
    assert load_link("roce-4x200g").basis == "assumed" and "0.8" in (
        load_link("roce-4x200g").assumption or ""
    )
    with pytest.raises(ValueError, match="needs the assumption"):
        LinkProfile(name="x", basis="assumed", fixed_ms=1.0)
    with pytest.raises(ValueError, match="needs run"):
        LinkProfile(name="x", basis="measured", fixed_ms=1.0)


def test_cli_durations_carry_units_and_out_is_the_run_folder(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from microbench.transfer.cli import build_parser, duration, main

    assert duration("500ms") == 0.5 and duration("2m") == 120 and duration("30s") == 30
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--stall-timeout", "60"])  # no unit: refused, not read as seconds
    assert "not a duration" in capsys.readouterr().err
    args = build_parser().parse_args(["--out", str(tmp_path / "run"), "--phase-timeout", "10m"])
    assert args.out == tmp_path / "run" and args.phase_timeout_s == 600
    assert main(["--resume", "--out", str(tmp_path / "nothing")]) == 2
    assert "has no manifest.json" in capsys.readouterr().err


def test_a_missing_connector_package_is_refused_before_any_engine_with_this_platforms_install_command(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from engine_harness.kv_connectors import ConnectorPreset
    from microbench.measure import engine_pair
    from microbench.measure.engine_pair import PairAborted
    from microbench.transfer.engine_pair import check_runnable

    monkeypatch.setattr(engine_pair, "torch_cuda_version", lambda: "13.0")
    preset = ConnectorPreset(name="nixl-x", run_here=True, requires=["json", "no_such_module_xyz"])
    with pytest.raises(PairAborted, match=r"\['no_such_module_xyz'\].*pip install no_such_module_xyz"):
        check_runnable(TransferConfig(), preset)
    check_runnable(TransferConfig(), preset.model_copy(update={"requires": ["json"]}))  # all there: runs
