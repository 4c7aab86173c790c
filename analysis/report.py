"""``python -m analysis.report <run>``: a Markdown and a self-contained HTML report of one run.

Both render one ``SweepReport`` (``analysis.sweep_report``): the run's identity, seed 002's success
criteria (each naming what it judged), the two interference models, the step model's fit, break-even
per link profile, the interference table and the manifest; the figures of ``analysis.plots`` are drawn
from the same analysis. The Markdown links PNG files written next to it; the HTML
(``templates/sweep_report.html`` on the shared layout of ``benchcore.pages``) embeds them, so it is one
file to share. No table is written here: the run's ``interference_table.csv`` is the sweep's.
"""

from __future__ import annotations

import argparse
import io
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from matplotlib.figure import Figure

from analysis import plots
from analysis.breakeven import TransferMode
from analysis.sweep_report import (
    DEFAULT_LINKS,
    DataTable,
    RunAnalysis,
    SweepReport,
    analyse_run,
    sweep_report,
)
from analysis.table import load_raw
from benchcore.atomic import atomic_write_bytes
from benchcore.cli import BadInput, run_cli
from benchcore.flags import add_out
from benchcore.pages import png_data_uri, render_page
from microbench.results.layout import hold_folder
from microbench.results.records import RunRecord

__all__ = [
    "TABLE_FIGURES",
    "ReportPaths",
    "build_report",
    "caption",
    "figures",
    "html",
    "main",
    "markdown",
    "pick_timeline_record",
]


@dataclass(frozen=True)
class ReportPaths:
    markdown: Path
    html: Path
    figures: list[Path]


def pick_timeline_record(records: list[RunRecord], chunk: int = 8192) -> RunRecord | None:
    """A representative valid injection: D nearest 4, the chunk nearest ``chunk``, 2–4 prefill chunks if
    there is such a point (else the most chunks), repetition 0 first."""
    valid = [r for r in records if r.validity.valid and r.config.decode_batch_size > 0]
    if not valid:
        return None

    def score(r: RunRecord) -> tuple[float, float, int, int]:
        n = r.interference.num_chunks_actual or r.interference.num_chunks_expected
        return (
            abs(math.log(r.config.chunk_size / chunk)),
            abs(math.log(r.config.decode_batch_size / 4)),
            0 if 2 <= n <= 4 else (1 if n > 4 else 2) * 100 - n,
            r.config.repetition,
        )

    return min(valid, key=score)


TABLE_FIGURES = (
    ("Interference heatmaps", "penalty_heatmaps"),
    ("Sensitivity to the chunk size", "chunk_sensitivity"),
    ("One injection, stream by stream", "injection_timeline"),
)
_CAPTIONS = {
    "penalty_heatmaps": "Penalty ratio per cell: new prefill tokens P (x) by decode batch D (y), one panel "
    "per chunk size; log colour scale shared by the panels, blank cells have no valid measurement.",
    "chunk_sensitivity": "Against new prefill tokens P, one line per chunk size (log-log): prefill chunks, "
    "bare prefill duration (ms) and total interference (ms).",
    "injection_timeline": "One injection, stream by stream: each decode stream's inter-token gaps (ms, "
    "colour) in ms since the injection's send, the prefill window shaded; below, the engine's steps.",
    "model_comparison": "Predicted against measured total interference (ms, log-log): seed 002's product "
    "model vs the step model.",
    "step_fit": "Step model diagnostics: measured against predicted step time (ms, log-log) and relative "
    "residuals.",
}


def caption(name: str) -> str:
    if name.startswith("offload_region_"):
        return (
            f"Offload region for link profile {name.removeprefix('offload_region_')}: where shipping the "
            "prefill to another worker is cheaper than running it locally."
        )
    return _CAPTIONS.get(name, name.replace("_", " "))


