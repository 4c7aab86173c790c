"""Figures of a run (seaborn/matplotlib). Every function returns a ``matplotlib.figure.Figure``.

* ``penalty_heatmaps``: seed 002's heatmap, P × D coloured by ``penalty_ratio``, one panel per chunk.
* ``chunk_sensitivity``: chunks, prefill duration and interference against P, one line per chunk size.
* ``offload_region``: interference / transfer cost over (D, P) for one chunk, with the decision.
* ``injection_timeline``: one injection; every decode stream's gaps around the prefill window.
* ``step_fit_diagnostics`` and ``model_comparison``: the step model's fit and the two models' predictions.

Figures are built with the object API (no global pyplot state), so they work headless and in notebooks.
"""

from __future__ import annotations

import itertools
import math

import matplotlib as mpl
import numpy as np
import pandas as pd
import seaborn as sns
from matplotlib.colors import LogNorm, TwoSlopeNorm
from matplotlib.figure import Figure

from microbench.results.records import RunRecord

__all__ = [
    "chunk_sensitivity",
    "injection_timeline",
    "model_comparison",
    "offload_region",
    "penalty_heatmaps",
    "step_fit_diagnostics",
]


def _nearest(values: list[int], target: int) -> int:
    return min(values, key=lambda v: (abs(math.log(v / target)), v))


def penalty_heatmaps(
    table: pd.DataFrame, value: str = "penalty_ratio", chunks: list[int] | None = None
) -> Figure:
    """P (x) × D (y) heatmaps of ``value`` (an ``interference_table`` column), one panel per chunk.

    The colour scale is logarithmic and shared by the panels; cells without a valid measurement are blank.
    """
    data = table[table["decode_batch_size"] > 0].dropna(subset=[value])
    if data.empty:
        raise ValueError(f"no cell with D > 0 and a {value} to draw")
    chunks = chunks or sorted(int(c) for c in data["chunk_size"].unique())
    vmin, vmax = float(data[value].min()), float(data[value].max())
    norm = LogNorm(vmin=max(vmin, 1e-3), vmax=max(vmax, vmin * 1.01)) if vmin > 0 else None
    fig = Figure(figsize=(1.0 + 4.6 * len(chunks), 4.2), layout="constrained")
    axes = fig.subplots(1, len(chunks), squeeze=False)[0]
    for i, (ax, chunk) in enumerate(zip(axes, chunks, strict=True)):
        grid = data[data["chunk_size"] == chunk].pivot_table(
            index="decode_batch_size", columns="new_prefill_tokens", values=value
        )
        sns.heatmap(
            grid.sort_index(ascending=False), ax=ax, norm=norm, cmap="rocket_r", annot=True, fmt=".3g",
            annot_kws={"size": 8}, cbar=i == len(chunks) - 1, cbar_kws={"label": value}, linewidths=0.5,
        )  # fmt: skip
        ax.set_title(f"chunk {chunk}")
        ax.set_xlabel("new prefill tokens P")
        ax.set_ylabel("decode batch D" if i == 0 else "")
    fig.suptitle(f"{value} (median over valid repetitions)")
    return fig


def chunk_sensitivity(table: pd.DataFrame, decode_batch: int | None = None) -> Figure:
    """How the chunk size trades off (seed 002 §4): chunks, bare prefill time and total interference at
    one D against P, one line per chunk (log–log)."""
    ds = sorted(int(d) for d in table["decode_batch_size"].unique() if d > 0)
    if not ds:
        raise ValueError("no cell with D > 0")
    d = decode_batch if decode_batch is not None else _nearest(ds, 4)
    bare_d = int(table["decode_batch_size"].min())
    fig = Figure(figsize=(13, 4), layout="constrained")
    axes = fig.subplots(1, 3)
    palette = sns.color_palette("viridis", n_colors=table["chunk_size"].nunique())
    panels = [
        (table[table["decode_batch_size"] == d], "num_chunks", f"prefill chunks (D={d})"),
        (
            table[table["decode_batch_size"] == bare_d],
            "prefill_duration_ms",
            f"prefill duration ms (D={bare_d})",
        ),
        (
            table[table["decode_batch_size"] == d],
            "aggregate_decode_delay_ms",
            f"total interference ms (D={d})",
        ),
    ]
    for ax, (data, col, label) in zip(axes, panels, strict=True):
        data = data.dropna(subset=[col])
        sns.lineplot(
            data=data, x="new_prefill_tokens", y=col, hue="chunk_size", palette=palette, marker="o", ax=ax
        )
        ax.set_xscale("log", base=2)
        ax.set_yscale("linear" if col == "num_chunks" else "log")
        ax.set_xlabel("new prefill tokens P")
        ax.set_ylabel(label)
        ax.grid(True, which="major", alpha=0.3)
        if ax.get_legend() is not None:
            ax.get_legend().set_title("chunk")
    fig.suptitle("sensitivity to the chunk size (max-num-batched-tokens)")
    return fig


