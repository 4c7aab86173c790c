"""Renderers of a ``BatteryReport``: JSON, the minimum viable report (C.1), the full report (C.2) as Markdown,
and a self-contained HTML page (``templates/battery_report.html`` on the shared layout of
``benchcore.pages``, figures embedded as base64 PNG).

Every number comes from the report object; tables are the tests' own ``Table`` layouts.
"""

from __future__ import annotations

from pathlib import Path

from benchcore.pages import png_data_uri, render_page
from microbench.battery.gate import check_report
from microbench.battery.plots import caption_for
from microbench.battery.report import BatteryReport, Table, TestResult, capacity_rows, num
from microbench.battery.sections.ttft import TtftData
from microbench.measure.sustainable import Capacity

__all__ = ["gate_lines", "html_report", "markdown_full", "markdown_minimum"]


def _load_model(report: BatteryReport) -> str:
    ttft = report.result("ttft")
    if ttft is not None and isinstance(ttft.data, TtftData):
        return ttft.data.load
    return f"per test (profile {report.profile})"


def _key_results(report: BatteryReport) -> list[tuple[str, str]]:
    """C.1's key results; a value whose test did not run says so."""
    out: dict[str, str] = {
        "TTFT P50": "not run (5.1)",
        "TTFT P99": "not run (5.1)",
        "TPOT P50": "not run (5.1)",
        "TPOT P99": "not run (5.1)",
        "Max Throughput": "not measured (no load level ran)",
        "Throughput at P99 TTFT < 500 ms": "not run (5.3)",
    }
    cap = report.capacity
    if cap is not None:
        out["Max Throughput"] = capacity_rows(cap)[0][1] + " (sustainable; the report's one maximum)"
        out["Max sustainable rate"] = capacity_rows(cap)[2][1] + _scaled_by(cap)
    for t in report.tests:
        if t.data is not None:
            out.update(t.data.headline())
    return list(out.items())


def _scaled_by(cap: Capacity) -> str:
    """When a later level was sustainable above 5.2's search result, which of the two set the loads."""
    searched = [e.tested_rps for e in cap.entries if e.test == "5.2" and e.loop == "open" and e.sustainable]
    if not searched or cap.sustainable_rate_rps is None or cap.sustainable_rate_rps <= max(searched):
        return ""
    return (
        f"; above 5.2's search result {max(searched):.2f} req/s, which set the loads of 5.1, 5.3, 5.4 "
        "and 5.6 (measured before them)"
    )


def gate_lines(report: BatteryReport) -> list[str]:
    """The consistency gate's verdict as lines for the top of a report (empty when it passes)."""
    problems = check_report(report)
    if not problems:
        return []
    return [
        f"CONSISTENCY GATE FAILED ({len(problems)}): this report contradicts itself; the figures below "
        "are shown as measured, not corrected. Each line is a bug to fix:",
        *(f"- {p}" for p in problems),
    ]


def _deviations(report: BatteryReport) -> list[str]:
    lines = []
    for t in report.tests:
        unmet = [r for r in t.requirements if not r.met]
        if unmet:
            lines.append(
                f"{t.section} {t.title}: {t.verdict}: "
                + "; ".join(f"{r.level} {r.ref} {r.text} ({r.detail})" for r in unmet)
            )
        if t.status != "ran":
            lines.append(f"{t.section} {t.title}: {t.status}: {t.reason}")
    return lines


def _requests_and_duration(report: BatteryReport) -> tuple[str, str]:
    ttft = report.result("ttft")
    if ttft is not None and isinstance(ttft.data, TtftData):
        return str(ttft.data.requests), f"{ttft.data.duration_s:.1f}"
    return "per test", f"{sum(t.duration_s for t in report.tests):.1f} (whole battery)"


