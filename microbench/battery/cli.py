"""Command line: ``python -m microbench.battery run --engine sim|vllm|external [--url URL] --tests ttft,itl
--workload NAME --profile conformant|quick --out DIR`` and ``python -m microbench.battery list``.

``--engine sim`` and ``vllm`` launch the engine (restartable, so 5.7 can turn prefix caching off and 5.10
can compare engine settings); ``external`` only reaches ``--url``. Exit status: 0 when every selected test
ran or was skipped with a reason, 1 when one failed with an error or the report's consistency gate failed.
A plan (tests, levels, requests, estimated time) prints before the tests and a progress line with ETA
after each; a run stopped part-way continues where it stopped when started again with the same ``--out``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shlex
import sys
import time
from contextlib import AsyncExitStack
from pathlib import Path

from engine_harness.engines import resolve_spec
from engine_harness.launch import EngineProcess
from microbench.battery.context import BatteryContext
from microbench.battery.engine import (
    EngineHandle,
    EngineOverrides,
    ExternalEngine,
    LaunchedEngine,
    served_model,
)
from microbench.battery.profiles import PROFILES, profile
from microbench.battery.render import gate_lines
from microbench.battery.runner import ordered_tests, plan_battery, run_battery, write_report
from microbench.battery.warmup import warm_up
from microbench.workloads.reference import WORKLOADS

__all__ = ["build_parser", "main"]


ENGINE_PREFIX = "engine:"
CONFIG_HELP = (
    "a configuration for 5.10 (repeat; the first is the baseline): NAME=URL, an endpoint, or "
    f"NAME={ENGINE_PREFIX}[KEY=VALUE,...], the battery's engine (--engine vllm|sim) restarted with "
    f"those EngineSpec fields changed ('{ENGINE_PREFIX}' alone: as launched), e.g. "
    f"--config bare={ENGINE_PREFIX} --config small-batch={ENGINE_PREFIX}max_num_seqs=4"
)


def _config(value: str) -> tuple[str, str | EngineOverrides]:
    name, sep, target = value.partition("=")
    if not sep or not name or not target:
        raise argparse.ArgumentTypeError(
            f"--config wants NAME=URL or NAME={ENGINE_PREFIX}KEY=VALUE,..., got {value!r}"
        )
    if not target.startswith(ENGINE_PREFIX):
        return name, target
    try:
        return name, EngineOverrides.parse(target.removeprefix(ENGINE_PREFIX))
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"{name}: {exc}") from None


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m microbench.battery", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("list", help="list the battery's tests")
    run = sub.add_parser("run", help="run the battery against an engine and write its reports")
    run.add_argument("--engine", choices=["sim", "vllm", "external"], default="sim")
    run.add_argument("--url", help="base URL (required for --engine external)")
    run.add_argument("--preset", default="cpu", help="engine preset for --engine vllm (default: cpu)")
    run.add_argument(
        "--sim-args", default="", help="extra sim flags, e.g. '--time-scale 0.2 --kv-blocks 256'"
    )
    run.add_argument("--tests", help="comma-separated test names (default: all)")
    run.add_argument(
        "--workload", default="synthetic-uniform", help=f"spec YAML or one of {', '.join(WORKLOADS)}"
    )
    run.add_argument("--profile", choices=list(PROFILES), default="conformant")
    run.add_argument("--seed", type=int, default=0)
    run.add_argument(
        "--plan-only",
        action="store_true",
        help="start the engine, warm up, probe briefly, print the plan with its estimated time, and stop",
    )
    run.add_argument("--cold-start", action="store_true", help="skip warm-up; the report declares it (4.5.3)")
    run.add_argument(
        "--config",
        type=_config,
        action="append",
        default=[],
        metavar=f"NAME=URL|NAME={ENGINE_PREFIX}KEY=VALUE,...",
        help=CONFIG_HELP,
    )
    run.add_argument("--ttft-slo-ms", type=float, help="TTFT P99 SLO (5.2 search, 5.3 optimal point)")
    run.add_argument("--tpot-slo-ms", type=float, help="TPOT P99 SLO (5.2 search)")
    run.add_argument("--gpus", type=int, default=0, help="accelerator count of the SUT (0: CPU only)")
    run.add_argument(
        "--out",
        type=Path,
        help="output folder (default results/battery-<time>); an existing one with a stopped run resumes it",
    )
    return parser


async def _engine(args: argparse.Namespace, stack: AsyncExitStack, out: Path) -> EngineHandle:
    if args.engine == "external":
        if not args.url:
            raise SystemExit("--engine external needs --url")
        if any(isinstance(target, EngineOverrides) for _, target in args.config):
            raise SystemExit(
                f"--config NAME={ENGINE_PREFIX}... restarts the battery's engine; "
                "engine-settings configurations need --engine vllm|sim"
            )
        return ExternalEngine(args.url)
    if args.url:
        raise SystemExit("--url is only for --engine external")
    if args.engine == "sim":
        spec = resolve_spec(kind="sim", model="sim", extra_args=shlex.split(args.sim_args))
    else:
        spec = resolve_spec(args.preset)
    process = await stack.enter_async_context(EngineProcess(spec, out / f"engine-{args.engine}.log"))
    return LaunchedEngine(process)


async def _run(args: argparse.Namespace) -> int:
    out: Path = args.out or Path("results") / f"battery-{time.strftime('%Y%m%d-%H%M%S')}"
    out.mkdir(parents=True, exist_ok=True)  # noqa: ASYNC240  (once, before any load runs)
    names = [n.strip() for n in args.tests.split(",") if n.strip()] if args.tests else None
    try:
        ordered_tests(names)  # unknown names fail before an engine starts
    except KeyError as exc:
        raise SystemExit(f"--tests: {exc.args[0]}") from None
    async with AsyncExitStack() as stack:
        engine = await _engine(args, stack, out)
        model, max_len = await served_model(engine.base_url)
        ctx = BatteryContext(
            engine=engine,
            model=model,
            profile=profile(args.profile),
            workload_name=args.workload,
            seed=args.seed,
            out_dir=out,
            max_model_len=max_len,
            guardrail_configs=dict(args.config),
            ttft_slo_ms=args.ttft_slo_ms,
            tpot_slo_ms=args.tpot_slo_ms,
            accelerators=args.gpus,
            cpu_count=os.cpu_count() or 1,
        )
        if args.plan_only:
            await warm_up(ctx, cold_start=args.cold_start)
            rows = await plan_battery(ctx, [t.name for t in ordered_tests(names)], _emit)
            (out / "plan.json").write_text(json.dumps([r.model_dump() for r in rows], indent=1) + "\n")
            print(f"plan only: nothing else ran; plan in {out / 'plan.json'}")
            return 0
        report = await run_battery(
            ctx, names, cold_start=args.cold_start, command=shlex.join(sys.argv), emit=_emit
        )
    write_report(report, out)
    for t in report.tests:
        print(
            f"{t.section:>5} {t.title:<36} {t.status:<8} {t.verdict}"
            + (f"  ({t.reason})" if t.reason else "")
        )
    print(f"reports in {out}")
    gate = gate_lines(report)
    for line in gate:
        print(line, file=sys.stderr)
    return 1 if gate or any(t.status == "failed" for t in report.tests) else 0


def _emit(line: str) -> None:
    print(line, flush=True)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "list":
        for t in ordered_tests():
            print(f"{t.section:>5}  {t.name:<16} {t.title}")
        return 0
    return asyncio.run(_run(args))