def figures(a: RunAnalysis, report: SweepReport, chunk: int = 8192) -> tuple[dict[str, Figure], list[str]]:
    """The report's figures by name and a note for each figure that could not be drawn. The heatmaps and
    the sensitivity figure draw the report's own table."""
    table = report.table.frame()
    out = {
        "penalty_heatmaps": plots.penalty_heatmaps(table),
        "chunk_sensitivity": plots.chunk_sensitivity(table),
    }
    notes = []
    record = pick_timeline_record(a.records, chunk)
    if record is not None:
        try:
            out["injection_timeline"] = plots.injection_timeline(load_raw(a.run_dir, record), record)
        except (FileNotFoundError, ValueError) as exc:
            notes.append(f"timeline skipped: {exc}")
    if a.step is not None:
        out["model_comparison"] = plots.model_comparison(a.records)
        out["step_fit"] = plots.step_fit_diagnostics(a.step)
    for link in a.links:
        title = f"offload region, link {link.name} ({a.mode})"
        out[f"offload_region_{link.name}"] = plots.offload_region(a.breakeven[link.name], chunk, title=title)
    return out, notes


def _md_table(table: DataTable, floatfmt: str = ".4g") -> str:
    def cell(v: object) -> str:
        if v is None:
            return ""
        if isinstance(v, float):
            return format(v, floatfmt)
        return str(v).replace("|", "\\|")

    lines = ["| " + " | ".join(table.columns) + " |", "|" + "---|" * len(table.columns)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in table.rows]
    return "\n".join(lines)


def _md_figures(names: list[str]) -> list[str]:
    return [f"![{n}](figures/{n}.png)\n\n*{caption(n)}*" for n in names]


def markdown(report: SweepReport, names: Sequence[str], notes: Sequence[str] = ()) -> str:
    """The report as Markdown, figures ``names`` linked from ``figures/``."""
    r, fig = report, list(names)
    out = [f"# Interference report: `{r.run_id}`", ""]
    if r.created_utc:
        out += [f"- created: {r.created_utc}; engine: {r.engine}"]
    out += [
        f"- model: {', '.join(r.llm_models)}; hardware: {', '.join(r.hardware)}; git commit: {r.git_commit}",
        *[f"- note: {n}" for n in r.manifest_notes],
        f"- points: {r.points} ({r.valid_points} valid, {r.invalid_attempts} invalid attempts excluded from "
        f"every statistic); cells: {r.cells}",
        f"- {r.penalty_definition}",
        "",
        "## Success criteria (seed 002)",
        "",
        "| criterion | judged | measured | beside it | threshold | status |",
        "|---|---|---|---|---|---|",
        *(
            f"| {c.criterion} | {c.judged} | {c.measured} | {'; '.join(c.beside) or '–'} | {c.threshold} "
            f"| {c.status} |"
            for c in r.criteria
        ),
    ]
    for heading, name in TABLE_FIGURES:
        if name in fig:
            out += ["", f"## {heading}", "", *_md_figures([name])]
    if r.step_model is not None:
        s = r.step_model
        models = DataTable(
            columns=["model", "formula", "parameters", "r2", "loo_p_median_ape_pct", "n"],
            rows=[[m.name, m.formula, m.parameters, m.r2, m.loo_median_ape_pct, m.n] for m in r.fits],
        )
        out += [
            "", "## Interference models", "", _md_table(models), "",
            f"Step model `α + β_d·D + β_c·c + γ·{s.candidate}` (chosen from the candidates below by "
            f"leave-one-P-out error) on {s.n} rows ({s.data}), R² = {s.r2:.4f}, leave-one-P-out median error "
            f"{s.loo_step_mape:.1f}%:", "", _md_table(s.selection), "", _md_table(s.coefficients), "",
            "Residual diagnostics: " + ", ".join(f"{k} = {v:.3g}" for k, v in s.diagnostics.items()), "",
            "Leave-one-P-out (median absolute % error of the held-out P's interference / step times):", "",
            _md_table(s.loo), "", *_md_figures([n for n in ("model_comparison", "step_fit") if n in fig]),
        ]  # fmt: skip
    if r.break_even is not None:
        b = r.break_even
        kv = f"{b.kv_model}: {b.kv_bytes_per_token} KV bytes per token"
        out += ["", f"## Break-even ({b.mode} transfer, {kv})", ""]
        for v in b.links:
            flag = " **(placeholder link values)**" if v.placeholder else ""
            out.append(
                f"- `{v.name}`{flag} — {v.description}: offload wins in {v.offload_cells} of {v.cells} cells "
                "with D > 0"
            )
        out += ["", *_md_figures([n for n in fig if n.startswith("offload_region_")])]
    out += ["", "## Interference table", "", _md_table(r.table)]
    all_notes = [*r.notes, *notes]
    if all_notes:
        out += ["", "## Notes", "", *(f"- {n}" for n in all_notes)]
    out += ["", "## Manifest", "", "```json", r.manifest_json, "```", ""]
    return "\n".join(out)