def markdown_minimum(report: BatteryReport, gate: bool = True) -> str:
    """Appendix C.1, the minimum viable report (after the consistency gate's banner, if it failed)."""
    s = report.system
    count, duration = _requests_and_duration(report)
    hardware = f"{s.accelerators} × GPU" if s.accelerators else f"{s.hardware} (no GPU)"
    banner = gate_lines(report) if gate else []
    lines = [
        *([*banner, ""] if banner else []),
        "```",
        "=== LLM Benchmark Report (Minimum) ===",
        "",
        "System Identification:",
        f"  Model: {s.model}",
        f"  Hardware: {hardware}",
        f"  Software: {s.engine_kind} {s.engine_version or '(version not reported)'}",
        f"  SUT Boundary: {s.sut_boundary}",
        "",
        "Test Configuration:",
        f"  Workload: {report.workload}",
        f"  Load Model: {_load_model(report)}",
        f"  Request Count: {count}",
        f"  Test Duration: {duration} s",
        "",
        "Key Results:",
        *(f"  {k}: {v}" for k, v in _key_results(report)),
        "",
        "Notes:",
    ]
    notes = ["cold-start measurement (no warm-up)"] if report.warmup.cold_start else []
    notes += [f"profile {report.profile}", *_deviations(report), f"Guardrails: {s.guardrails}"]
    lines += [f"  {n}" for n in notes] + ["", "=== End Report ===", "```"]
    return "\n".join(lines) + "\n"


def _md_table(table: Table) -> str:
    def row(cells: list[str]) -> str:
        return "| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |"

    out = [f"**{table.title}**", "", row(table.columns), row(["---"] * len(table.columns))]
    out += [row(r) for r in table.rows]
    if table.note:
        out += ["", table.note]
    return "\n".join(out) + "\n"


def _system_rows(report: BatteryReport) -> list[list[str]]:
    s = report.system
    return [
        ["Model", s.model],
        ["Engine", f"{s.engine_kind} {s.engine_version or ''}".strip()],
        ["Endpoint", s.base_url],
        ["Hardware", s.hardware],
        ["GPUs", str(s.accelerators)],
        ["CPU cores", str(s.cpu_count)],
        ["SUT boundary", s.sut_boundary],
        ["Max model length", num(s.max_model_len, ".0f")],
        ["Prefix caching", {True: "enabled", False: "disabled", None: "not known"}[s.prefix_caching]],
        ["Guardrails", s.guardrails],
        ["Engine settings", ", ".join(f"{k}={v}" for k, v in sorted(s.engine_settings.items())) or "–"],
        *_disclosure_rows(report),
    ]


def _disclosure_rows(report: BatteryReport) -> list[list[str]]:
    """4.3.3 and 4.4: seeds, salt, prompts and tokenizer (reports written before them have none)."""
    d = report.disclosures
    if d is None:
        return []
    card, p = d.tokenizer, d.prompts
    return [
        ["SUT boundary source", d.sut_boundary_source],
        ["Accelerators", f"{', '.join(d.accelerators) or 'none'} ({d.accelerators_source})"],
        [
            "Tokenizer",
            f"{card['name']}, {card['vocab_size']} tokens, sha256 {card['sha256']}" if card else "not known",
        ],
        ["Token counting", d.token_counting],
        ["Special tokens", d.special_tokens],
        ["Seeds", f"workload {d.workload_seed}, arrivals {d.arrival_seed}, prompt salt {p.get('salt', '–')}"],
        ["Prompts", f"{p.get('form', '–')}, token ids {p.get('token_space', '–')}"],
    ]


def _config_rows(report: BatteryReport) -> list[list[str]]:
    w = report.warmup
    warm = (
        "cold start (skipped, declared)"
        if w.cold_start
        else (
            f"{w.requests} requests, {w.output_tokens} output tokens, "
            f"queue drained: {w.queue_drained}, probe "
            f"variation {num(None if w.variation is None else w.variation * 100, '.1f', '%')}"
        )
    )
    return [
        ["Workload", report.workload],
        ["Profile", report.profile],
        ["Seed", str(report.seed)],
        ["Warm-up (4.5)", warm],
        ["Clock", "client perf_counter_ns, single machine (4.7.1)"],
        ["Protocol", "HTTP SSE, OpenAI /v1/completions with token-id prompts; tokens counted from usage"],
    ]


