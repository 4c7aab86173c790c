"""Run a battery: warm up, run the selected tests in section order, assemble and write the report.

``run_battery(ctx, names)`` returns the ``BatteryReport``; ``write_report(report, out_dir)`` writes
``report.json``, ``report-minimum.md`` (C.1), ``report.md`` (C.2), ``report.html`` (self-contained) and
``figures/*.png``. A test that raises ``SkipTest`` is reported as skipped with its reason; one that fails
with an error is reported as failed with the error, and the other tests still run.
"""

from __future__ import annotations

import datetime as dt
import logging
import os
import time
import traceback
from collections.abc import Callable
from pathlib import Path

import matplotlib

from benchcore.provenance import cpu_model, git_commit
from engine_harness.engines import engine_kind
from microbench.battery import sections as _sections  # noqa: F401  (registers the tests)
from microbench.battery.compliance import Requirement, verdict
from microbench.battery.context import BatteryContext
from microbench.battery.disclosures import disclosure_requirements, measure_disclosures, workload_stand_ins
from microbench.battery.plan import PlanRow, Probe, estimate_plan, format_plan
from microbench.battery.plots import figures_for
from microbench.battery.progress import Progress
from microbench.battery.registry import TESTS, BatteryTest, SkipTest
from microbench.battery.render import html_report, markdown_full, markdown_minimum
from microbench.battery.report import BatteryReport, SystemInfo, TestResult
from microbench.battery.state import RunState
from microbench.battery.warmup import warm_up, warmup_requirement
from microbench.loadgen.stages import Stage
from microbench.results.layout import BatteryFolder, new_manifest
from microbench.workloads.schedulers import parse_scheduler

__all__ = ["ordered_tests", "plan_battery", "run_battery", "write_report"]

REPO = Path(__file__).resolve().parents[2]

log = logging.getLogger(__name__)


def ordered_tests(names: list[str] | None = None) -> list[BatteryTest]:
    """The registered tests named (all when None), in section order; unknown names are an error."""
    for name in names or []:
        TESTS.get(name)
    chosen = [TESTS.get(n) for n in (names or TESTS.names())]
    return sorted(chosen, key=lambda t: [int(x) for x in t.section.split(".")])


async def _run_one(ctx: BatteryContext, test: BatteryTest, shared: list[Requirement]) -> TestResult:
    """Run ``test``; its verdict counts ``shared`` (the warm-up's and the disclosures' requirements)."""
    t0 = time.perf_counter()
    result = TestResult(name=test.name, section=test.section, title=test.title, status="ran")
    try:
        outcome = await test.run(ctx)
    except SkipTest as exc:
        result.status, result.reason = "skipped", str(exc)
    except Exception as exc:  # one broken test must not lose the others' results; it is reported failed
        log.error("battery test %s failed:\n%s", test.name, traceback.format_exc())
        result.status, result.reason = "failed", f"{type(exc).__name__}: {exc}"
    else:
        result.data = outcome.data
        result.requirements = shared + outcome.requirements
        result.notes = outcome.notes
        if ctx.profile.output_cap is not None:
            result.notes.append(
                f"profile {ctx.profile.name}: outputs capped at {ctx.profile.output_cap} tokens"
            )
        result.verdict = verdict(result.requirements)
    result.duration_s = time.perf_counter() - t0
    return result


async def _probe(ctx: BatteryContext) -> Probe:
    """A short closed-loop probe for the plan's estimates (not part of any test's figures)."""
    p = ctx.profile
    scheduler = parse_scheduler({"kind": "concurrency", "concurrency": p.probe_concurrency})
    stage = Stage.scheduled(
        "probe", scheduler, ctx.requests(ctx.workload_spec()), max_requests=min(p.probe_requests, 32)
    )
    w = (await ctx.run("plan-probe", [stage])).stage("probe")
    ok = w.latencies[w.latencies["ok"]]
    if ok.empty:
        raise RuntimeError("the planning probe completed no request; is the engine serving?")
    span = max(float(ok["done_s"].max()) - w.start_s, 1e-9)
    return Probe(
        rps=len(ok) / span, e2e_s=float(ok["e2e_s"].mean()), input_tokens=float(ok["input_tokens"].mean())
    )


async def plan_battery(
    ctx: BatteryContext, tests: list[BatteryTest], emit: Callable[[str], None]
) -> list[PlanRow]:
    """Probe briefly, then print (``emit``) and return the plan of ``tests``."""
    probe = await _probe(ctx)
    restart_s = engine_kind(ctx.engine.kind).start_s
    rows = estimate_plan(tests, ctx.profile, probe, len(ctx.guardrail_configs), restart_s=restart_s)
    emit(format_plan(rows, probe, ctx.profile.name))
    return rows


