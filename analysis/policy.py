"""Offload-policy lookup table: build it from a run and a link, save (CSV + JSON), load, query.

``f(D, P, chunk) → (interference cost, transfer cost, decision, margin)``: offload iff the interference
cost (measured aggregate decode delay; the step model's prediction where a cell has no valid measurement)
exceeds the transfer cost of the link. ``OffloadPolicy.decide`` answers between grid points by
interpolating the interference cost linearly in D and in log P (so it stays monotone where the data
is), on the nearest measured chunk size; the transfer cost is recomputed from the link at the exact P.
A query outside the measured range raises ``OutOfRangeError``.

CLI::

    python -m analysis.policy build results/<run> --link roce-4x200g [--mode layerwise] [--out PATH]
    python -m analysis.policy query results/<run>/policy/offload_policy_roce-4x200g_layerwise.json \
        --D 6 --P 12000 --chunk 8192
"""

from __future__ import annotations

import argparse
import bisect
import json
import math
import sys
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from analysis.breakeven import (
    LinkProfile,
    TransferMode,
    breakeven_table,
    load_link,
    load_model_kv,
    run_model_kv,
)
from analysis.table import aggregate_cells, load_manifest, load_records, records_frame
from benchcore.cli import BadInput, run_cli
from benchcore.flags import add_out
from engine_harness.model_kv import ModelKV

__all__ = ["FORMAT", "POLICY_COLUMNS", "Decision", "OffloadPolicy", "OutOfRangeError", "build_policy", "main"]

FORMAT = "analysis.policy/1"
POLICY_COLUMNS = [
    "chunk_size", "decode_batch_size", "new_prefill_tokens", "interference_ms", "transfer_ms", "decision",
    "margin_ms", "interference_source", "repetitions", "prefill_compute_ms",
]  # fmt: skip


class OutOfRangeError(ValueError):
    """A query outside the measured (D, P, chunk) range: the table does not extrapolate."""


@dataclass(frozen=True)
class Decision:
    decode_batch_size: float
    new_prefill_tokens: float
    chunk_size: int
    chunk_used: int
    interference_ms: float
    transfer_ms: float
    offload: bool
    margin_ms: float
    interpolated: bool


def build_policy(
    run_dir: Path,
    link: LinkProfile,
    mode: TransferMode = "layerwise",
    model: ModelKV | None = None,
) -> OffloadPolicy:
    """The lookup table of a run folder for one link (``model``: the run's own model by default)."""
    run_dir = Path(run_dir)
    records = load_records(run_dir)
    table = aggregate_cells(records_frame(run_dir), n_boot=200)
    if model is None:
        model = run_model_kv(run_dir)
    cells = breakeven_table(table, model, link, mode)
    fit: dict[str, Any] = {}
    step = None
    try:  # statsmodels only here: the table itself stays light
        from analysis.models import compare_models, fit_step_model

        step = fit_step_model(records)
        comparison = compare_models(records, loo=pd.DataFrame(columns=["seed_mape", "step_mape"]))
        fit = {
            "step_params": step.params,
            "step_r2_steps": step.r2,
            "step_n": step.n,
            "step_data": step.data,
            "seed_r2_interference": float(comparison.loc[0, "r2"]),
            "step_r2_interference": float(comparison.loc[1, "r2"]),
        }
    except ValueError as exc:
        fit = {"error": str(exc)}
    source = ["measured"] * len(cells)
    for i in cells.index[cells["interference_ms"].isna()]:
        if step is not None:
            row = cells.loc[i]
            cells.loc[i, "interference_ms"] = step.interference_ms(
                int(row["decode_batch_size"]),
                int(row["new_prefill_tokens"]),
                int(row["chunk_size"]),
                table["scheduling"].get(i) if "scheduling" in table else None,  # NaN: mixed
            )
            source[i] = "step_model"
        else:
            source[i] = "missing"
    cells["interference_source"] = source
    cells["margin_ms"] = cells["interference_ms"] - cells["transfer_ms"]
    cells["decision"] = [
        "unknown" if math.isnan(m) else ("offload" if m > 0 else "local") for m in cells["margin_ms"]
    ]
    cells["repetitions"] = table["repetitions"].to_numpy()
    bare = table[table["decode_batch_size"] == 0].set_index(["chunk_size", "new_prefill_tokens"])
    cells["prefill_compute_ms"] = [
        float(bare["prefill_duration_ms"].get((c, p), math.nan))
        for c, p in zip(cells["chunk_size"], cells["new_prefill_tokens"], strict=True)
    ]
    manifest = load_manifest(run_dir)
    metadata = {
        "format": FORMAT,
        "created_utc": datetime.now(UTC).isoformat(timespec="seconds"),
        "source_run": str(run_dir),
        "run_id": manifest.run_id if manifest else run_dir.name,
        "engine_version": manifest.engine_version if manifest else None,
        "model": asdict(model) | {"kv_bytes_per_token": model.kv_bytes_per_token},
        "link": link.model_dump(),
        "mode": mode,
        "interference_cost": "median aggregate decode delay over valid repetitions (ms; seed 002's "
        "num_chunks × D × penalty), the step model's prediction where a cell has none",
        "fit": fit,
        "link_basis": link.describe(),
        "warnings": [f"link {link.name!r} is a placeholder, not a measurement"] if link.placeholder else [],
    }
    return OffloadPolicy(cells[POLICY_COLUMNS].reset_index(drop=True), metadata)


