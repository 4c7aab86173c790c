"""The renderers of one ``analysis.compare.Comparison``: console lines, Markdown, HTML and the B/A heatmap.

The heatmap draws B/A per cell (P × D, one panel per chunk; a diverging log scale centred on 1), a cell
whose CI excludes 1 marked with ``*``. The HTML (``templates/comparison.html`` on ``benchcore.pages``)
embeds it; the Markdown links the PNG written beside it.
"""

from __future__ import annotations

import io
import math
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd
import seaborn as sns
from matplotlib.colors import TwoSlopeNorm
from matplotlib.figure import Figure

from benchcore.atomic import atomic_write_bytes
from benchcore.pages import png_data_uri, render_page

if TYPE_CHECKING:
    from analysis.compare import CellEffect, Comparison

__all__ = ["COLUMNS", "diff_heatmap", "levels_line", "markdown", "rows", "verdict_lines", "write_pages"]

COLUMNS = [
    "chunk",
    "D",
    "P",
    "figure",
    "n A/B",
    "Q1 A",
    "Q1 B",
    "B/A",
    "95% CI",
    "p (BH)",
    "MDE",
    "verdict",
]
HEATMAP = "comparison_heatmap.png"


def _num(v: float | None, fmt: str = ".3g") -> str:
    return "–" if v is None else format(v, fmt)


def _mde(mde: float | None, n_a: int, n_b: int) -> str:
    if mde is not None:
        return f"{100 * mde:.0f}%"
    return "∞" if n_a > 1 and n_b > 1 else "–"  # ∞: the rank test cannot reach alpha with so few


def rows(c: Comparison) -> list[list[str]]:
    """The verdict table, one row per cell (strings, as every renderer prints them)."""
    return [
        [
            str(e.chunk_size),
            str(e.decode_batch_size),
            str(e.new_prefill_tokens),
            e.metric,
            f"{e.n_a}/{e.n_b}",
            _num(e.location_a),
            _num(e.location_b),
            _num(e.ratio, ".3f"),
            "–" if e.ci_low is None or e.ci_high is None else f"{e.ci_low:.3f}–{e.ci_high:.3f}",
            _num(e.p_adjusted, ".2g"),
            _mde(e.mde, e.n_a, e.n_b),
            e.verdict,
        ]
        for e in c.cells
    ]


def _summary(c: Comparison) -> str:
    counts = ", ".join(f"{n} {v}" for v, n in sorted(c.counts().items()))
    return f"{c.name_b} against {c.name_a} over {len(c.cells)} cells: {counts}"


def levels_line(c: Comparison) -> str:
    """Each run's level per repetition (round): drift shows as a trend."""

    def fmt(levels: list[float | None]) -> str:
        return " ".join("–" if v is None else f"{v:.3f}" for v in levels) or "–"

    return (
        f"Level per repetition (median over cells of value / cell median; a trend is drift): "
        f"{c.name_a} {fmt(c.levels_a)}; {c.name_b} {fmt(c.levels_b)}"
    )


def verdict_lines(c: Comparison) -> list[str]:
    """What a terminal shows: the warnings, one line per cell, the counts."""
    lines = [f"warning: {w}" for w in c.warnings]
    lines += ["  ".join(r) for r in [COLUMNS, *rows(c)]]
    return [*lines, levels_line(c), _summary(c)]


def _method(c: Comparison) -> str:
    return (
        f"Per cell, B/A is Q1({c.name_b}) / Q1({c.name_a}), the {c.location}s of the valid repetitions of "
        f"each run (lower is better; a busy host only adds time, and the quartile stays on clean "
        f"repetitions longer than the median); 95% CI: seeded percentile bootstrap (seed {c.seed}); p: "
        f"two-sided Mann–Whitney U, corrected by {c.correction} at {c.alpha}; MDE: the change detectable "
        f"at that level with 80% power (∞: too few repetitions for the rank test); a non-significant cell "
        f"whose CI lies within ±{c.tolerance:.0%} is 'no detectable difference', else 'undecided'."
    )


def _label(e: CellEffect) -> str:
    if e.ratio is None:
        return e.verdict.removeprefix("only ") if e.verdict.startswith("only") else ""
    return f"{e.ratio:.2f}" + ("*" if e.ci_excludes_one else "")


