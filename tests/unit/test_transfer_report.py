"""The end of a transfer run from records on disk: table, fits, link profile, figure (no engine)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import yaml

from analysis.breakeven import LinkProfile
from microbench.transfer.config import TransferConfig
from microbench.transfer.figure import breakdown_table
from microbench.transfer.folder import TransferFolder
from microbench.transfer.records import EngineSide, Phases, TransferRecord
from microbench.transfer.report import finish_run

KV = 1024  # bytes per token of the bundled tiny model in float32


def _side(**kw: float | None) -> EngineSide:
    fields = dict.fromkeys(EngineSide.model_fields, None)
    return EngineSide(**(fields | kw))


def _record(mode: str, p: int, rep: int, rng: np.random.Generator, valid: bool = True) -> TransferRecord:
    producer = 0.5 * p / 100 + rng.normal(0, 0.2)
    xfer = 1.0 + p * KV / 1e6  # 1 ms + 1 GB/s
    handoff = 3.0 + xfer + rng.normal(0, 0.1)
    disagg = mode == "disaggregated"
    total = producer + handoff + 0.5 if disagg else producer + 0.3
    return TransferRecord(
        run_id="r",
        mode=mode,  # type: ignore[arg-type]
        prefill_tokens=p,
        repetition=rep,
        connector="nixl-cpu",
        decode_tokens=4,
        valid=valid,
        reasons=[] if valid else ["the consumer recomputed the prompt"],
        phases=Phases(
            total_ttft_ms=total,
            producer_ms=producer if disagg else None,
            proxy_gap_ms=0.2 if disagg else None,
            consumer_ttft_ms=handoff - 0.2 if disagg else None,
            handoff_ms=handoff if disagg else None,
            client_overhead_ms=0.5 if disagg else None,
        ),
        producer=_side(tokens_local_compute=p),
        consumer=_side(tokens_external=p - 1, kv_xfer_ms=xfer, kv_bytes=float(p * KV)) if disagg else None,
        cached_tokens_consumer=p - 1 if disagg else None,
        cached_tokens_producer=0,
        completion_tokens=4,
        stamps={"t_client_send_ns": 0},
        raw_file=f"raw/{mode}/P{p}_r{rep}.parquet",
    )


def test_finish_run_writes_table_fit_link_and_figure_from_the_records(tmp_path: Path) -> None:
    folder = TransferFolder(tmp_path / "run")
    rng = np.random.default_rng(1)
    cfg = TransferConfig(prefill_tokens=[1024, 4096, 16384], repetitions=3, engine={"preset": "cpu"})
    for mode, p, rep in cfg.points():
        folder.write_transfer(_record(mode, p, rep, rng), 0, final=True)
    folder.write_transfer(_record("disaggregated", 1024, 9, rng, valid=False), 0, final=True)
    from rich.console import Console

    finish_run(folder, cfg, Console(file=open("/dev/null", "w")))  # noqa: SIM115
    table = pd.read_csv(folder.root / "transfer_table.csv")
    assert len(table) == 2 * 3 * 3 + 1 and table["valid"].sum() == 18
    # the consumer's own TTFT has its own column; the client-side phase keeps its value
    dis = table[table["mode"] == "disaggregated"]
    assert {"consumer_engine_ttft_ms", "producer_engine_ttft_ms"} <= set(table.columns)
    assert (dis["consumer_ttft_ms"] > 0).all()
    fit = json.loads((folder.root / "fit.json").read_text())
    assert abs(fit["kv_xfer"]["bandwidth_gbit_s"] - 8.0) < 0.01  # 10⁶ bytes per ms = 8 Gbit/s
    assert abs(fit["kv_xfer"]["setup_ms"] - 1.0) < 0.01 and fit["kv_xfer"]["r2"] > 0.999
    assert fit["handoff"]["n"] == 9 and abs(fit["handoff"]["setup_ms"] - 4.0) < 0.3
    assert abs(fit["handoff"]["kv_bytes_per_token_measured"] - KV) < 1
    link = LinkProfile.model_validate(yaml.safe_load((folder.root / "link-measured-local.yaml").read_text()))
    assert link.bandwidth_gbit_s is not None and 5 < link.bandwidth_gbit_s < 12
    assert (folder.root / "transfer_breakdown.png").stat().st_size > 20_000
    agg = breakdown_table(table)
    assert list(agg.index) == [1024, 4096, 16384] and (agg["n_disagg"] == 3).all()
    # the stacked parts of a disaggregated bar add up to its median total (medians of sums ≈ sums of medians)
    parts = agg[["producer_ms", "kv_xfer_ms", "handoff_rest_ms", "client_overhead_ms"]].sum(axis=1)
    assert np.allclose(parts, agg["total_ttft_ms"], rtol=0.05)
    assert (agg["colocated_ttft_ms"] < agg["total_ttft_ms"]).all()