def html(report: SweepReport, pngs: dict[str, bytes], notes: Sequence[str] = ()) -> str:
    """The report as one self-contained page, figures embedded."""
    return render_page(
        "analysis",
        "sweep_report.html",
        title=f"Interference report: {report.run_id}",
        banner=[],
        r=report,
        figure={n: {"src": png_data_uri(data), "caption": caption(n)} for n, data in pngs.items()},
        notes=[*report.notes, *notes],
        table_figures=TABLE_FIGURES,
        cells=_cells,
        numeric=_numeric,
    )


def _cells(table: DataTable) -> list[list[str]]:
    return [["" if v is None else format(v, ".4g") if isinstance(v, float) else str(v) for v in row]
            for row in table.rows]  # fmt: skip


def _numeric(table: DataTable) -> list[int]:
    """The columns to align right: every value a number (bools are not)."""

    def number(v: object) -> bool:
        return v is None or (isinstance(v, int | float) and not isinstance(v, bool))

    return [i for i in range(len(table.columns)) if all(number(r[i]) for r in table.rows)]


def _png(fig: Figure) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    return buf.getvalue()


def build_report(
    run_dir: Path,
    out_dir: Path | None = None,
    links: Sequence[str] = DEFAULT_LINKS,
    mode: TransferMode = "layerwise",
    chunk: int = 8192,
) -> ReportPaths:
    """Write ``report.md``, ``report.html``, ``report.json`` and ``figures/*.png`` under ``out_dir``
    (``<run>/report``)."""
    run_dir = Path(run_dir)
    out_dir = Path(out_dir) if out_dir else run_dir / "report"
    analysis = analyse_run(
        run_dir, links, mode
    )  # a folder that is no run is named before anything is written
    report = sweep_report(analysis)
    figs, notes = figures(analysis, report, chunk)
    pngs = {name: _png(fig) for name, fig in figs.items()}
    paths = []
    with hold_folder(out_dir):  # one writer; a read-only or busy --out is bad input (exit 2)
        for name, data in pngs.items():
            path = out_dir / "figures" / f"{name}.png"
            atomic_write_bytes(path, data)
            paths.append(path)
        atomic_write_bytes(out_dir / "report.json", (report.model_dump_json(indent=2) + "\n").encode())
        md_path = out_dir / "report.md"
        atomic_write_bytes(md_path, markdown(report, list(pngs), notes).encode())
        html_path = out_dir / "report.html"
        atomic_write_bytes(html_path, html(report, pngs, notes).encode())
    return ReportPaths(md_path, html_path, paths)


def _run(args: argparse.Namespace) -> int:
    try:
        paths = build_report(args.run, args.out, args.link or DEFAULT_LINKS, args.mode, args.chunk)
    except (ValueError, FileNotFoundError) as exc:
        raise BadInput(str(exc)) from None
    print(
        json.dumps({"markdown": str(paths.markdown), "html": str(paths.html), "figures": len(paths.figures)})
    )
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m analysis.report", description=__doc__.split("\n\n")[0])
    parser.add_argument("run", type=Path, help="a run folder, results/<run-id>")
    add_out(parser, "<run>/report")
    parser.add_argument("--link", nargs="+", help=f"link profile(s) (default {' '.join(DEFAULT_LINKS)})")
    parser.add_argument("--mode", choices=["layerwise", "bulk"], default="layerwise")
    parser.add_argument("--chunk", type=int, default=8192, help="chunk of the offload-region figure")
    args = parser.parse_args(argv)
    return run_cli(lambda: _run(args), lambda: args.out or args.run / "report")


if __name__ == "__main__":
    raise SystemExit(main())
