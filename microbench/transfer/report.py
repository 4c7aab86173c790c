"""The end of a transfer run: ``transfer_table.csv``, ``breakdown.csv``, ``fit.json``,
``link-measured-local.yaml`` (NIXL's transfer), ``link-measured-local-handoff.yaml`` (the whole hand-off),
the figure and a console summary — all computed from what is on disk
(records and ``idle_cpu.json``), so a resumed or partial run reports too. The notes are built from
what was measured (idle CPU, contention factors, which connector metric was present), not asserted.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from analysis.transfer.breakdown import breakdown_table
from analysis.transfer.figure import breakdown_figure
from analysis.transfer.fit import (
    LINK_NAMES,
    NoTransferFit,
    TransferFit,
    fit_transfer,
    link_profile,
    write_link,
)
from benchcore.atomic import atomic_write_bytes
from engine_harness.model_kv import read_model_kv
from microbench.results.layout import TransferFolder
from microbench.results.transfer import records_frame
from microbench.transfer.config import TransferConfig

__all__ = ["contention_notes", "finish_run", "run_reference"]

REPO = Path(__file__).resolve().parents[2]
_COLUMNS = [  # (header, column)
    ("P", None),
    ("producer", "producer_ms"),
    ("proxy gap", "proxy_gap_ms"),
    ("KV xfer", "kv_xfer_ms"),
    ("consumer rest", "consumer_rest_ms"),
    ("client", "client_overhead_ms"),
    ("total", "total_ttft_ms"),
    ("coloc.", "colocated_ttft_ms"),
    ("alone", "alone_ttft_ms"),
    ("contention", "contention_factor"),
    ("prefill ×", "prefill_factor"),
]


def run_reference(root: Path) -> str:
    """How a link profile cites its run: relative to the repository when inside it."""
    try:
        return str(root.resolve().relative_to(REPO))
    except ValueError:
        return str(root.resolve())


def contention_notes(agg: pd.DataFrame, idle: dict[str, dict[str, dict[str, object]]]) -> list[str]:
    """What the run measured about contention, in words (pure)."""
    notes = []
    for stage, roles in idle.items():
        parts = []
        for role, s in roles.items():
            top = s.get("top_threads_pct") or {}
            busiest = next(iter(top.items()), None) if isinstance(top, dict) else None
            moved = s.get("deprioritized") or []
            parts.append(
                f"{role} {s.get('total_pct')}% of a core"
                + (f" (busiest thread {busiest[0]} {busiest[1]}%)" if busiest else "")
                + (f", then moved to SCHED_IDLE: {', '.join(moved)}" if moved else "")  # type: ignore[arg-type]
            )
        notes.append(f"idle CPU, {stage} stage: " + ", ".join(parts))
    factors = agg["contention_factor"].dropna() if "contention_factor" in agg else pd.Series(dtype=float)
    if factors.empty:
        notes.append("contention factor: not measured (needs colocated and alone points)")
    else:
        notes.append(
            "contention factor colocated ÷ alone (median TTFT): "
            + ", ".join(f"P {int(p)} ×{f:.2f}" for p, f in factors.items())
        )
    return notes


def _fits(table: pd.DataFrame, cfg: TransferConfig) -> dict[str, TransferFit | NoTransferFit]:
    spec = cfg.producer_spec()
    model = read_model_kv(spec.model, spec.dtype)  # None: a hub model, no local config
    kv = model.kv_bytes_per_token if model is not None else None
    return {t: fit_transfer(table, kv, t) for t in ("kv_xfer", "handoff")}


def finish_run(folder: TransferFolder, cfg: TransferConfig, console: Console) -> None:
    """Write the tables, fits, link profile and figure of whatever is on disk; print the summary."""
    table = records_frame(folder.records())
    if table.empty:
        console.print("no point measured yet")
        return
    atomic_write_bytes(
        folder.root / "transfer_table.csv", table.to_csv(index=False, float_format="%.4f").encode()
    )
    agg = breakdown_table(table)
    atomic_write_bytes(folder.root / "breakdown.csv", agg.to_csv(float_format="%.4f").encode())
    fits = _fits(table, cfg)
    body = {t: f.model_dump(mode="json") for t, f in fits.items()}
    atomic_write_bytes(folder.root / "fit.json", (json.dumps(body, indent=2) + "\n").encode())
    notes = contention_notes(agg, folder.read_idle())
    for fit in fits.values():  # a NoTransferFit has no line to draw
        if isinstance(fit, TransferFit):
            profile = link_profile(fit, run_reference(folder.root), cfg.connector, "; ".join(notes) + ".")
            write_link(folder.root / f"link-{LINK_NAMES[fit.target]}.yaml", profile)
    kv_xfer = fits.get("kv_xfer")
    link = kv_xfer if isinstance(kv_xfer, TransferFit) else None
    footnotes = _footnotes(agg, cfg)
    try:
        fig = breakdown_figure(
            table, link, f"PD-disaggregation TTFT breakdown ({cfg.connector})", notes + footnotes
        )
        fig.savefig(folder.root / "transfer_breakdown.png", dpi=120)
    except ValueError as exc:
        console.print(f"[yellow]no figure: {escape(str(exc))}")
    _print(console, agg, fits, notes + footnotes)


def _footnotes(agg: pd.DataFrame, cfg: TransferConfig) -> list[str]:
    out = []
    missing = sorted(set(cfg.prefill_tokens) - {int(p) for p in agg.index})
    if missing:
        out.append(f"P {missing}: no valid point (yet): see invalid/ and the records' reasons")
    if "kv_xfer_ms" in agg and agg["kv_xfer_ms"].isna().any():
        metric = cfg.connector_preset().transfer_time_metric
        out.append(
            f"KV xfer –: neither engine's /metrics counted {metric} for those points: the consumer leg "
            "is not split"
            if metric
            else f"KV xfer –: connector {cfg.connector} reports no transfer time: the consumer leg is not "
            "split"
        )
    if "stack_sum_ms" in agg:
        gap = (agg["stack_sum_ms"] - agg["total_ttft_ms"]).abs().max()
        if pd.notna(gap) and gap > 0.01:
            out.append(f"the stacked parts miss the total by up to {gap:.2f} ms (a phase was not stamped)")
    return out


def _cell(value: object, digits: int = 1) -> str:
    return "–" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value:.{digits}f}"


def _print(
    console: Console, agg: pd.DataFrame, fits: dict[str, TransferFit | NoTransferFit], notes: list[str]
) -> None:
    t = Table(title="TTFT per P (ms): disaggregated parts of the median repetition; medians of the rest")
    for header, _ in _COLUMNS:
        t.add_column(header, justify="right")
    t.add_column("n d/c/a", justify="right")
    for p, row in agg.iterrows():
        cells = [str(p)] + [_cell(row.get(c), 2 if "factor" in (c or "") else 1) for _, c in _COLUMNS[1:]]
        counts = "/".join(
            "0" if pd.isna(row.get(f"n_{m}")) else f"{row[f'n_{m}']:.0f}"
            for m in ("disaggregated", "colocated", "alone")
        )
        t.add_row(*cells, counts)
    console.print(t)
    for name, f in fits.items():
        if isinstance(f, NoTransferFit):
            console.print(f"fit {name}: no fit ({f.reason})")
            continue
        console.print(
            escape(
                f"fit {name}: {f.verdict}; setup {f.setup_ms:.2f} ms (95% CI {f.setup_ci_ms[0]:.2f}…"
                f"{f.setup_ci_ms[1]:.2f}), R² {_cell(f.r2, 3)}, leave-one-P-out error "
                f"{_cell(f.lopo_error_pct)}%, n={f.n}, bytes from the {f.x_source}"
            )
        )
    for note in notes:
        console.print(escape(f"note: {note}"))