def offload_region(cells: pd.DataFrame, chunk: int = 8192, title: str = "") -> Figure:
    """The "offload wins" region over (D, P) for the chunk nearest ``chunk``: colour is
    interference / transfer (log, white at break-even), each cell labelled with the decision.

    ``cells`` has ``chunk_size, decode_batch_size, new_prefill_tokens, interference_ms, transfer_ms`` (a
    policy table or ``breakeven_table``'s output)."""
    used = _nearest(sorted(int(c) for c in cells["chunk_size"].unique()), chunk)
    data = cells[(cells["chunk_size"] == used) & (cells["decode_batch_size"] > 0)].copy()
    data["ratio"] = data["interference_ms"] / data["transfer_ms"]
    grid = data.pivot_table(index="decode_batch_size", columns="new_prefill_tokens", values="ratio")
    grid = grid.sort_index(ascending=False)
    logs = np.log10(grid.clip(lower=1e-6))
    bound = float(np.nanmax(np.abs(logs.to_numpy()))) if logs.notna().any().any() else 1.0
    bound = max(bound, 0.5)
    labels = grid.map(
        lambda r: (
            ""
            if pd.isna(r)
            else ("offload" if r > 1 else "local") + (f"\n×{r:.3g}" if r < 100 else f"\n×{r:,.0f}")
        )
    )
    fig = Figure(figsize=(1.5 + 1.2 * grid.shape[1], 1.2 + 0.6 * grid.shape[0]), layout="constrained")
    ax = fig.subplots()
    sns.heatmap(
        logs, ax=ax, cmap="RdBu_r", norm=TwoSlopeNorm(vcenter=0.0, vmin=-bound, vmax=bound), annot=labels,
        fmt="", annot_kws={"size": 7}, linewidths=0.5, cbar_kws={"label": "log10(interference / transfer)"},
    )  # fmt: skip
    ax.set_xlabel("new prefill tokens P")
    ax.set_ylabel("decode batch D")
    ax.set_title(title or f"offload wins where interference > transfer (chunk {used})")
    return fig


def injection_timeline(raw: pd.DataFrame, record: RunRecord, before_ms: float | None = None) -> Figure:
    """One injection: each decode stream's gaps (segments between its tokens, coloured by length) around
    the shaded prefill window, and below, the engine steps of the window from the step log.

    ``raw`` is ``analysis.table.load_raw``'s output (``t_ms`` relative to the injection's send)."""
    window = (record.t_first_token_ns - record.t_inject_ns) / 1e6
    margin = before_ms if before_ms is not None else max(0.25 * window, 10.0)
    decode = raw[raw["role"] == "decode"]
    lo, hi = -margin, window + margin
    if not decode.empty:  # no empty margins beyond the stamps
        lo, hi = max(lo, float(decode["t_ms"].min())), min(hi, float(decode["t_ms"].max()))
        lo, hi = min(lo, -0.02 * window), max(hi, 1.02 * window)
    streams = sorted(int(s) for s in decode["stream"].unique())
    # steps end to end need every duration: the first one may have none (SGLang: start not logged)
    steps = [s for s in record.interference.engine_steps_log if s.elapsed_ms is not None]
    fig = Figure(
        figsize=(11, 1.8 + 0.32 * max(len(streams), 1) + (1.3 if steps else 0)), layout="constrained"
    )
    rows = [max(len(streams), 1) * 0.32 + 0.8, 1.3] if steps else [1]
    axes = fig.subplots(len(rows), 1, sharex=True, height_ratios=rows, squeeze=False)[:, 0]
    ax = axes[0]
    gaps = []
    for s in streams:
        t = decode.loc[decode["stream"] == s, "t_ms"].to_numpy()
        gaps += [(s, a, b) for a, b in itertools.pairwise(t) if b >= lo and a <= hi]
    if gaps:
        lengths = np.array([b - a for _, a, b in gaps])
        norm = LogNorm(vmin=max(lengths.min(), 1e-3), vmax=max(lengths.max(), lengths.min() * 1.01))
        cmap = mpl.colormaps["viridis"]
        for s, a, b in gaps:
            ax.plot([a, b], [s, s], color=cmap(norm(b - a)), lw=5, solid_capstyle="butt")
        ax.scatter([b for _, _, b in gaps], [s for s, _, _ in gaps], marker="|", color="black", s=60, lw=1)
        fig.colorbar(mpl.cm.ScalarMappable(norm=norm, cmap=cmap), ax=ax, label="gap ms", pad=0.01)
    ax.axvspan(0, window, color="tab:red", alpha=0.12, label="prefill window (send → first token)")
    ax.axvline(0, color="tab:red", lw=1)
    ax.axvline(window, color="tab:red", lw=1, ls="--")
    ax.set_ylabel("decode stream")
    ax.set_yticks(streams or [0])
    ax.set_ylim(-0.7, max(len(streams), 1) - 0.3)
    ax.legend(loc="upper right", fontsize=8)
    cfg = record.config
    ax.set_title(
        f"injection P={cfg.new_prefill_tokens} next to D={cfg.decode_batch_size} decodes, "
        f"chunk {cfg.chunk_size} "
        f"(rep {cfg.repetition}): {record.interference.num_chunks_actual} chunks, {window:.1f} ms"
    )
    if steps:  # lay the logged steps end to end so that the last one ends at the first token
        sax = axes[1]
        durations = [s.elapsed_ms for s in steps if s.elapsed_ms is not None]  # all of them: filtered above
        ends = window - np.concatenate([[0.0], np.cumsum(durations[::-1])])[::-1][1:]
        for step, ms, end in zip(steps, durations, ends, strict=True):
            start = end - ms
            color = "tab:orange" if step.prefill_tokens else "tab:blue"
            sax.barh(0, ms, left=start, color=color, edgecolor="black", height=0.6)
            if ms > 0.06 * (hi - lo):
                sax.text(start + ms / 2, 0, f"{step.prefill_tokens}+{step.decode_tokens}",
                         ha="center", va="center", fontsize=8)  # fmt: skip
        sax.set_yticks([0], ["engine\nsteps"])
        sax.set_title("engine steps (prefill + decode tokens; orange: mixed, blue: decode-only)", fontsize=9)
    axes[-1].set_xlim(lo, hi)
    axes[-1].set_xlabel("ms since the injection's send")
    return fig


