"""The end of a transfer run: ``transfer_table.csv``, ``fit.json``, ``link-measured-local.yaml``, the figure,
and a console summary — all computed from the records on disk, so a resumed or partial run reports too.
"""

from __future__ import annotations

import json
from collections.abc import Mapping

from rich.console import Console
from rich.table import Table

from benchcore.atomic import atomic_write_bytes
from microbench.transfer.config import TransferConfig
from microbench.transfer.figure import breakdown_figure, breakdown_table
from microbench.transfer.fit import fit_transfer, kv_bytes_per_token, link_profile, write_link
from microbench.transfer.folder import TransferFolder, records_frame

__all__ = ["finish_run"]


def finish_run(folder: TransferFolder, cfg: TransferConfig, console: Console) -> None:
    """Write the table, fits, link profile and figure of whatever is on disk; print the summary."""
    table = records_frame(folder.records())
    if table.empty:
        console.print("no point measured yet")
        return
    buf = table.to_csv(index=False, float_format="%.4f").encode()
    atomic_write_bytes(folder.root / "transfer_table.csv", buf)
    spec = cfg.producer_spec()
    kv = kv_bytes_per_token(spec.model, spec.dtype)
    fits = {t: fit_transfer(table, kv, t) for t in ("handoff", "kv_xfer")} if kv else {}
    body = {t: (f.model_dump(mode="json") if f else None) for t, f in fits.items()}
    atomic_write_bytes(folder.root / "fit.json", (json.dumps(body, indent=2) + "\n").encode())
    handoff = fits.get("handoff")
    if handoff is not None:
        notes = (
            "Hand-off = producer's answer → consumer's first token at the proxy, both engines on one "
            "2-core host, pinned to separate cores."
        )
        write_link(
            folder.root / "link-measured-local.yaml",
            link_profile(handoff, folder.root.name, cfg.connector, notes),
        )
    try:
        fig = breakdown_figure(table, handoff, f"PD-disaggregation TTFT breakdown ({cfg.connector})")
        fig.savefig(folder.root / "transfer_breakdown.png", dpi=120)
    except ValueError as exc:
        console.print(f"[yellow]no figure: {exc}")
    _print(console, breakdown_table(table), fits)


def _print(console: Console, agg: object, fits: Mapping[str, object]) -> None:
    import pandas as pd

    assert isinstance(agg, pd.DataFrame)
    t = Table(title="TTFT breakdown per P (median ms of valid points)")
    for col in ("P", "producer", "KV xfer", "hand-off", "client", "total", "colocated", "n"):
        t.add_column(col, justify="right")
    for p, row in agg.iterrows():
        t.add_row(
            str(p),
            *(
                "–" if pd.isna(row.get(c)) else f"{row[c]:.1f}"
                for c in (
                    "producer_ms",
                    "kv_xfer_ms",
                    "handoff_ms",
                    "client_overhead_ms",
                    "total_ttft_ms",
                    "colocated_ttft_ms",
                )
            ),
            "/".join("0" if pd.isna(row.get(c)) else f"{row[c]:.0f}" for c in ("n_disagg", "n_coloc")),
        )
    console.print(t)
    for name, f in fits.items():
        if f is None:
            console.print(f"fit {name}: not enough valid points (≥ 3 points over ≥ 2 P needed)")
            continue
        d = f.model_dump()  # type: ignore[attr-defined]
        bw = "n/a (slope ≤ 0)" if d["bandwidth_gbit_s"] is None else f"{d['bandwidth_gbit_s']:.3g} Gbit/s"
        r2 = "–" if d["r2"] is None else f"{d['r2']:.3f}"
        console.print(
            f"fit {name}: setup {d['setup_ms']:.2f} ms "
            f"(95% CI {d['setup_ci_ms'][0]:.2f}…{d['setup_ci_ms'][1]:.2f}), "
            f"bandwidth {bw}, R² {r2}, n={d['n']}"
        )