class OffloadPolicy:
    """A loaded lookup table and its metadata; ``decide`` answers queries."""

    def __init__(self, cells: pd.DataFrame, metadata: dict[str, Any]):
        missing = set(POLICY_COLUMNS) - set(cells.columns)
        if missing:
            raise ValueError(f"policy table lacks columns {sorted(missing)}")
        self.cells = cells.sort_values(["chunk_size", "decode_batch_size", "new_prefill_tokens"]).reset_index(
            drop=True
        )
        self.metadata = metadata
        self.link = LinkProfile.model_validate(metadata["link"])
        self.model = ModelKV(**{k: v for k, v in metadata["model"].items() if k != "kv_bytes_per_token"})
        self.mode: TransferMode = metadata["mode"]
        self._grids: dict[int, tuple[list[float], list[float], pd.DataFrame]] = {}
        self._bare: dict[int, tuple[list[float], list[float]]] = {}
        self._chunks = sorted(int(c) for c in self.cells["chunk_size"].unique())

    def _grid(self, used: int) -> tuple[list[float], list[float], pd.DataFrame]:
        """The interference grid (D × P) of a measured chunk, built once: a live router asks per request,
        and building it (a pivot) takes milliseconds where the lookup takes microseconds."""
        if used not in self._grids:
            sub = self.cells[self.cells["chunk_size"] == used]
            grid = sub.pivot_table(
                index="decode_batch_size",
                columns="new_prefill_tokens",
                values="interference_ms",
                dropna=False,
            )
            self._grids[used] = ([float(d) for d in grid.index], [float(p) for p in grid.columns], grid)
        return self._grids[used]

    def save(self, path: Path) -> tuple[Path, Path]:
        """Write ``<path>.csv`` and ``<path>.json`` (the JSON holds metadata and every cell)."""
        stem = Path(path).with_suffix("")
        stem.parent.mkdir(parents=True, exist_ok=True)
        csv_path, json_path = stem.with_suffix(".csv"), stem.with_suffix(".json")
        self.cells.to_csv(csv_path, index=False, float_format="%.6g")
        payload = {"metadata": self.metadata, "cells": json.loads(self.cells.to_json(orient="records"))}
        json_path.write_text(json.dumps(payload, indent=2) + "\n")
        return csv_path, json_path

    @classmethod
    def load(cls, path: Path) -> OffloadPolicy:
        """From the JSON (or the CSV next to its JSON)."""
        path = Path(path)
        json_path = path.with_suffix(".json")
        if not json_path.is_file():
            raise FileNotFoundError(f"policy table {json_path} does not exist")
        payload = json.loads(json_path.read_text())
        if payload.get("metadata", {}).get("format") != FORMAT:
            raise ValueError(f"{json_path} is not a {FORMAT} policy table")
        cells = pd.DataFrame(payload["cells"], columns=POLICY_COLUMNS)
        for col in ["interference_ms", "transfer_ms", "margin_ms", "prefill_compute_ms"]:
            cells[col] = cells[col].astype(float)
        return cls(cells, payload["metadata"])

    def _chunk(self, chunk: int) -> int:
        chunks = self._chunks
        if not chunks[0] <= chunk <= chunks[-1]:
            raise OutOfRangeError(f"chunk {chunk} is outside the measured chunk sizes {chunks}")
        return min(chunks, key=lambda c: (abs(math.log(c / chunk)), c))

    def measured_range(self, chunk: int) -> tuple[int, tuple[float, float], tuple[float, float]]:
        """The chunk that answers for ``chunk`` and its measured D and P ranges (a caller that clamps
        queries onto the table, as the router does, reads its edges here)."""
        used = self._chunk(chunk)
        ds, ps, _ = self._grid(used)
        return used, (ds[0], ds[-1]), (ps[0], ps[-1])

    def interference_ms(self, decode_batch: float, prefill_tokens: float, chunk: int) -> tuple[float, int]:
        """Interference cost interpolated linearly in D and log P on the nearest chunk, and that chunk."""
        used = self._chunk(chunk)
        ds, ps, grid = self._grid(used)
        if not ds[0] <= decode_batch <= ds[-1]:
            raise OutOfRangeError(f"D={decode_batch} is outside the measured D range [{ds[0]:g}, {ds[-1]:g}]")
        if not ps[0] <= prefill_tokens <= ps[-1]:
            raise OutOfRangeError(
                f"P={prefill_tokens} is outside the measured P range [{ps[0]:g}, {ps[-1]:g}]"
            )

        def bracket(values: list[float], x: float, log: bool) -> list[tuple[int, float]]:
            i = bisect.bisect_left(values, x)
            if values[min(i, len(values) - 1)] == x:
                return [(i, 1.0)]
            f = math.log if log else float
            w = (f(x) - f(values[i - 1])) / (f(values[i]) - f(values[i - 1]))
            return [(i - 1, 1.0 - w), (i, w)]

        total = 0.0
        for di, dw in bracket(ds, decode_batch, log=False):
            for pi, pw in bracket(ps, prefill_tokens, log=True):
                value = float(grid.iat[di, pi])
                if math.isnan(value):
                    raise ValueError(f"no interference cost at chunk={used}, D={ds[di]:g}, P={ps[pi]:g}")
                total += dw * pw * value
        return total, used

    def transfer_ms(self, prefill_tokens: float, chunk: int) -> float:
        """The link's transfer time at exactly ``prefill_tokens`` (bare prefill interpolated in log P)."""
        compute = None
        if self.mode == "layerwise":
            if chunk not in self._bare:  # built once per chunk: a live router asks per request
                bare = self.cells[
                    (self.cells["chunk_size"] == chunk) & (self.cells["decode_batch_size"] == 0)
                ]
                bare = bare.dropna(subset=["prefill_compute_ms"]).sort_values("new_prefill_tokens")
                xs = [math.log(p) for p in bare["new_prefill_tokens"]]
                self._bare[chunk] = (xs, [float(y) for y in bare["prefill_compute_ms"]])
            xs, ys = self._bare[chunk]
            if len(xs) >= 2:
                x = math.log(prefill_tokens)
                # linear in log P inside the measured range, the last value above it, unknown below it
                compute = float(np.interp(x, xs, ys)) if x >= xs[0] else math.nan
        nbytes = prefill_tokens * self.model.kv_bytes_per_token
        return self.link.transfer_ms(nbytes, self.model.layers, self.mode, compute)

    def decide(self, decode_batch: float, prefill_tokens: float, chunk: int) -> Decision:
        """Offload or not at ``(D, P, chunk)``; raises ``OutOfRangeError`` outside the measured range."""
        interference, used = self.interference_ms(decode_batch, prefill_tokens, chunk)
        transfer = self.transfer_ms(prefill_tokens, used)
        ds, ps, _ = self._grid(used)
        on_grid = decode_batch in ds and prefill_tokens in ps
        return Decision(
            decode_batch_size=decode_batch,
            new_prefill_tokens=prefill_tokens,
            chunk_size=chunk,
            chunk_used=used,
            interference_ms=interference,
            transfer_ms=transfer,
            offload=interference > transfer,
            margin_ms=interference - transfer,
            interpolated=not bool(on_grid),
        )


