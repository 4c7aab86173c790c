"""``python -m analysis.report <run>``: a Markdown and a self-contained HTML report of one run.

The report holds the run's manifest, seed 002's success criteria with pass/fail, the interference table,
the two interference models (coefficients with CIs, R², leave-one-P-out error, residual diagnostics),
break-even and offload regions for a few link profiles, and the figures of ``analysis.plots``. The
Markdown links PNG files written next to it; the HTML embeds them as base64, so it is one file to share.
"""

from __future__ import annotations

import argparse
import base64
import html
import io
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
from matplotlib.figure import Figure

from analysis import plots
from analysis.breakeven import TransferMode, breakeven_table, load_link, run_model_kv
from analysis.criteria import success_criteria
from analysis.table import interference_table, load_manifest, load_raw, load_records
from benchcore.cli import BadInput, run_cli
from benchcore.flags import add_out
from microbench.results.records import RunRecord

__all__ = ["DEFAULT_LINKS", "ReportPaths", "build_report", "main", "pick_timeline_record"]

DEFAULT_LINKS = ("seed-layerwise-50ms", "roce-4x200g", "measured-local")


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


def _md_table(frame: pd.DataFrame, floatfmt: str = ".4g") -> str:
    def cell(v: Any) -> str:
        if isinstance(v, float):
            return "" if math.isnan(v) else format(v, floatfmt)
        return str(v).replace("|", "\\|")

    lines = ["| " + " | ".join(map(str, frame.columns)) + " |", "|" + "---|" * len(frame.columns)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in frame.itertuples(index=False)]
    return "\n".join(lines)


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
    """Write ``report.md``, ``report.html`` and ``figures/*.png`` under ``out_dir`` (``<run>/report``)."""
    run_dir = Path(run_dir)
    out_dir = Path(out_dir) if out_dir else run_dir / "report"
    (out_dir / "figures").mkdir(parents=True, exist_ok=True)
    records = load_records(run_dir)
    manifest = load_manifest(run_dir)
    table = interference_table(run_dir)
    table.to_csv(out_dir / "interference_table.csv", index=False, float_format="%.6g")
    sections: list[tuple[str, str]] = []  # (kind, payload): "md" text, or "fig" name
    figures: dict[str, Figure] = {}
    notes: list[str] = []

    comparison = loo = step = None
    try:
        from analysis.models import compare_models, fit_step_model, leave_one_p_out

        step = fit_step_model(records)
        loo = leave_one_p_out(records)
        comparison = compare_models(records, loo)
    except ValueError as exc:
        notes.append(f"model fits skipped: {exc}")

    run_id = manifest.run_id if manifest else run_dir.name
    n_valid = sum(r.validity.valid for r in records)
    head = [f"# Interference report: `{run_id}`", ""]
    if manifest:
        head += [
            f"- created: {manifest.created_utc}; "
            f"engine: {manifest.engine_version or manifest.engine_spec.get('kind')}",
            f"- model: {', '.join(sorted({r.config.model for r in records}))}; hardware: "
            f"{', '.join(sorted({r.config.gpu for r in records}))}; git commit: {manifest.git_commit}",
            *[f"- note: {n}" for n in manifest.notes],
        ]
    head += [
        f"- points: {len(records)} ({n_valid} valid, {int(table['invalid'].sum())} invalid attempts excluded "
        f"from every statistic); cells: {len(table)}",
        "- penalty_ratio = (baseline TPOT + penalty) / baseline TPOT, where the penalty per prefill step is "
        "the aggregate decode delay (Σ over streams of the extra gap time in the window) / (D × chunks); "
        "medians over valid repetitions. Seed 002's window-median version is penalty_ratio_p50.",
    ]
    sections.append(("md", "\n".join(head)))
    sections.append(
        ("md", "## Success criteria (seed 002)\n\n" + _md_table(success_criteria(table, comparison)))
    )

    sections.append(("md", "## Interference heatmaps"))
    figures["penalty_heatmaps"] = plots.penalty_heatmaps(table)
    sections.append(("fig", "penalty_heatmaps"))
    figures["chunk_sensitivity"] = plots.chunk_sensitivity(table)
    sections += [("md", "## Sensitivity to the chunk size"), ("fig", "chunk_sensitivity")]
    record = pick_timeline_record(records, chunk)
    if record is not None:
        try:
            figures["injection_timeline"] = plots.injection_timeline(load_raw(run_dir, record), record)
            sections += [("md", "## One injection, stream by stream"), ("fig", "injection_timeline")]
        except (FileNotFoundError, ValueError) as exc:
            notes.append(f"timeline skipped: {exc}")

    if comparison is not None and step is not None and loo is not None:
        fit_md = [
            "## Interference models",
            "",
            _md_table(comparison),
            "",
            f"Step model `α + β_d·D + β_c·c + γ·{step.model}` (chosen from the candidates below by "
            f"leave-one-P-out error) on {step.n} rows ({step.data}), R² = {step.r2:.4f}, leave-one-P-out "
            f"median error {step.loo_step_mape:.1f}%:",
            "",
            _md_table(step.selection),
            "",
            _md_table(step.coefficients()),
            "",
            "Residual diagnostics: " + ", ".join(f"{k} = {v:.3g}" for k, v in step.diagnostics.items()),
            "",
            "Leave-one-P-out (median absolute % error of the held-out P's interference / step times):",
            "",
            _md_table(loo),
        ]
        sections.append(("md", "\n".join(fit_md)))
        figures["model_comparison"] = plots.model_comparison(records)
        figures["step_fit"] = plots.step_fit_diagnostics(step)
        sections += [("fig", "model_comparison"), ("fig", "step_fit")]

    try:
        kv = run_model_kv(run_dir)
        be_md = [
            f"## Break-even ({mode} transfer, {kv.name}: {kv.kv_bytes_per_token} KV bytes per token)",
            "",
        ]
        for name in links:
            link = load_link(name)
            cells = breakeven_table(table, kv, link, mode)
            known = cells.dropna(subset=["interference_ms"])
            wins = known[known["decode_batch_size"] > 0]["offload_wins"]
            flag = " **(placeholder link values)**" if link.placeholder else ""
            be_md.append(
                f"- `{link.name}`{flag} — {link.describe()}: offload wins in {int(wins.sum())} of "
                f"{len(wins)} cells with D > 0"
            )
            key = f"offload_region_{link.name}"
            figures[key] = plots.offload_region(
                cells, chunk, title=f"offload region, link {link.name} ({mode})"
            )
        sections.append(("md", "\n".join(be_md)))
        sections += [("fig", f"offload_region_{name}") for name in links]
    except ValueError as exc:
        notes.append(f"break-even skipped: {exc}")

    sections.append(("md", "## Interference table\n\n" + _md_table(table)))
    if notes:
        sections.append(("md", "## Notes\n\n" + "\n".join(f"- {n}" for n in notes)))
    manifest_json = manifest.model_dump_json(indent=2) if manifest else "{}"
    sections.append(("md", "## Manifest\n\n```json\n" + manifest_json + "\n```"))

    pngs = {name: _png(fig) for name, fig in figures.items()}
    paths = []
    for name, data in pngs.items():
        path = out_dir / "figures" / f"{name}.png"
        path.write_bytes(data)
        paths.append(path)
    md = "\n\n".join(text if kind == "md" else f"![{text}](figures/{text}.png)" for kind, text in sections)
    md_path = out_dir / "report.md"
    md_path.write_text(md + "\n")
    html_path = out_dir / "report.html"
    html_path.write_text(_html(run_id, sections, pngs))
    return ReportPaths(md_path, html_path, paths)


