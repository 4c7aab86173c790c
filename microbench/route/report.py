"""The route experiment's report: one typed record (``RouteReport``) from the run folder, rendered as JSON,
Markdown and HTML (``benchcore.pages``) with a timeline figure and the comparison table.

Everything comes from the stored replays (``derive``); a resumed or partial run reports what it holds.
The timeline draws one replay per policy (the first valid one of repetition 0): per request a bar from
send to first token (where it prefilled: the prefill worker's share hatched), its KV hand-off, and the
decode streams' inter-token gaps as ticks under it — where the decodes stall and where they do not.
"""

from __future__ import annotations

import io
import math
from typing import Literal

import pandas as pd
from pydantic import Field

from benchcore.atomic import atomic_write_bytes, write_model
from benchcore.pages import png_data_uri, render_page
from benchcore.schema import StrictModel
from microbench.results.layout import RouteFolder
from microbench.route.boundary import BoundaryRow, boundary_rows
from microbench.route.config import RouteConfig
from microbench.route.derive import (
    HIGHER_IS_BETTER,
    Effect,
    PolicySummary,
    ReplayFigures,
    ab_effects,
    policy_summary,
    replay_figures,
)
from microbench.route.workload import COLD, DECODE

__all__ = ["RouteReport", "build_report", "write_report"]

_SHOWN = (
    ("decode ITL p50 ms", "decode_itl_p50_ms"), ("decode ITL p99 ms", "decode_itl_p99_ms"),
    ("decode TPOT p50 ms", "decode_tpot_p50_ms"), ("decode TPOT p99 ms", "decode_tpot_p99_ms"),
    ("cold TTFT p50 ms", "cold_ttft_p50_ms"), ("cold TTFT p99 ms", "cold_ttft_p99_ms"),
    ("goodput req/s", "goodput_rps"), ("SLO met", "slo_met_fraction"),
    ("offload fraction", "offload_fraction"),
    ("KV xfer mean ms", "kv_xfer_mean_ms"), ("hand-off p50 ms", "handoff_p50_ms"),
    ("total latency s", "total_latency_s"), ("router decide p99 µs", "decide_p99_us"),
)  # fmt: skip


METHOD = (
    "B/A of the medians over valid replays (B: table, A: the fixed policy), percentile-bootstrap 95% CI, "
    "Mann–Whitney U, Benjamini–Hochberg across rows; verdicts read lower-is-better "
    "('B better': table lower); the 'better' column names the winner, also where higher is better "
    f"({', '.join(sorted(HIGHER_IS_BETTER))})"
)


class RouteReport(StrictModel):
    """The one record every rendering of a route run is made from."""

    version: Literal[1] = 1  # bump on a breaking change
    run_id: str
    question: str
    slo: dict[str, float]
    policies: list[str]
    replays: list[ReplayFigures]
    summary: list[PolicySummary]
    effects: list[Effect]
    boundary: list[BoundaryRow] = Field(default_factory=list, description="per cold P: predicted vs measured")
    method: str
    verdict_lines: list[str]
    notes: list[str] = Field(default_factory=list)
    timeline_caption: str = ""

    def cell(self, policy: str, figure: str) -> PolicySummary | None:
        return next((s for s in self.summary if s.policy == policy and s.figure == figure), None)


def _verdicts(effects: list[Effect], summary: list[PolicySummary], policies: list[str]) -> list[str]:
    lines = []
    total = {s.policy: s.median for s in summary if s.figure == "total_latency_s" and s.median is not None}
    if total:
        best = min(total, key=lambda p: total[p])
        lines.append(
            "total latency (request-seconds, lower is better): "
            + ", ".join(f"{p} {total[p]:.2f} s" for p in policies if p in total)
            + f"; lowest: {best}"
        )
    for e in effects:
        if e.figure in ("total_latency_s", "goodput_rps", "decode_itl_p99_ms", "cold_ttft_p99_ms"):
            ratio = "–" if e.ratio is None else f"{e.ratio:.3f}"
            ci = "–" if e.ci_low is None else f"[{e.ci_low:.3f}, {e.ci_high:.3f}]"
            lines.append(f"{e.figure}: {e.policy}/{e.baseline} = {ratio} {ci}, {e.verdict}")
    return lines


