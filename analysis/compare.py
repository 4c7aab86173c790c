"""``python -m analysis.compare RUN_A RUN_B``: the A/B comparison of two interference run folders.

Per cell (chunk, D, P) the effect B/A of one figure (default the cell's headline: the full-step penalty,
the bare prefill's duration at D = 0; ``analysis.table.headline_column``) from the **valid repetitions**
of each run, with its bootstrap CI, rank test, Benjamini–Hochberg correction across cells, minimum
detectable effect and verdict (``analysis.effects``). Runs of different grids compare on the cells they
share; a cell measured in one run only is reported as such, never dropped. A warning says when the two
runs' hardware, engine version or model differ. One typed record (``Comparison``) is written as JSON and
rendered as Markdown and HTML with a heatmap of B/A (``analysis.compare_pages``).
"""

from __future__ import annotations

import argparse
import math
from collections import Counter
from pathlib import Path
from typing import Literal

import pandas as pd
from pydantic import Field

from analysis.compare_pages import verdict_lines, write_pages
from analysis.effects import CORRECTION, LOCATION, Effect, compare_samples
from analysis.table import CELL, headline_column, load_manifest, records_frame
from benchcore.atomic import write_model
from benchcore.cli import BadInput, run_cli
from benchcore.flags import add_out
from benchcore.schema import StrictModel
from microbench.results.layout import hold_folder

__all__ = [
    "CellEffect",
    "Comparison",
    "align_chunks",
    "compare_frames",
    "compare_runs",
    "grid_problem",
    "main",
    "round_levels",
    "run_warnings",
    "shared_figures",
    "write_comparison",
]


class CellEffect(Effect):
    """One cell's effect (``analysis.effects.Effect``) on the figure compared there."""

    chunk_size: int
    decode_batch_size: int
    new_prefill_tokens: int
    metric: str = Field(description="the per-repetition figure compared (a column of records_frame)")

    @property
    def cell(self) -> tuple[int, int, int]:
        return self.chunk_size, self.decode_batch_size, self.new_prefill_tokens


class Comparison(StrictModel):
    """The comparison of arm B against arm A (every renderer draws this record)."""

    version: Literal[2] = 2  # bump on a breaking change of the record (2: first quartiles, not medians)
    name_a: str
    name_b: str
    run_a: str
    run_b: str
    alpha: float
    tolerance: float = Field(description="a non-significant cell whose CI lies within ±this is decided")
    seed: int
    location: str = LOCATION
    correction: str = CORRECTION
    warnings: list[str] = Field(default_factory=list)
    levels_a: list[float | None] = Field(default_factory=list, description="round_levels of run A")
    levels_b: list[float | None] = Field(default_factory=list, description="round_levels of run B")
    cells: list[CellEffect]

    def counts(self) -> dict[str, int]:
        return dict(Counter(c.verdict for c in self.cells))

    def undecided(self) -> list[CellEffect]:
        return [c for c in self.cells if c.verdict == "undecided"]


def _valid_values(frame: pd.DataFrame, metric: str | None) -> dict[tuple[int, int, int], list[float]]:
    """Per cell, the finite values of the figure over its valid point records (one per repetition)."""
    rows = frame[(frame["source"] == "runs") & frame["valid"]] if len(frame) else frame
    out: dict[tuple[int, int, int], list[float]] = {}
    for key, group in frame.groupby(CELL):
        cell = (int(key[0]), int(key[1]), int(key[2]))
        column = metric or headline_column(cell[1])
        values = rows.loc[rows.index.intersection(group.index), column] if column in rows else []
        out[cell] = [float(v) for v in values if v is not None and math.isfinite(v)]
    return out


def round_levels(frame: pd.DataFrame, metric: str | None = None) -> list[float | None]:
    """Per repetition (a round, in an ablation), the median over cells of each value / its cell's median:
    the machine's level in that round (1.0: typical). A trend across rounds is drift, which alternating
    the arms' order spreads over both arms; None: no valid value in that repetition."""
    rows = frame[(frame["source"] == "runs") & frame["valid"]]
    shares: dict[int, list[float]] = {}
    for key, group in rows.groupby(CELL):
        values = group[metric or headline_column(int(key[1]))]
        median = values.median()
        if not median > 0:
            continue
        for rep, value in zip(group["repetition"], values, strict=True):
            if math.isfinite(value):
                shares.setdefault(int(rep), []).append(value / median)
    last = max(shares, default=-1)
    return [float(pd.Series(shares[r]).median()) if r in shares else None for r in range(last + 1)]


