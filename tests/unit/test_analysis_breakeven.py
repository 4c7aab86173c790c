"""analysis.breakeven: KV bytes per token, link profiles, transfer arithmetic checked by hand."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd
import pytest
from pydantic import ValidationError

from analysis.breakeven import LinkProfile, breakeven_table, list_links, load_link, load_model_kv

REPO = Path(__file__).resolve().parents[2]


def test_kv_bytes_per_token() -> None:
    target = load_model_kv("Qwen3-Coder-30B-A3B-Instruct")
    assert target.kv_bytes_per_token == 2 * 48 * 4 * 128 * 2 == 98304
    for name in ("qwen3-moe-tiny", "qwen3-dense-tiny"):  # the bundled tiny models, from their config.json
        cfg = json.loads((REPO / "engine_harness" / "models" / name / "config.json").read_text())
        expected = 2 * cfg["num_hidden_layers"] * cfg["num_key_value_heads"] * cfg["head_dim"] * 2
        assert load_model_kv(name).kv_bytes_per_token == expected
        assert load_model_kv(f"engine_harness/models/{name}").kv_bytes_per_token == expected
    assert load_model_kv("Qwen3-Coder-30B-A3B-Instruct", dtype="fp8").kv_bytes_per_token == 49152
    with pytest.raises(ValueError, match="unknown model"):
        load_model_kv("no-such-model")


def test_links_load_and_validate(tmp_path: Path) -> None:
    assert {"measured-local", "roce-4x200g", "ib-8x400g", "seed-layerwise-50ms"} <= set(list_links())
    measured = load_link("measured-local")  # written by the transfer benchmark, no longer a guess
    assert measured.basis == "measured" and "microbench.transfer" in measured.source
    assert all(load_link(n).basis == "assumed" for n in ("roce-4x200g", "ib-8x400g", "seed-layerwise-50ms"))
    assert load_link("seed-layerwise-50ms").fixed_ms == 50.0
    with pytest.raises(ValueError, match="unknown link profile"):
        load_link("nope")
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: bad\nbasis: assumed\nassumption: x\nbandwidth_gbit_s: 10\nfixed_ms: 5\n")
    with pytest.raises(ValidationError, match="exactly one"):
        load_link(bad)
    bad.write_text("name: bad\nbandwith_gbit_s: 10\n")  # misspelt key
    with pytest.raises(ValidationError):
        load_link(bad)


def test_transfer_arithmetic_by_hand() -> None:
    model = load_model_kv("Qwen3-Coder-30B-A3B-Instruct")
    link = load_link("roce-4x200g")  # 800 Gb/s × 0.8 = 80e6 bytes/ms, setup 0.5 ms
    nbytes = 8192 * 98304  # 805,306,368 bytes
    assert link.bytes_per_ms == pytest.approx(80e6)
    assert link.transfer_ms(nbytes, 48, "bulk") == pytest.approx(0.5 + 805306368 / 80e6)  # 10.566 ms
    assert link.transfer_ms(nbytes, 48, "layerwise") == pytest.approx(0.5 + 10.0663296 / 48)  # 0.7097 ms
    # a prefill of 5 ms cannot hide a 10 ms transfer: 10.066 − 5·47/48 is exposed
    assert link.transfer_ms(nbytes, 48, "layerwise", 5.0) == pytest.approx(0.5 + 10.0663296 - 5 * 47 / 48)
    assert load_link("seed-layerwise-50ms").transfer_ms(nbytes * 10, 48, "layerwise") == 50.0

    table = pd.DataFrame(
        {
            "chunk_size": [8192, 8192, 8192],
            "decode_batch_size": [0, 4, 8],
            "new_prefill_tokens": [8192, 8192, 8192],
            "aggregate_decode_delay_ms": [math.nan, 20.0, math.nan],
            "prefill_duration_ms": [400.0, 410.0, 420.0],
        }
    )
    out = breakeven_table(table, model, link, mode="bulk")
    cell = out.iloc[1]
    assert cell.kv_bytes == nbytes
    assert cell.transfer_ms == pytest.approx(10.5663296)
    assert cell.break_even_transfer_ms == 20.0
    assert cell.margin_ms == pytest.approx(20.0 - 10.5663296)
    assert bool(cell.offload_wins)
    # break-even bandwidth: 805,306,368 B in 19.5 ms at 80% efficiency → 413.0 Gb/s nominal
    assert cell.break_even_gbit_s == pytest.approx(805306368 / 19.5 * 8e3 / 1e9 / 0.8)
    at_breakeven = link.model_copy(update={"bandwidth_gbit_s": cell.break_even_gbit_s})
    assert at_breakeven.transfer_ms(nbytes, 48, "bulk") == pytest.approx(20.0)
    assert out.iloc[0].interference_ms == 0 and not bool(out.iloc[0].offload_wins)  # D = 0: nothing to spare
    assert pd.isna(out.iloc[2].offload_wins)  # no valid measurement: unknown, not "local"


def test_layerwise_uses_the_bare_prefill_time() -> None:
    model = load_model_kv("Qwen3-Coder-30B-A3B-Instruct")
    slow = LinkProfile(  # 1e6 bytes/ms
        name="slow", basis="assumed", assumption="by hand", setup_latency_ms=1.0, bandwidth_gbit_s=8.0
    )
    table = pd.DataFrame(
        {
            "chunk_size": [8192, 8192],
            "decode_batch_size": [0, 4],
            "new_prefill_tokens": [4096, 4096],
            "aggregate_decode_delay_ms": [math.nan, 100.0],
            "prefill_duration_ms": [200.0, 210.0],
        }
    )
    out = breakeven_table(table, model, slow, mode="layerwise")
    wire = 4096 * 98304 / 1e6  # 402.65 ms on the wire, 200 ms of prefill hides 195.8 of it
    assert out.iloc[1].transfer_ms == pytest.approx(1.0 + wire - 200 * 47 / 48)
    assert not bool(out.iloc[1].offload_wins)