def _build(args: argparse.Namespace) -> int:
    link = load_link(args.link)
    if args.kv_dtype and not args.model:
        raise BadInput("--kv-dtype needs --model")
    model = load_model_kv(args.model, args.kv_dtype) if args.model else None
    policy = build_policy(args.run, link, args.mode, model)
    out = args.out or args.run / "policy"
    csv_path, json_path = policy.save(out / f"offload_policy_{link.name}_{args.mode}")
    counts = policy.cells["decision"].value_counts().to_dict()
    print(f"link {link.describe()}", file=sys.stderr)
    print(json.dumps({"csv": str(csv_path), "json": str(json_path), "decisions": counts}))
    for warning in policy.metadata["warnings"]:
        print(f"warning: {warning}", file=sys.stderr)
    return 0


def _run(args: argparse.Namespace) -> int:
    try:
        if args.command == "build":
            return _build(args)
        decision = OffloadPolicy.load(args.table).decide(args.decode_batch, args.prefill_tokens, args.chunk)
        print(json.dumps(asdict(decision)))
        return 0
    except (ValueError, FileNotFoundError) as exc:
        raise BadInput(str(exc)) from None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m analysis.policy", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    build = sub.add_parser("build", help="build the lookup table of a run for a link")
    build.add_argument("run", type=Path)
    build.add_argument("--link", required=True, help="a name in analysis/links/ or a YAML path")
    build.add_argument("--mode", choices=["layerwise", "bulk"], default="layerwise")
    build.add_argument("--model", help="model name or config.json path (default: the run's model)")
    build.add_argument("--kv-dtype", help="KV-cache dtype when it differs from the model's (e.g. fp8)")
    add_out(build, "<run>/policy")
    query = sub.add_parser("query", help="ask a table for a decision")
    query.add_argument("table", type=Path)
    query.add_argument("--D", type=float, required=True, dest="decode_batch", help="decode batch size")
    query.add_argument("--P", type=float, required=True, dest="prefill_tokens", help="prefill tokens")
    query.add_argument("--chunk", type=int, required=True)
    args = parser.parse_args(argv)
    return run_cli(lambda: _run(args), lambda: getattr(args, "out", None))


if __name__ == "__main__":
    raise SystemExit(main())
