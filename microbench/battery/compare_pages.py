"""The renderers of one ``compare.BatteryComparison``: Markdown and HTML (on the shared page library)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from benchcore.atomic import atomic_write_bytes
from benchcore.pages import render_page

if TYPE_CHECKING:
    from microbench.battery.compare import BatteryComparison, SystemCost

__all__ = ["CHECK_COLUMNS", "COST_COLUMNS", "EFFECT_COLUMNS", "markdown", "runs", "write_pages"]

CHECK_COLUMNS = ["Item", "§", "Same", "A", "B", "If different"]
COST_COLUMNS = [
    "Run",
    "Max output (tok/s)",
    "Devices",
    "tok/s per device",
    "Price",
    "US$ per 1M output tokens",
]
EFFECT_COLUMNS = [
    "Trace",
    "Stage",
    "Metric",
    "requests (runs) A/B",
    "A",
    "B",
    "B/A",
    "95% CI",
    "p (BH)",
    "Verdict",
]
COST_NOTE = (
    "Max output: the report's one capacity (sustainable) ± its 95% half-width, or with several runs the mean "
    "of theirs ± a t 95% half-width across runs; cost over that interval. "
    "A per-device-hour price pays every device for the hour the throughput fills"
)


def _num(v: float | None, fmt: str = ".3g") -> str:
    return "–" if v is None else f"{v:{fmt}}"


def _checks(c: BatteryComparison) -> list[list[str]]:
    return [
        [k.item, k.ref, "yes" if k.same else "NO", k.a[:120], k.b[:120],
         "refuses (unless --allow-differences)" if k.refuses else "a stated condition"]
        for k in c.checks
    ]  # fmt: skip


def _cost_row(s: SystemCost) -> list[str]:
    tps = "–" if s.max_output_tps is None else f"{s.max_output_tps:.1f} ± {s.max_output_tps_ci or 0:.1f}"
    usd = _num(s.usd_per_mtok, ".4g")
    if s.usd_per_mtok_range is not None:
        usd += f" ({s.usd_per_mtok_range[0]:.4g} to {s.usd_per_mtok_range[1]:.4g})"
    price = "not given" if s.price is None else s.price.text
    return [
        f"{s.name} ({s.runs} run{'s' if s.runs > 1 else ''})",
        tps,
        f"{s.devices} {s.device}",
        _num(s.tps_per_device, ".1f"),
        price,
        usd,
    ]


def _effects(c: BatteryComparison) -> list[list[str]]:
    rows = []
    for e in c.effects:
        ci = "–" if None in e.ci else f"{e.ci[0]:.3f} to {e.ci[1]:.3f}"
        rows.append(
            [e.label, e.stage, f"{e.metric} P{e.q:g}", f"{e.n_a}/{e.n_b} ({e.runs_a}/{e.runs_b})",
             f"{e.a * 1e3:.1f} ms", f"{e.b * 1e3:.1f} ms", _num(e.ratio, ".3f"), ci,
             _num(e.p_adjusted, ".2g"), e.verdict]
        )  # fmt: skip
    return rows


def _unmatched(c: BatteryComparison) -> str:
    parts = [f"only in {k}: {', '.join(v)}" for k, v in c.unmatched.items() if v]
    return "; ".join(parts) or "every trace label is in both runs"


def runs(paths: list[str]) -> str:
    """A system's runs: how many, and their folders."""
    return f"{len(paths)} run{'s' if len(paths) > 1 else ''}: {', '.join(paths)}"


def _md_table(columns: list[str], rows: list[list[str]]) -> list[str]:
    out = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    out += ["| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |" for row in rows]
    return out


def markdown(c: BatteryComparison) -> str:
    lines = ["# Battery comparison: B against A", "", f"- A: {runs(c.runs_a)}", f"- B: {runs(c.runs_b)}", ""]
    lines += [f"**Status: {c.status}**", ""]
    lines += [f"- condition: {x}" for x in c.conditions] + ([""] if c.conditions else [])
    lines += ["## Equivalence (§6.1, §6.4)", "", *_md_table(CHECK_COLUMNS, _checks(c)), ""]
    lines += ["## Normalisation (§6.2)", "", *_md_table(COST_COLUMNS, [_cost_row(s) for s in c.costs]), ""]
    lines += [COST_NOTE, "", "## Percentiles per trace stage (§6.3)", "", c.method, ""]
    lines += [*_md_table(EFFECT_COLUMNS, _effects(c)), "", _unmatched(c), ""]
    return "\n".join(lines)


def html(c: BatteryComparison) -> str:
    return render_page(
        "microbench.battery",
        "battery_comparison.html",
        title="Battery comparison",
        banner=None,
        c=c,
        runs_a=runs(c.runs_a),
        runs_b=runs(c.runs_b),
        check_columns=CHECK_COLUMNS,
        checks=_checks(c),
        cost_columns=COST_COLUMNS,
        costs=[_cost_row(s) for s in c.costs],
        cost_note=COST_NOTE,
        effect_columns=EFFECT_COLUMNS,
        effects=_effects(c),
        unmatched=_unmatched(c),
    )


def write_pages(c: BatteryComparison, out: Path) -> list[Path]:
    """``comparison.md`` and ``comparison.html`` into ``out``."""
    paths = [out / "comparison.md", out / "comparison.html"]
    atomic_write_bytes(paths[0], markdown(c).encode())
    atomic_write_bytes(paths[1], html(c).encode())
    return paths
