"""The renderers of one ``CalibrationReport``: console lines, Markdown, HTML, JSON and its figures.

Figures: a QQ plot per metric (the report's 100 quantile pairs against y = x) and a scatter of predicted
against real per request (TTFT, TPOT, E2E; read from the two traces) with y = x. The HTML
(``templates/calibration.html`` on ``benchcore.pages``) embeds them; the Markdown links the PNGs.
"""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import seaborn as sns
from matplotlib.figure import Figure

from analysis.calibrate.metrics import request_metrics, split_requests
from analysis.calibrate.repeat import floor_verdict
from analysis.calibrate.report import CalibrationReport, MetricComparison
from benchcore.atomic import atomic_write_bytes, write_model
from benchcore.pages import png_data_uri, render_page
from microbench.results.trace import read_trace

__all__ = [
    "COLUMNS", "REPEAT_COLUMNS", "lines", "markdown", "qq_figure", "repeat_rows", "rows", "scatter_figure",
    "write_pages",
]  # fmt: skip

COLUMNS = [
    "metric", "N", "MAPE % [95% CI]", "median APE %", "bias %", "r [95% CI]", "p50 err %", "p90 err %",
    "p99 err %", "KS D", "KS p", "rating",
]  # fmt: skip
QQ_PNG, SCATTER_PNG = "calibration_qq.png", "calibration_scatter.png"


def _f(v: float | None, fmt: str = ".1f") -> str:
    return "–" if v is None else format(v, fmt)


def _ci(v: float | None, ci: tuple[float, float] | None, fmt: str) -> str:
    return _f(v, fmt) + ("" if ci is None else f" [{ci[0]:{fmt}}, {ci[1]:{fmt}}]")


def rows(report: CalibrationReport) -> list[list[str]]:
    """The summary table, one row per metric (strings, as every renderer prints them)."""
    out = []
    for m in report.metrics:
        pct = {p.percentile: p.error_pct for p in m.percentiles}
        out.append(
            [
                m.metric.upper(),
                f"{m.n_real}" if m.paired else f"{m.n_real}/{m.n_predicted} gaps",
                _ci(m.mape_pct, m.mape_ci_pct, ".1f"),
                _f(m.median_ape_pct),
                _f(m.bias_pct, "+.1f") + (f" ({m.bias_direction})" if m.bias_direction else ""),
                _ci(m.pearson_r, m.pearson_r_ci, ".3f"),
                _f(pct.get(50.0), "+.1f"),
                _f(pct.get(90.0), "+.1f"),
                _f(pct.get(99.0), "+.1f"),
                f"{m.ks_d:.3f}",
                f"{m.ks_p:.3g}" + (" (differ)" if m.ks_rejects_same else ""),
                m.rating or "–",
            ]
        )
    return out


def _counts(report: CalibrationReport) -> str:
    return (
        f"{report.n_compared} of {report.n_requests} requests compared ({report.warmup_excluded} warm-up, "
        f"{report.failed_excluded} failed in the real run, {report.not_predicted} not predicted: excluded); "
        f"trace {report.duration_s:.1f} s; bootstrap {report.bootstrap['resamples']} resamples, "
        f"seed {report.bootstrap['seed']}"
    )


STEP_COLUMNS = [
    "", "steps", "prompt tokens", "decode tokens", "mixed share", "median tokens/step",
    "median prefill step ms", "median decode step ms",
]  # fmt: skip


def step_rows(report: CalibrationReport) -> list[list[str]]:
    """The step-composition table (real, predicted), or none without an engine log."""
    if report.steps is None:
        return []
    return [
        [name, str(s.steps), str(s.prefill_tokens), str(s.decode_tokens), f"{s.mixed_share:.2f}",
         f"{s.median_tokens:g}", _f(s.median_prefill_step_ms, ".1f"), _f(s.median_decode_step_ms, ".2f")]
        for name, s in (("real", report.steps.real), ("predicted", report.steps.predicted))
    ]  # fmt: skip


SHAPE_COLUMNS = [
    "kind", "band", "real steps", "real median ms", "real median decodes", "predicted steps",
    "predicted median ms", "predicted median decodes",
]  # fmt: skip
SHAPE_NOTE = (
    "Timed steps by shape: decode-only ones by their batch, prefill-carrying ones by their prompt tokens "
    "(decodes: the requests decoding in the step). Where a band's medians part, the step model misprices "
    "that shape, or the engine ran it slower than in the sweep; where they agree and the requests' errors "
    "remain, the schedule differs."
)