def compare_frames(
    frame_a: pd.DataFrame,
    frame_b: pd.DataFrame,
    *,
    metric: str | None = None,
    alpha: float = 0.05,
    tolerance: float = 0.1,
    seed: int = 0,
) -> list[CellEffect]:
    """Every cell of either run (``records_frame`` output), sorted; the p-values corrected together. A
    cell without a valid value of its figure in one run (not measured there, every repetition invalid, or
    a figure that run's engine kind does not produce) is listed as measured in the other only."""
    if metric is not None and metric not in (both := shared_figures(frame_a, frame_b)):
        raise ValueError(
            f"figure {metric!r} is not in both runs' records; figures both produce: {', '.join(both)}"
        )
    a, b = _valid_values(frame_a, metric), _valid_values(frame_b, metric)
    effects = compare_samples(a, b, alpha=alpha, tolerance=tolerance, seed=seed)
    return [
        CellEffect(
            chunk_size=cell[0],
            decode_batch_size=cell[1],
            new_prefill_tokens=cell[2],
            metric=metric or headline_column(cell[1]),
            **effect.model_dump(),
        )
        for cell, effect in effects.items()
    ]


def shared_figures(frame_a: pd.DataFrame, frame_b: pd.DataFrame) -> list[str]:
    """The per-repetition figures with a valid value in both runs (runs of two engine kinds share only
    some: compare on these)."""

    def produced(frame: pd.DataFrame) -> set[str]:
        rows = frame[(frame["source"] == "runs") & frame["valid"]] if len(frame) else frame
        numeric = rows.select_dtypes("number").drop(columns=[*CELL, "repetition"], errors="ignore")
        return {str(c) for c in numeric.columns if numeric[c].notna().any()}

    return sorted(produced(frame_a) & produced(frame_b))


def run_warnings(run_a: Path, run_b: Path) -> list[str]:
    """What differs between the runs beyond the compared configuration: hardware, engine version, model,
    engine kind (each run's manifest)."""
    ma, mb = load_manifest(run_a), load_manifest(run_b)
    if ma is None or mb is None:
        return [f"{run_a if ma is None else run_b} has no manifest: hardware and versions not checked"]
    pairs = {
        "hardware": (
            ma.hardware.get("gpus") or ma.hardware.get("cpu"),
            mb.hardware.get("gpus") or mb.hardware.get("cpu"),
        ),
        "engine version": (ma.engine_version, mb.engine_version),
        "model": (ma.engine_spec.get("model"), mb.engine_spec.get("model")),
        "engine kind": (ma.engine_spec.get("kind"), mb.engine_spec.get("kind")),
    }
    out = [f"{what} differs: A {va!r}, B {vb!r}" for what, (va, vb) in pairs.items() if va != vb]
    if pairs["engine kind"][0] != pairs["engine kind"][1]:
        out.append(
            "the engine kinds differ: each cell is compared on its headline only where both produce it "
            "(a cell whose figure one kind lacks is listed as measured in the other only)"
        )
    return out


# Grid settings that change what every cell measures: runs that differ in one have no comparable cell.
CELL_MEANING = ("decode_context", "protocol")


def grid_problem(run_a: Path, run_b: Path, cells: list[CellEffect]) -> str | None:
    """Why the two runs cannot be compared at all (their grids share no cell, or differ in a setting
    every cell depends on, ``CELL_MEANING``); None when they can (cells of one run only are listed)."""
    if cells and not any(c.n_a and c.n_b for c in cells):
        cells_of = {
            run: sorted({c.cell for c in cells if (c.n_a if run == "A" else c.n_b)}) for run in ("A", "B")
        }
        return (
            f"{run_a} and {run_b} share no measured cell (chunk, D, P): A has {cells_of['A'] or 'none'}, "
            f"B has {cells_of['B'] or 'none'}; compare runs of one grid"
        )
    ma, mb = load_manifest(run_a), load_manifest(run_b)
    if ma is None or mb is None:
        return None
    for key in CELL_MEANING:
        if ma.sweep.get(key) != mb.sweep.get(key):
            return (
                f"the runs' grids differ in {key} (A {ma.sweep.get(key)!r}, B {mb.sweep.get(key)!r}): every "
                "cell is measured differently, so none compares; rerun one with the other's setting"
            )
    return None