def _html(title: str, sections: list[tuple[str, str]], pngs: dict[str, bytes]) -> str:
    """A self-contained page: Markdown sections rendered minimally, figures embedded as base64 PNG."""
    body = []
    for kind, text in sections:
        if kind == "fig":
            data = base64.b64encode(pngs[text]).decode()
            caption = html.escape(_caption(text))
            body.append(
                f'<figure><img alt="{caption}" src="data:image/png;base64,{data}">'
                f"<figcaption>{caption}</figcaption></figure>"
            )
            continue
        body.append(_md_to_html(text))
    style = (
        "body{font-family:system-ui,sans-serif;max-width:1200px;margin:2em auto;padding:0 1em}"
        "table{border-collapse:collapse;font-size:12px;margin:1em 0}"
        "td,th{border:1px solid #ccc;padding:2px 6px}"
        "img{max-width:100%}pre{background:#f6f6f6;padding:1em;overflow:auto;font-size:12px}"
        ".scroll{overflow-x:auto;max-width:100%}figcaption{color:#444;font-size:90%}"
        "td:last-child{font-weight:bold}"
    )
    return (
        f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
        f"<style>{style}</style></head><body>\n" + "\n".join(body) + "\n</body></html>\n"
    )


_CAPTIONS = {
    "penalty_heatmaps": "Penalty ratio per cell: new prefill tokens P (x) by decode batch D (y), one panel "
    "per chunk size; log colour scale shared by the panels, blank cells have no valid measurement.",
    "chunk_sensitivity": "Against new prefill tokens P, one line per chunk size (log-log): prefill chunks, "
    "bare prefill duration (ms) and total interference (ms).",
    "injection_timeline": "One injection, stream by stream: each decode stream's inter-token gaps (ms, "
    "colour) in ms since the injection's send, the prefill window shaded; below, the engine's steps.",
    "model_comparison": "Predicted against measured total interference (ms, log-log): constant-penalty model "
    "vs step model.",
    "step_fit": "Step model diagnostics: measured against predicted step time (ms, log-log) and relative "
    "residuals.",
}