def shape_rows(report: CalibrationReport) -> list[list[str]]:
    """The step-time-by-shape table's rows (none without an engine log)."""
    return [
        [b.kind, b.band, str(b.real_steps), _f(b.real_median_ms, ".1f"), _f(b.real_median_decodes, "g"),
         str(b.predicted_steps), _f(b.predicted_median_ms, ".1f"), _f(b.predicted_median_decodes, "g")]
        for b in (report.steps.bands if report.steps is not None else [])
    ]  # fmt: skip


SPEED_COLUMNS = ["window start s", "steps", "median ms", "logged / priced"]


def speed_note(report: CalibrationReport) -> str:
    """The engine's speed against the fit in one sentence (empty: not priced)."""
    sp = report.speed
    if sp is None:
        return ""
    spread = sp.spread
    within = (
        f"; its most common one (D = {sp.batch}, priced {sp.batch_price_ms:.2f} ms) per {sp.window_s:.0f} s "
        f"window {spread[0]:.2f}–{spread[1]:.2f} ({len(sp.windows)} windows)"
        if spread is not None
        else ""
    )
    return (
        f"The engine's decode-only steps over the fit's price of their shape: median {sp.median_ratio:.2f} "
        f"of {sp.steps} steps{within}. 1 is the fit's speed. One shape's windows that part are the engine "
        "(or the box under it) changing speed within the trace, which no fitted model predicts."
    )


def speed_rows(report: CalibrationReport) -> list[list[str]]:
    """The per-window speed table's rows (none where nothing was priced)."""
    windows = report.speed.windows if report.speed is not None else []
    return [[f"{w.start_s:g}", str(w.steps), f"{w.median_ms:.2f}", f"{w.median_ratio:.2f}"] for w in windows]


BAND_COLUMNS = ["prompt tokens", "requests", "TTFT median err %", "TPOT median err %", "E2E median err %"]
BAND_NOTE = (
    "The compared requests in four bands of equal count by prompt length: an error that moves with the "
    "prompt is a cost per context token the step model lacks or misprices."
)


def band_rows(report: CalibrationReport) -> list[list[str]]:
    """The by-prompt-length table's rows (none where the report has no bands)."""
    return [
        [f"{b.prompt_tokens[0]}–{b.prompt_tokens[1]}", str(b.n)]
        + [f"{b.median_error_pct[m]:+.1f}" for m in ("ttft", "tpot", "e2e")]
        for b in report.by_prompt
    ]


REPEAT_COLUMNS = [
    "metric", "N", "predicted median APE %", "repeat median APE %", "predicted / repeat", "predicted MAPE %",
    "repeat MAPE % [95% CI]", "repeat bias %", "repeat r",
]  # fmt: skip


def repeat_note(report: CalibrationReport) -> str:
    """What the repeat is, in one paragraph (empty: no repeat)."""
    rp = report.repeat
    if rp is None:
        return ""
    return (
        f"The engine run again on the same schedule (`{rp.repeat}`: same requests, lengths and send times, "
        f"new cold prompts), against the real run, on the {rp.n_compared} compared requests it completed "
        f"({rp.not_in_repeat} it did not: left out here). The repeat's error is what the box and engine "
        "change from one run to the next: a prediction, one fixed sequence, cannot be expected to come "
        "closer to a real run than that. Predicted / repeat ≤ 1: the prediction is within that floor."
    )


def repeat_rows(report: CalibrationReport) -> list[list[str]]:
    """The repeatability table's rows (none without a repeat)."""
    return [
        [r.metric.upper(), str(r.n), f"{r.model_median_ape_pct:.1f}", f"{r.repeat_median_ape_pct:.1f}",
         _f(r.ratio, ".2f"), f"{r.model_mape_pct:.1f}", _ci(r.repeat_mape_pct, r.repeat_mape_ci_pct, ".1f"),
         f"{r.repeat_bias_pct:+.1f}", _f(r.repeat_pearson_r, ".3f")]
        for r in (report.repeat.rows if report.repeat is not None else [])
    ]  # fmt: skip