def _grid_warnings(cells: list[CellEffect]) -> list[str]:
    only = Counter(c.verdict for c in cells if c.verdict in ("only in A", "only in B"))
    return [f"{n} cell(s) measured {which} (listed, not compared)" for which, n in sorted(only.items())]


def align_chunks(frame_a: pd.DataFrame, frame_b: pd.DataFrame) -> tuple[pd.DataFrame, list[str]]:
    """When each run holds one chunk size and they differ (a chunk-size A/B), B's cells are matched to
    A's on (D, P) and shown under A's chunk, with a note saying so; otherwise ``frame_b`` as it is."""
    chunks_a, chunks_b = set(frame_a["chunk_size"]), set(frame_b["chunk_size"])
    if len(chunks_a) != 1 or len(chunks_b) != 1 or chunks_a == chunks_b:
        return frame_b, []
    (ca,), (cb,) = chunks_a, chunks_b
    note = f"chunk size differs (A {ca}, B {cb}): cells matched on (D, P), listed under A's chunk {ca}"
    return frame_b.assign(chunk_size=ca), [note]


def compare_runs(
    run_a: Path,
    run_b: Path,
    *,
    names: tuple[str, str] = ("A", "B"),
    metric: str | None = None,
    alpha: float = 0.05,
    tolerance: float = 0.1,
    seed: int = 0,
) -> Comparison:
    """Compare two run folders (``ValueError``/``FileNotFoundError`` naming the folder when one is not a
    run folder with records, or naming the setting when their grids cannot be compared: ``grid_problem``)."""
    frame_a = records_frame(run_a, include_invalid_attempts=False)
    frame_b, notes = align_chunks(frame_a, records_frame(run_b, include_invalid_attempts=False))
    cells = compare_frames(
        frame_a,
        frame_b,
        metric=metric,
        alpha=alpha,
        tolerance=tolerance,
        seed=seed,
    )
    if (problem := grid_problem(run_a, run_b, cells)) is not None:
        raise ValueError(problem)
    return Comparison(
        name_a=names[0],
        name_b=names[1],
        run_a=str(run_a),
        run_b=str(run_b),
        alpha=alpha,
        tolerance=tolerance,
        seed=seed,
        warnings=run_warnings(run_a, run_b) + notes + _grid_warnings(cells),
        levels_a=round_levels(frame_a, metric),
        levels_b=round_levels(frame_b, metric),
        cells=cells,
    )


def write_comparison(comparison: Comparison, out: Path) -> list[Path]:
    """``comparison.json``, ``comparison.md``, ``comparison.html`` and the heatmap into ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    write_model(out / "comparison.json", comparison)
    return [out / "comparison.json", *write_pages(comparison, out)]


def _run(args: argparse.Namespace) -> int:
    try:
        comparison = compare_runs(
            args.run_a,
            args.run_b,
            names=(args.name_a, args.name_b),
            metric=args.metric,
            alpha=args.alpha,
            tolerance=args.tolerance,
            seed=args.seed,
        )
    except (FileNotFoundError, ValueError) as exc:
        raise BadInput(str(exc)) from None
    out = args.out or args.run_b / f"compare-vs-{args.run_a.name}"
    with hold_folder(out):  # one writer; a read-only or busy --out is bad input (exit 2)
        paths = write_comparison(comparison, out)
    print("\n".join(verdict_lines(comparison)))
    print("wrote " + ", ".join(str(p) for p in paths))
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m analysis.compare", description=(__doc__ or "").split("\n\n")[0]
    )
    p.add_argument("run_a", type=Path, help="run folder of arm A (the reference)")
    p.add_argument("run_b", type=Path, help="run folder of arm B")
    p.add_argument("--name-a", default="A")
    p.add_argument("--name-b", default="B")
    p.add_argument("--metric", help="a record figure to compare (default: the cell's headline)")
    p.add_argument("--alpha", type=float, default=0.05, help="false discovery rate across cells (0.05)")
    p.add_argument("--tolerance", type=float, default=0.1, help="±effect ruled out = decided (0.1)")
    p.add_argument("--seed", type=int, default=0, help="seed of the bootstrap")
    add_out(p, "RUN_B/compare-vs-<RUN_A name>")
    args = p.parse_args(argv)
    return run_cli(lambda: _run(args))


if __name__ == "__main__":
    raise SystemExit(main())
