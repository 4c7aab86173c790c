"""The offload table a router uses trades interference against the whole hand-off an offloaded request pays
(the transfer run's ``handoff`` fit, end to end through the proxy), not NIXL's transfer alone."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from analysis.breakeven import LinkProfile, load_link
from analysis.policy import OffloadPolicy
from analysis.transfer.fit import LINK_NAMES, TransferFit, fit_transfer, link_profile
from microbench.route.config import load_route_config

ROOT = Path(__file__).resolve().parents[2]
REFERENCE = ROOT / "results" / "transfer-cpu-reference"


def _handoffs(setup_ms: float, ms_per_mib: float, kv: int) -> pd.DataFrame:
    rows = []
    for p in (1024, 2048, 4096, 8192):
        for rep in range(3):
            mib = p * kv / 2**20
            rows.append({
                "mode": "disaggregated", "prefill_tokens": p, "repetition": rep, "valid": True,
                "kv_bytes": float(p * kv), "kv_xfer_ms": 2.0 + 0.01 * rep,
                "handoff_ms": setup_ms + ms_per_mib * mib + 0.1 * (rep - 1),
            })  # fmt: skip
    return pd.DataFrame(rows)


def test_the_handoff_fit_becomes_its_own_link_whose_cost_is_the_whole_handoff() -> None:
    kv = 1024
    table = _handoffs(40.0, 3.0, kv)
    handoff, xfer = fit_transfer(table, kv, "handoff"), fit_transfer(table, kv, "kv_xfer")
    assert isinstance(handoff, TransferFit) and isinstance(xfer, TransferFit)
    link = LinkProfile.model_validate(link_profile(handoff, "results/r", "nixl-cpu"))
    assert link.name == LINK_NAMES["handoff"] == "measured-local-handoff"
    assert "whole hand-off" in link.description
    # known answer: 40 ms + 3 ms/MiB; P 8192 at 1 KiB/token is 8 MiB
    assert link.transfer_ms(8192 * kv) == pytest.approx(40.0 + 3.0 * 8, rel=0.01)
    wire = LinkProfile.model_validate(link_profile(xfer, "results/r", "nixl-cpu"))
    assert wire.name == "measured-local" and wire.transfer_ms(8192 * kv) < 3.0


def test_the_shipped_handoff_link_is_the_reference_runs_fit_and_matches_its_measured_handoffs() -> None:
    shipped = load_link("measured-local-handoff")
    stored = LinkProfile.model_validate(
        yaml.safe_load((REFERENCE / "link-measured-local-handoff.yaml").read_text())
    )
    assert shipped == stored and shipped.run == "results/transfer-cpu-reference"
    breakdown = pd.read_csv(REFERENCE / "breakdown.csv", index_col="prefill_tokens")
    p = breakdown.index.to_numpy(dtype=float)
    predicted = np.array([shipped.transfer_ms(x * 1024) for x in p])  # fp32 tiny model: 1 KiB/token
    measured = breakdown["handoff_ms_median_ms"].to_numpy(dtype=float)
    assert np.median(np.abs(predicted - measured) / measured) < 0.25  # the fit's LOPO error is 22 %
    wire = load_link("measured-local")
    assert all(shipped.transfer_ms(x * 1024) > 5 * wire.transfer_ms(x * 1024) for x in p)


def test_the_route_sweep_asks_a_table_whose_transfer_cost_is_the_measured_handoff() -> None:
    cfg = load_route_config(ROOT / "sweeps" / "route-cpu.yaml", {})
    assert cfg.table is not None
    table = OffloadPolicy.load(ROOT / cfg.table)
    assert table.link.name == "measured-local-handoff" and table.mode == "bulk"
    got = table.decide(4, 1024, 2048)
    assert got.transfer_ms == pytest.approx(load_link("measured-local-handoff").transfer_ms(1024 * 1024))
    assert 35 < got.transfer_ms < 50  # the 46 ms a request paid at P 1024, not NIXL's 4.5 ms