def diff_heatmap(c: Comparison) -> Figure:
    """B/A per cell, P (x) × D (y), one panel per chunk; ``*``: the CI excludes 1; blank: not compared."""
    frame = pd.DataFrame(
        [
            {
                "chunk": e.chunk_size,
                "D": e.decode_batch_size,
                "P": e.new_prefill_tokens,
                "ratio": e.ratio if e.ratio is not None else np.nan,
                "label": _label(e),
            }
            for e in c.cells
        ]
    )
    chunks = sorted(frame["chunk"].unique()) if len(frame) else []
    if not chunks or frame["ratio"].isna().all():
        raise ValueError("no cell measured in both runs: nothing to draw")
    ratios = frame["ratio"].to_numpy(dtype=float)
    # a B location ≤ 0 (its delay gone in the noise) has no log: it sets no scale, drawn at its low end
    positive = ratios[ratios > 0]
    spread = float(np.max(np.abs(np.log(positive)))) if positive.size else 0.0
    reach = math.exp(max(spread, 0.05))
    norm = TwoSlopeNorm(vcenter=1.0, vmin=1 / reach, vmax=reach)
    fig = Figure(figsize=(1.0 + 4.6 * len(chunks), 4.2), layout="constrained")
    axes = fig.subplots(1, len(chunks), squeeze=False)[0]
    for i, (ax, chunk) in enumerate(zip(axes, chunks, strict=True)):
        part = frame[frame["chunk"] == chunk]
        grid = part.pivot_table(index="D", columns="P", values="ratio", dropna=False).sort_index(
            ascending=False
        )
        labels = part.pivot(index="D", columns="P", values="label").reindex_like(grid).fillna("")
        sns.heatmap(
            grid, ax=ax, norm=norm, vmin=norm.vmin, vmax=norm.vmax, cmap="RdBu_r", annot=labels.to_numpy(),
            fmt="", annot_kws={"size": 8},
            cbar=i == len(chunks) - 1, cbar_kws={"label": f"{c.name_b}/{c.name_a}"}, linewidths=0.5,
        )  # fmt: skip
        ax.set_title(f"chunk {chunk}")
        ax.set_xlabel("new prefill tokens P")
        ax.set_ylabel("decode batch D" if i == 0 else "")
    fig.suptitle(f"{c.name_b}/{c.name_a} per cell (* the 95% CI excludes 1; blue: B faster)")
    return fig


def markdown(c: Comparison, heatmap: str | None = HEATMAP) -> str:
    lines = [f"# {c.name_b} against {c.name_a}", "", f"- A: `{c.run_a}`", f"- B: `{c.run_b}`"]
    lines += [f"- **warning**: {w}" for w in c.warnings]
    lines += ["", _method(c), "", levels_line(c), "", _summary(c), ""]
    if heatmap:
        lines += [f"![{c.name_b}/{c.name_a} per cell]({heatmap})", ""]
    lines += ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(r) + " |" for r in rows(c)]
    return "\n".join(lines) + "\n"


def _png(fig: Figure) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    return buf.getvalue()


def html(c: Comparison, heatmap_png: bytes | None) -> str:
    return render_page(
        "analysis",
        "comparison.html",
        title=f"{c.name_b} against {c.name_a}",
        banner=None,
        c=c,
        method=_method(c),
        summary=_summary(c),
        levels=levels_line(c),
        columns=COLUMNS,
        rows=rows(c),
        heatmap=png_data_uri(heatmap_png) if heatmap_png else None,
    )


def write_pages(c: Comparison, out: Path) -> list[Path]:
    """``comparison.md``, ``comparison.html`` and the heatmap (when any cell was compared) into ``out``."""
    try:
        png: bytes | None = _png(diff_heatmap(c))
    except ValueError:
        png = None
    paths = [out / "comparison.md", out / "comparison.html"]
    atomic_write_bytes(paths[0], markdown(c, HEATMAP if png else None).encode())
    atomic_write_bytes(paths[1], html(c, png).encode())
    if png:
        atomic_write_bytes(out / HEATMAP, png)
        paths.append(out / HEATMAP)
    return paths
