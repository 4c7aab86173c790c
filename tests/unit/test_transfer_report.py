"""The end of a transfer run from records on disk: table, fits, link profile, figure (no engine)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from analysis.breakeven import LinkProfile
from analysis.transfer.breakdown import breakdown_table
from microbench.results.layout import TransferFolder
from microbench.results.transfer import EngineSide, Phases, TransferRecord
from microbench.transfer.config import TransferConfig
from microbench.transfer.report import finish_run

KV = 1024  # bytes per token of the bundled tiny model in float32


def _side(**kw: float | None) -> EngineSide:
    fields = dict.fromkeys(EngineSide.model_fields, None)
    return EngineSide(**(fields | kw))


def _record(
    mode: str, p: int, rep: int, rng: np.random.Generator, valid: bool = True, xfer_reported: bool = True
) -> TransferRecord:
    producer = 0.5 * p / 100 + rng.normal(0, 0.2)
    if mode == "colocated":
        producer *= 2  # the idle peer's busy-polling: twice the lone engine's time
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
        consumer=(
            _side(
                tokens_external=p - 1,
                kv_xfer_ms=xfer if xfer_reported else None,
                kv_xfer_count=1.0 if xfer_reported else None,
                kv_bytes=float(p * KV) if xfer_reported else None,
            )
            if disagg
            else None
        ),
        cached_tokens_consumer=p - 1 if disagg else None,
        cached_tokens_producer=0,
        completion_tokens=4,
        stamps={"t_client_send_ns": 0},
        raw_file=f"raw/{mode}/P{p}_r{rep}.parquet",
    )


def _finish(folder: TransferFolder, cfg: TransferConfig) -> str:
    import io

    from rich.console import Console

    out = io.StringIO()
    finish_run(folder, cfg, Console(file=out, width=200))
    return out.getvalue()


def test_finish_run_writes_table_fit_link_and_figure_from_the_records(tmp_path: Path) -> None:
    folder = TransferFolder(tmp_path / "run")
    rng = np.random.default_rng(1)
    cfg = TransferConfig(prefill_tokens=[1024, 4096, 16384], repetitions=3, engine={"preset": "cpu"})
    for mode, p, rep in cfg.points():
        folder.write_transfer(_record(mode, p, rep, rng), 0, final=True)
    folder.write_transfer(_record("disaggregated", 1024, 9, rng, valid=False), 0, final=True)
    folder.write_idle("pair", {})
    printed = _finish(folder, cfg)
    table = pd.read_csv(folder.root / "transfer_table.csv")
    assert len(table) == 3 * 3 * 3 + 1 and table["valid"].sum() == 27
    # the consumer's own TTFT has its own column; the client-side phase keeps its value
    dis = table[table["mode"] == "disaggregated"]
    assert {"consumer_engine_ttft_ms", "producer_engine_ttft_ms"} <= set(table.columns)
    assert (dis["consumer_ttft_ms"] > 0).all()
    fit = json.loads((folder.root / "fit.json").read_text())
    assert abs(fit["kv_xfer"]["bandwidth_gbit_s"] - 8.0) < 0.01  # 10⁶ bytes per ms = 8 Gbit/s
    assert abs(fit["kv_xfer"]["setup_ms"] - 1.0) < 0.01 and fit["kv_xfer"]["r2"] > 0.999
    assert fit["kv_xfer"]["resolvable"] and fit["kv_xfer"]["x_source"].startswith("connector bytes")
    assert fit["handoff"]["n"] == 9 and abs(fit["handoff"]["setup_ms"] - 4.0) < 0.3
    assert abs(fit["handoff"]["kv_bytes_per_token_measured"] - KV) < 1
    # the link profile is the connector's own stage, not the hand-off, and cites its run
    link = LinkProfile.model_validate(yaml.safe_load((folder.root / "link-measured-local.yaml").read_text()))
    assert link.bandwidth_gbit_s == pytest.approx(8.0, rel=0.01) and link.basis == "measured"
    assert link.run == str(folder.root.resolve()) and link.bandwidth_ci_gbit_s is not None
    assert "measured (run" in link.describe()
    assert (folder.root / "transfer_breakdown.png").stat().st_size > 20_000
    agg = breakdown_table(table)
    assert list(agg.index) == [1024, 4096, 16384] and (agg["n_disaggregated"] == 3).all()
    # the stacked parts are the median repetition's: they add up to its total exactly
    parts = agg[["producer_ms", "proxy_gap_ms", "kv_xfer_ms", "consumer_rest_ms", "client_overhead_ms"]]
    assert np.allclose(parts.sum(axis=1), agg["total_ttft_ms"], atol=1e-9)
    assert np.allclose(agg["stack_sum_ms"], agg["total_ttft_ms"], atol=1e-9)
    assert (agg["total_ttft_ms"] == agg["disaggregated_ttft_ms"]).all()  # odd count: the median itself
    # contention: colocated is built 2× the lone engine's prefill (+0.3 ms client), so the factor is ≈ 2
    assert agg["contention_factor"].between(1.9, 2.0).all()
    assert "contention factor colocated ÷ alone" in printed and "P 16384 ×" in printed


def test_a_connector_without_transfer_time_shows_a_missing_value_and_a_footnote_never_zero(
    tmp_path: Path,
) -> None:
    folder = TransferFolder(tmp_path / "run")
    rng = np.random.default_rng(2)
    cfg = TransferConfig(prefill_tokens=[1024, 4096], repetitions=2, engine={"preset": "cpu"}, alone=False)
    for mode, p, rep in cfg.points():
        folder.write_transfer(_record(mode, p, rep, rng, xfer_reported=False), 0, final=True)
    printed = _finish(folder, cfg)
    agg = pd.read_csv(folder.root / "breakdown.csv", index_col=0)
    assert agg["kv_xfer_ms"].isna().all() and agg["consumer_rest_ms"].isna().all()
    assert agg["stack_sum_ms"].notna().all()  # the consumer leg, undivided, still counts
    assert agg["contention_factor"].isna().all()  # no lone engine measured: unknown, not 1 or 0
    assert "counted vllm:nixl_xfer_time_seconds" in printed and "KV xfer 0.0" not in printed
    assert "not measured (needs colocated and alone points)" in printed
    # a P of the definition with no valid point is named, not dropped in silence
    cfg8 = cfg.model_copy(update={"prefill_tokens": [1024, 4096, 8192]})
    assert "P [8192]: no valid point" in _finish(folder, cfg8)
    fit = json.loads((folder.root / "fit.json").read_text())
    assert "a line needs ≥ 3 points" in fit["kv_xfer"]["reason"]
    assert not (folder.root / "link-measured-local.yaml").exists()


def test_a_link_that_cannot_be_fitted_still_gets_its_figure_with_the_measured_points(tmp_path: Path) -> None:
    folder = TransferFolder(tmp_path / "run")
    cfg = TransferConfig(prefill_tokens=[1024, 4096], repetitions=1, engine={"preset": "cpu"}, alone=False)
    for mode, p, rep in cfg.points():  # bytes counted, but 2 points: too few for a line
        folder.write_transfer(_record(mode, p, rep, np.random.default_rng(4)), 0, final=True)
    printed = _finish(folder, cfg)
    assert (
        "a line needs ≥ 3 points" in json.loads((folder.root / "fit.json").read_text())["kv_xfer"]["reason"]
    )
    assert (folder.root / "transfer_breakdown.png").stat().st_size > 20_000 and "no figure" not in printed


def test_median_row_is_the_middle_repetition_and_the_lower_middle_for_even_counts() -> None:
    from analysis.transfer.breakdown import median_row

    rows = pd.DataFrame({"total_ttft_ms": [30.0, 10.0, 20.0, 40.0], "rep": [0, 1, 2, 3]})
    assert median_row(rows)["rep"] == 2  # 10, 20, 30, 40 → 20 (the lower middle)
    assert median_row(rows.iloc[:3])["rep"] == 2  # 10, 20, 30 → 20


def test_an_invalid_point_prints_its_reason_through_rich_markup() -> None:
    import io

    from rich.console import Console

    from microbench.transfer.runner import point_line

    rec = _record("disaggregated", 1024, 0, np.random.default_rng(0), valid=False)
    out = io.StringIO()
    Console(file=out, width=300).print(point_line(rec))
    assert "[invalid: the consumer recomputed the prompt]" in out.getvalue()


def test_the_transfer_comes_from_the_engine_that_counted_it_push_on_the_producer() -> None:
    from microbench.results.transfer import records_frame

    rec = _record("disaggregated", 4096, 0, np.random.default_rng(3))
    pull = records_frame([rec]).iloc[0]
    assert pull["kv_xfer_side"] == "consumer" and pull["kv_bytes"] == 4096 * KV
    # push: the consumer's histogram exists but did not count (0 ms, 0 transfers); the producer wrote
    push = rec.model_copy(
        update={
            "consumer": _side(tokens_external=4095, kv_xfer_ms=0.0, kv_xfer_count=0.0, kv_bytes=0.0),
            "producer": _side(
                tokens_local_compute=4096, kv_xfer_ms=0.96, kv_xfer_count=1.0, kv_bytes=4194304.0
            ),
        }
    )
    row = records_frame([push]).iloc[0]
    assert row["kv_xfer_side"] == "producer" and row["kv_xfer_ms"] == 0.96 and row["kv_bytes"] == 4194304.0
    nothing = push.model_copy(update={"producer": _side(kv_xfer_ms=0.0, kv_xfer_count=0.0)})
    assert pd.isna(records_frame([nothing]).iloc[0]["kv_xfer_ms"])  # measured nowhere: missing, not 0