def step_fit_diagnostics(fit: object) -> Figure:
    """The step model's fit (``analysis.models.StepFit``): measured vs predicted step time, and the
    relative residuals against the prediction, coloured by step kind."""
    res: pd.DataFrame = fit.residuals  # type: ignore[attr-defined]
    res = res.assign(
        kind=res.get("kind", pd.Series("window", index=res.index)).fillna("window"),
        rel_residual=res["residual_ms"] / res["elapsed_ms"],
    )
    fig = Figure(figsize=(11, 4.2), layout="constrained")
    a, b = fig.subplots(1, 2)
    sns.scatterplot(data=res, x="predicted_ms", y="elapsed_ms", hue="kind", s=14, ax=a, alpha=0.7)
    top = float(max(res["predicted_ms"].max(), res["elapsed_ms"].max()))
    bottom = float(max(min(res["predicted_ms"].min(), res["elapsed_ms"].min()), 1e-3))
    a.plot([bottom, top], [bottom, top], color="black", lw=1, ls="--")
    a.set(xscale="log", yscale="log", xlabel="predicted step ms", ylabel="measured step ms")
    a.set_title(f"step model, R² = {fit.r2:.4f} (n = {fit.n}, {fit.data})")  # type: ignore[attr-defined]
    sns.scatterplot(
        data=res, x="predicted_ms", y="rel_residual", hue="kind", s=14, ax=b, alpha=0.7, legend=False
    )
    b.axhline(0, color="black", lw=1)
    b.set(xscale="log", xlabel="predicted step ms", ylabel="(measured − predicted) / measured")
    b.set_title("relative residuals")
    return fig


def model_comparison(records: list[RunRecord]) -> Figure:
    """Measured total interference against both models' predictions (log–log), with their R²."""
    from analysis.models import fit_seed_model, fit_step_model, interference_frame
    from analysis.robust import r_squared

    target = interference_frame(records)
    seed, step = fit_seed_model(records), fit_step_model(records)
    keys = target[["decode_batch_size", "new_prefill_tokens", "chunk_size", "scheduling"]].to_numpy()
    frames = []
    for name, model in (
        ("seed: n × D × penalty(D, chunk)", seed),
        (f"step: α + β_d·D + β_c·c + γ·{step.model}", step),
    ):
        pred = np.array([model.interference_ms(int(d), int(p), int(c), s) for d, p, c, s in keys])
        r2 = r_squared(target["interference_ms"].to_numpy(), pred)
        frames.append(target.assign(predicted_ms=pred, model=f"{name} (R² = {r2:.3f})"))
    data = pd.concat(frames, ignore_index=True)
    data = data[(data["predicted_ms"] > 0) & (data["interference_ms"] > 0)]
    fig = Figure(figsize=(6.5, 5), layout="constrained")
    ax = fig.subplots()
    sns.scatterplot(data=data, x="interference_ms", y="predicted_ms", hue="model", style="model", s=22, ax=ax)
    lo = float(data[["interference_ms", "predicted_ms"]].min().min())
    hi = float(data[["interference_ms", "predicted_ms"]].max().max())
    ax.plot([lo, hi], [lo, hi], color="black", lw=1, ls="--")
    ax.set(xscale="log", yscale="log", xlabel="measured total interference ms (aggregate decode delay)",
           ylabel="predicted ms")  # fmt: skip
    ax.set_title("seed 002's product model vs the step model")
    ax.legend(fontsize=8)
    return fig