def build_report(folder: RouteFolder, cfg: RouteConfig) -> RouteReport:
    """The report of what the folder stores (pure in the folder's contents)."""
    stored = folder.replays()
    figures = [replay_figures(rec, frame, cfg.slo_ttft_ms, cfg.slo_tpot_ms) for rec, frame in stored]
    policies: list[str] = list(cfg.policies)
    summary = policy_summary(figures, policies)
    effects = ab_effects(figures) if "table" in policies and len(policies) > 1 else []
    effects = [e for e in effects if e.baseline in policies]
    notes = [
        f"SLO for goodput: TTFT ≤ {cfg.slo_ttft_ms:g} ms and TPOT ≤ {cfg.slo_tpot_ms:g} ms",
        f"{len(figures)} replays stored, {sum(f.valid for f in figures)} valid; policies run in rotated "
        "order per round (each in each position equally often over len(policies) rounds)",
        "D = requests on the decode worker as the router knows them; P = prompt tokens (cold workload: every "
        "token uncached, verified by the engines' prefix-cache counters); chunk = the decode worker's budget "
        f"({cfg.chunk()})",
    ]
    loads = [f for f in figures if f.engine_busy_pct]
    if loads:
        for policy in policies:
            mine = [f for f in loads if f.policy == policy]
            if mine:
                busy = pd.DataFrame([f.engine_busy_pct for f in mine]).median()
                la = [f.loadavg_1m for f in mine if f.loadavg_1m is not None]
                notes.append(
                    f"contention under {policy}: median CPU over a replay "
                    + ", ".join(f"{role} {v:.0f}% of a core" for role, v in busy.items())
                    + (f"; box load average {min(la):.1f}–{max(la):.1f}" if la else "")
                )
    return RouteReport(
        run_id=folder.root.name,
        question="Does applying the offload table per request beat always-colocated and always-disaggregated "
        "on one seeded bursty workload (long-running decodes plus cold long prompts)?",
        slo={"ttft_ms": cfg.slo_ttft_ms, "tpot_ms": cfg.slo_tpot_ms},
        policies=policies,
        replays=figures,
        summary=summary,
        effects=effects,
        boundary=boundary_rows([(rec.policy, rec.valid, frame) for rec, frame in stored]),
        method=METHOD,
        verdict_lines=_verdicts(effects, summary, policies),
        notes=notes,
        timeline_caption="one replay per policy: per request, send → first token (hatched: on the prefill "
        "worker, then the hand-off), then decoding; red ticks: decode-stream gaps over 3× the replay's "
        "median gap",
    )


def _fmt(x: float | None, digits: int = 2) -> str:
    return "–" if x is None or not math.isfinite(x) else f"{x:.{digits}f}"


def _summary_table(r: RouteReport) -> tuple[list[str], list[list[str]]]:
    columns = ["policy", *[label for label, _ in _SHOWN]]
    rows = []
    for policy in r.policies:
        row = [policy]
        for _, figure in _SHOWN:
            s = r.cell(policy, figure)
            if s is None or s.median is None:
                row.append("–")
            else:
                ci = f" [{_fmt(s.ci_low)}, {_fmt(s.ci_high)}]" if s.ci_low is not None else ""
                row.append(f"{_fmt(s.median)}{ci}")
        rows.append(row)
    return columns, rows


def _effect_table(r: RouteReport) -> tuple[list[str], list[list[str]]]:
    columns = ["figure", "B/A", "ratio", "95% CI", "p (BH)", "verdict", "better"]
    rows = [
        [e.figure, f"{e.policy}/{e.baseline}", _fmt(e.ratio, 3),
         f"[{_fmt(e.ci_low, 3)}, {_fmt(e.ci_high, 3)}]", _fmt(e.p_adjusted, 3), e.verdict, e.better or "–"]
        for e in r.effects
    ]  # fmt: skip
    return columns, rows