def _caption(name: str) -> str:
    if name.startswith("offload_region_"):
        return (
            f"Offload region for link profile {name.removeprefix('offload_region_')}: where shipping the "
            "prefill to another worker is cheaper than running it locally."
        )
    return _CAPTIONS.get(name, name.replace("_", " "))


def _md_to_html(text: str) -> str:
    """Just enough Markdown for this report: headings, bullets, pipe tables, fenced code, paragraphs."""
    out: list[str] = []
    lines = text.split("\n")
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("```"):
            end = lines.index("```", i + 1) if "```" in lines[i + 1 :] else len(lines)
            out.append("<pre>" + html.escape("\n".join(lines[i + 1 : end])) + "</pre>")
            i = end + 1
            continue
        if line.startswith("#"):
            level = len(line) - len(line.lstrip("#"))
            out.append(f"<h{level}>{_inline(line[level:].strip())}</h{level}>")
        elif line.startswith("|"):
            rows = []
            while i < len(lines) and lines[i].startswith("|"):
                rows.append([c.strip().replace("\\|", "|") for c in lines[i].strip("|").split(" | ")])
                i += 1
            header, rest = rows[0], rows[2:]
            out.append(
                "<div class='scroll'><table><tr>"
                + "".join(f"<th>{_inline(c)}</th>" for c in header) + "</tr>"
                + "".join("<tr>" + "".join(f"<td>{_inline(c)}</td>" for c in r) + "</tr>" for r in rest)
                + "</table></div>"
            )  # fmt: skip
            continue
        elif line.startswith("- "):
            items = []
            while i < len(lines) and lines[i].startswith("- "):
                items.append(f"<li>{_inline(lines[i][2:])}</li>")
                i += 1
            out.append("<ul>" + "".join(items) + "</ul>")
            continue
        elif line.strip():
            out.append(f"<p>{_inline(line)}</p>")
        i += 1
    return "\n".join(out)


def _inline(text: str) -> str:
    escaped = html.escape(text)
    parts = escaped.split("`")
    escaped = "".join(f"<code>{p}</code>" if k % 2 else p for k, p in enumerate(parts))
    parts = escaped.split("**")
    escaped = "".join(f"<b>{p}</b>" if k % 2 else p for k, p in enumerate(parts))
    return escaped


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