def _steps_note(report: CalibrationReport) -> str:
    st = report.steps
    return "" if st is None else (
        f"Tokens per step, real against predicted: KS D {st.tokens_ks_d:.3f}, p {st.tokens_ks_p:.3g} "
        f"(engine log {st.engine_log})."
    )  # fmt: skip


def lines(report: CalibrationReport) -> list[str]:
    """What the console prints."""
    out = [_counts(report)]
    for m, row in zip(report.metrics, rows(report), strict=True):
        out.append(f"{row[0]:5s} MAPE {row[2]} %, r {row[5]}, KS D {row[9]} p {row[10]}, {m.rating or ''}")
    for row in step_rows(report):
        out.append(
            f"steps {row[0]:9s}: "
            + ", ".join(f"{c} {v}" for c, v in zip(STEP_COLUMNS[1:], row[1:], strict=True))
        )
    if note := speed_note(report):
        out.append(note)
    for r in report.repeat.rows if report.repeat is not None else []:
        out.append(
            f"{r.metric.upper():5s} median APE: predicted {r.model_median_ape_pct:.1f} %, the engine's "
            f"repeat {r.repeat_median_ape_pct:.1f} % ({floor_verdict(r)})"
        )
    return out + [f"warning: {w}" for w in report.warnings]


def _setup(report: CalibrationReport) -> tuple[list[str], list[str]]:
    sim = report.prediction.get("sim")
    if not isinstance(sim, dict):
        return [], []
    return list(sim.get("matched", [])), list(sim.get("defaulted", []))