def _compliance_rows(report: BatteryReport) -> list[list[str]]:
    rows = []
    for t in report.tests:
        unmet = "; ".join(f"{r.level} {r.ref}: {r.text} ({r.detail})" for r in t.requirements if not r.met)
        rows.append([f"{t.section} {t.title}", t.status, t.verdict, unmet or (t.reason or "–")])
    return rows


def _sections(report: BatteryReport) -> list[tuple[str, list[Table], TestResult | None]]:
    """(heading, tables, test) in C.2 order; the per-test sections carry their test for figures and notes."""
    summary = Table(
        title="Key results", columns=["Metric", "Value"], rows=[list(kv) for kv in _key_results(report)]
    )
    sections: list[tuple[str, list[Table], TestResult | None]] = [
        (
            "System Identification",
            [Table(title="System", columns=["Item", "Value"], rows=_system_rows(report))],
            None,
        ),
        (
            "Test Configuration",
            [Table(title="Configuration", columns=["Item", "Value"], rows=_config_rows(report))],
            None,
        ),
        ("Results", [summary], None),
    ]
    for t in report.tests:
        tables = t.data.tables() if t.data is not None else []
        reqs = Table(
            title="Requirements",
            columns=["Ref", "Level", "Requirement", "Met", "Detail"],
            rows=[[r.ref, r.level, r.text, "yes" if r.met else "NO", r.detail] for r in t.requirements],
        )
        sections.append(
            (f"{t.section} {t.title} — {t.verdict}", [*tables, reqs] if t.requirements else tables, t)
        )
    compliance = Table(
        title="Methodology compliance",
        columns=["Test", "Status", "Verdict", "Unmet / reason"],
        rows=_compliance_rows(report),
    )
    repro = Table(
        title="Reproduction",
        columns=["Item", "Value"],
        rows=[
            ["Command", report.command],
            ["Git commit", report.git_commit or "–"],
            ["Created", report.created_at],
            ["Report version", str(report.version)],
            ["Raw data", "traces/<test>/… (per-request timestamps)"],
        ],
    )
    sections += [("Methodology Compliance", [compliance], None), ("Reproduction Information", [repro], None)]
    return sections


def markdown_full(report: BatteryReport, figures_dir: str = "figures") -> str:
    """Appendix C.2, the full report (figures linked from ``figures_dir``)."""
    out = ["# LLM Benchmark Report (Full)", ""]
    gate = gate_lines(report)
    if gate:
        out += ["> **" + gate[0] + "**", *(f"> {g}" for g in gate[1:]), ""]
    for heading, tables, test in _sections(report):
        out += [f"## {heading}", ""]
        if test is not None and test.status != "ran":
            out += [f"*{test.status}*: {test.reason}", ""]
        for table in tables:
            out += [_md_table(table)]
        if test is not None:
            out += [
                f"![{caption_for(test.name)}]({figures_dir}/{f})\n\n*{caption_for(test.name)}*\n"
                for f in test.figures
            ]
            out += [f"- {n}" for n in test.notes] + ([""] if test.notes else [])
    return "\n".join(out)


def html_report(report: BatteryReport, figures_dir: Path | None) -> str:
    """One self-contained HTML page (``templates/battery_report.html`` on the shared layout): the minimum
    report, then the full report with its figures embedded."""
    sections = []
    for heading, tables, test in _sections(report):
        figures = []
        if test is not None and figures_dir is not None:
            figures = [
                {"src": png_data_uri((figures_dir / name).read_bytes()), "caption": caption_for(test.name)}
                for name in test.figures
                if (figures_dir / name).is_file()
            ]
        sections.append({
            "heading": heading,
            "skipped": test is not None and test.status != "ran",
            "status": test.status if test else "",
            "reason": test.reason if test else "",
            "tables": tables,
            "figures": figures,
            "notes": test.notes if test else [],
        })  # fmt: skip
    gate = gate_lines(report)
    return render_page(
        "microbench.battery",
        "battery_report.html",
        title="LLM Benchmark Report",
        banner=[gate[0], *(g.removeprefix("- ") for g in gate[1:])] if gate else [],
        minimum=markdown_minimum(report, gate=False).strip().strip("`").strip(),
        sections=sections,
    )