def _boundary_table(r: RouteReport) -> tuple[list[str], list[list[str]]]:
    columns = ["P", "table offloads", "D seen", "table interference ms", "table transfer ms",
               "measured decode delay ms (local)", "measured hand-off ms (offloaded)",
               "experiment says"]  # fmt: skip
    rows = [
        [str(b.prompt_tokens), _fmt(b.table_offload_share), _fmt(b.table_decode_running, 1),
         _fmt(b.table_interference_ms, 1), _fmt(b.table_transfer_ms, 1), _fmt(b.measured_decode_delay_ms, 1),
         _fmt(b.measured_handoff_ms, 1), b.experiment_says]
        for b in r.boundary
    ]  # fmt: skip
    return columns, rows


def markdown(r: RouteReport) -> str:
    """The report as Markdown."""
    out = [f"# Route experiment {r.run_id}", "", r.question, ""]
    out += [f"- {line}" for line in r.verdict_lines] + [""]
    for title, (columns, rows) in (
        ("Per policy", _summary_table(r)),
        ("The table's boundary beside the experiment's", _boundary_table(r)),
        ("Table against fixed", _effect_table(r)),
    ):
        out += [f"## {title}", "", "| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
        out += ["| " + " | ".join(row) + " |" for row in rows] + [""]
    out += (
        [r.method, "", "## Notes", ""] + [f"- {n}" for n in r.notes] + ["", "![timeline](timeline.png)", ""]
    )
    return "\n".join(out)


def timeline_png(folder: RouteFolder, policies: list[str]) -> bytes | None:
    """The timeline figure (see the module docstring); None when no replay is stored."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    chosen = {}
    for rec, frame in folder.replays():
        if rec.policy in policies and rec.policy not in chosen and rec.valid:
            chosen[rec.policy] = frame
    if not chosen:
        return None
    fig, axes = plt.subplots(len(chosen), 1, figsize=(11, 2.6 * len(chosen)), sharex=True, squeeze=False)
    for ax, (policy, frame) in zip(axes[:, 0], chosen.items(), strict=True):
        gaps = np.concatenate(
            [
                np.diff(np.asarray(c, dtype=float))
                for c, k in zip(frame["chunk_ns"], frame["client_id"], strict=True)
                if k == DECODE and len(c) > 1
            ]
            or [np.empty(0)]
        )
        slow = 3 * float(np.median(gaps)) if gaps.size else math.inf
        for y, row in enumerate(frame.itertuples()):
            send, first = row.send_ns, row.first_chunk_ns
            if pd.isna(send) or pd.isna(first):
                continue
            color = "tab:orange" if row.client_id == COLD else "tab:blue"
            offload = bool(getattr(row, "offload", False)) and not pd.isna(getattr(row, "offload", None))
            ax.barh(
                y,
                (first - send) / 1e9,
                left=send / 1e9,
                color=color,
                hatch="//" if offload else None,
                alpha=0.8,
            )
            chunks = np.asarray(row.chunk_ns, dtype=float)
            if chunks.size > 1:
                ax.plot([chunks[0] / 1e9, chunks[-1] / 1e9], [y, y], color=color, lw=1)
                if row.client_id == DECODE:
                    big = np.flatnonzero(np.diff(chunks) > slow)
                    ax.plot(chunks[big + 1] / 1e9, [y] * len(big), "|", color="red", ms=8)
        ax.set_ylabel(policy)
        ax.set_yticks([])
    axes[-1, 0].set_xlabel("time since replay start (s)")
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90)
    plt.close(fig)
    return buf.getvalue()


def write_report(folder: RouteFolder, cfg: RouteConfig) -> RouteReport:
    """``report.json``, ``report.md``, ``report.html`` and ``timeline.png`` in the run folder."""
    report = build_report(folder, cfg)
    write_model(folder.root / "report.json", report)
    png = timeline_png(folder, report.policies)
    if png is not None:
        atomic_write_bytes(folder.root / "timeline.png", png)
    atomic_write_bytes(folder.root / "report.md", markdown(report).encode())
    sc, sr = _summary_table(report)
    ec, er = _effect_table(report)
    bc, br = _boundary_table(report)
    html = render_page(
        "microbench.route", "route_report.html", title=f"Route experiment {report.run_id}", banner=None,
        r=report,
        summary_columns=sc, summary_rows=sr, effect_columns=ec, effect_rows=er, boundary_columns=bc,
        boundary_rows=br,
        timeline=png_data_uri(png) if png is not None else None,
    )  # fmt: skip
    atomic_write_bytes(folder.root / "report.html", html.encode())
    return report