def markdown(report: CalibrationReport, figures: bool = True) -> str:
    """The report as Markdown (links the PNGs written beside it)."""
    md = [
        "# Calibration: predicted against real",
        "",
        f"- real: `{report.real}`",
        f"- predicted: `{report.predicted}`",
        f"- {_counts(report)}",
    ]
    md += [f"- **warning**: {w}" for w in report.warnings]
    md += ["", "| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    md += ["| " + " | ".join(r) + " |" for r in rows(report)]
    md += [
        "",
        "Errors are (predicted − real) / real; bias > 0 over-predicts. Rating: seed 003's table "
        "(the worse of the MAPE's and r's bands). ITL compares distributions only (gaps are not paired).",
    ]
    if report.steps is not None:
        md += [
            "",
            "## Step composition",
            "",
            "| " + " | ".join(STEP_COLUMNS) + " |",
            "|" + "---|" * len(STEP_COLUMNS),
        ]
        md += ["| " + " | ".join(r) + " |" for r in step_rows(report)] + ["", _steps_note(report)]
    if shape := shape_rows(report):
        md += ["", "## Step time by shape", "", "| " + " | ".join(SHAPE_COLUMNS) + " |"]
        md += (
            ["|" + "---|" * len(SHAPE_COLUMNS)]
            + ["| " + " | ".join(r) + " |" for r in shape]
            + ["", SHAPE_NOTE]
        )
    if note := speed_note(report):
        md += ["", "## Engine speed against the fit", "", note]
        if table := speed_rows(report):
            md += ["", "| " + " | ".join(SPEED_COLUMNS) + " |", "|" + "---|" * len(SPEED_COLUMNS)]
            md += ["| " + " | ".join(r) + " |" for r in table]
    if table := repeat_rows(report):
        md += ["", "## Repeatability: the engine against itself", "", repeat_note(report), ""]
        md += ["| " + " | ".join(REPEAT_COLUMNS) + " |", "|" + "---|" * len(REPEAT_COLUMNS)]
        md += ["| " + " | ".join(r) + " |" for r in table]
    if report.by_prompt:
        md += ["", "## Error by prompt length", "", "| " + " | ".join(BAND_COLUMNS) + " |"]
        md += ["|" + "---|" * len(BAND_COLUMNS)] + ["| " + " | ".join(r) + " |" for r in band_rows(report)]
        md += ["", BAND_NOTE]
    matched, defaulted = _setup(report)
    if matched or defaulted:
        md += ["", "## Simulator settings", ""] + [f"- matched: {m}" for m in matched]
        md += [f"- defaulted: {d}" for d in defaulted]
    md += ["", "## Known limitations", ""] + [f"- {k}" for k in report.known_limitations]
    if figures:
        md += ["", f"![QQ]({QQ_PNG})", "", f"![scatter]({SCATTER_PNG})"]
    return "\n".join(md) + "\n"


def qq_figure(metrics: list[MetricComparison]) -> Figure:
    """One QQ panel per metric: predicted quantile against real quantile at 100 levels, with y = x."""
    fig = Figure(figsize=(3.6 * max(len(metrics), 1), 3.6), layout="constrained")
    for ax, m in zip(fig.subplots(1, max(len(metrics), 1), squeeze=False)[0], metrics, strict=False):
        q = np.array(m.qq)
        sns.scatterplot(x=q[:, 1], y=q[:, 2], ax=ax, s=14)
        lo, hi = float(q[:, 1:].min()), float(q[:, 1:].max())
        ax.plot([lo, hi], [lo, hi], color="grey", lw=1, ls="--")
        ax.set(title=f"{m.metric.upper()} QQ", xlabel="real quantile (ms)", ylabel="predicted quantile (ms)")
    return fig


def scatter_figure(real_dir: str | Path, predicted_dir: str | Path) -> Figure:
    """Predicted against real per request (TTFT, TPOT, E2E) of the compared requests, with y = x."""
    _, real = read_trace(real_dir)
    _, pred = read_trace(predicted_dir)
    ids = split_requests(real, pred).compared
    rm, pm = request_metrics(real).loc[ids], request_metrics(pred).loc[ids]
    fig = Figure(figsize=(10.8, 3.6), layout="constrained")
    for ax, name in zip(fig.subplots(1, 3), ("ttft", "tpot", "e2e"), strict=True):
        x, y = rm[f"{name}_ms"].to_numpy(), pm[f"{name}_ms"].to_numpy()
        ok = np.isfinite(x) & np.isfinite(y)
        sns.scatterplot(x=x[ok], y=y[ok], ax=ax, s=10, alpha=0.6)
        if ok.any():
            lo, hi = float(min(x[ok].min(), y[ok].min())), float(max(x[ok].max(), y[ok].max()))
            ax.plot([lo, hi], [lo, hi], color="grey", lw=1, ls="--")
        ax.set(title=f"{name.upper()} per request", xlabel="real (ms)", ylabel="predicted (ms)")
    return fig


def _png(fig: Figure) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    return buf.getvalue()


def write_pages(report: CalibrationReport, out_dir: Path) -> list[Path]:
    """``calibration.json``, ``calibration.md``, ``calibration.html`` and the two PNGs into ``out_dir``."""
    qq = _png(qq_figure(report.metrics))
    scatter = _png(scatter_figure(report.real, report.predicted))
    atomic_write_bytes(out_dir / QQ_PNG, qq)
    atomic_write_bytes(out_dir / SCATTER_PNG, scatter)
    write_model(out_dir / "calibration.json", report)
    atomic_write_bytes(out_dir / "calibration.md", markdown(report).encode())
    matched, defaulted = _setup(report)
    html = render_page(
        "analysis.calibrate",
        "calibration.html",
        title="Calibration: predicted against real",
        banner=None,
        r=report,
        counts=_counts(report),
        columns=COLUMNS,
        rows=rows(report),
        step_columns=STEP_COLUMNS,
        step_rows=step_rows(report),
        steps_note=_steps_note(report),
        shape_columns=SHAPE_COLUMNS,
        shape_rows=shape_rows(report),
        shape_note=SHAPE_NOTE,
        speed_note=speed_note(report),
        speed_columns=SPEED_COLUMNS,
        speed_rows=speed_rows(report),
        band_columns=BAND_COLUMNS,
        band_rows=band_rows(report),
        band_note=BAND_NOTE,
        repeat_columns=REPEAT_COLUMNS,
        repeat_rows=repeat_rows(report),
        repeat_note=repeat_note(report),
        matched=matched,
        defaulted=defaulted,
        qq=png_data_uri(qq),
        scatter=png_data_uri(scatter),
    )
    atomic_write_bytes(out_dir / "calibration.html", html.encode())
    return [
        out_dir / n for n in ("calibration.json", "calibration.md", "calibration.html", QQ_PNG, SCATTER_PNG)
    ]