async def run_battery(
    ctx: BatteryContext,
    names: list[str] | None = None,
    *,
    cold_start: bool = False,
    command: str = "",
    engine_version: str | None = None,
    emit: Callable[[str], None] | None = None,
) -> BatteryReport:
    """Warm up (or declare a cold start), run the tests, and return the report (not yet written).

    With ``ctx.out_dir`` each finished test is saved under ``state/`` with the capacity ledger, and a
    later run into the same folder continues where this one stopped (finished tests are not rerun). With
    ``emit`` the plan (from a short probe) is printed before the tests, and a progress line with ETA
    after each.
    """
    selected = ordered_tests(names)
    if ctx.out_dir is not None and not (folder := BatteryFolder(ctx.out_dir)).exists():  # the job's manifest
        definition = {"tests": [t.name for t in selected], "profile": ctx.profile.name, "command": command}
        folder.write_manifest(new_manifest(folder, definition, {"kind": ctx.engine.kind}, seed=ctx.seed))
    state = RunState(ctx.out_dir / "state") if ctx.out_dir is not None else None
    done = state.load(ctx) if state is not None else {}
    if done and emit:
        finished = [t.name for t in selected if t.name in done]
        emit(f"resuming: {', '.join(finished)} finished before; {len(selected) - len(finished)} to run")
    todo = [t for t in selected if t.name not in done]
    warmup = await warm_up(ctx, cold_start=cold_start) if todo else state.warmup()  # type: ignore[union-attr]
    if state is not None:  # the capacity measurement is saved as soon as it is done, not with its test
        ctx.on_capacity = lambda: state.save_context(ctx, warmup)
    disclosures = measure_disclosures(ctx)
    shared = warmup_requirement(warmup) + disclosure_requirements(disclosures) + workload_stand_ins(ctx)
    progress = None
    if emit and todo:
        progress = Progress(await plan_battery(ctx, todo, emit), emit)
    results = []
    for test in selected:
        if test.name in done:
            results.append(done[test.name])
            continue
        result = await _run_one(ctx, test, shared)
        results.append(result)
        if state is not None:
            state.save(result, ctx, warmup)
        if progress is not None:
            progress.finished(test.name, f"{result.status} in {result.duration_s:.0f} s", len(todo))
    capacity = ctx.capacity() if ctx.ledger else None
    for result in results:
        if result.data is not None and type(result.data).shows_capacity and capacity is not None:
            result.data.battery_capacity = capacity.model_copy(update={"entries": []})
    system = SystemInfo(
        model=ctx.model,
        engine_kind=ctx.engine.kind,
        engine_version=engine_version or ctx.engine.version,
        base_url=ctx.engine.base_url,
        hardware=cpu_model() + "".join(f", {g}" for g in disclosures.accelerators),
        accelerators=ctx.accelerators,
        cpu_count=os.cpu_count() or 1,
        engine_settings=ctx.engine.settings,
        max_model_len=ctx.max_model_len,
        prefix_caching=ctx.engine.prefix_caching,
        sut_boundary=disclosures.sut_boundary,
        guardrails=disclosures.guardrails
        + (f"; 5.10 compares: {', '.join(ctx.guardrail_configs)}" if len(ctx.guardrail_configs) > 1 else ""),
    )
    return BatteryReport(
        created_at=dt.datetime.now(dt.UTC).isoformat(timespec="milliseconds"),
        command=command,
        profile=ctx.profile.name,
        seed=ctx.seed,
        workload=ctx.workload_name,
        workload_spec=ctx.workload_spec().model_dump(mode="json"),
        system=system,
        warmup=warmup,
        tests=results,
        git_commit=git_commit(REPO),
        capacity=capacity,
        disclosures=disclosures,
    )


def write_report(report: BatteryReport, out_dir: Path) -> None:
    """Figures first (their names go into the report), then JSON, Markdown and HTML."""
    matplotlib.use("Agg")
    figures = out_dir / "figures"
    figures.mkdir(parents=True, exist_ok=True)
    for test in report.tests:
        test.figures = []
        for name, fig in figures_for(test):
            fig.savefig(figures / name, dpi=110)
            test.figures.append(name)
    (out_dir / "report.json").write_text(report.model_dump_json(indent=2) + "\n")
    (out_dir / "report-minimum.md").write_text(markdown_minimum(report))
    (out_dir / "report.md").write_text(markdown_full(report))
    (out_dir / "report.html").write_text(html_report(report, figures))
