"""Command line: ``python -m microbench.battery run --engine sim|vllm|external [--url URL] --tests ttft,itl
--workload NAME --profile conformant|quick --out DIR`` and ``python -m microbench.battery list``.

``--engine sim`` and ``vllm`` launch the engine (restartable, so 5.7 can turn prefix caching off and 5.10
can compare engine settings); ``external`` only reaches ``--url``. Exit status: 0 when every selected test
ran or was skipped with a reason, 1 when one failed with an error.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shlex
import sys
import time
from contextlib import AsyncExitStack
from pathlib import Path

import aiohttp

from benchcore.cli import BadInput, run_cli
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
from microbench.battery.runner import ordered_tests, run_battery, write_report
from microbench.workloads.reference import WORKLOADS
from microbench.workloads.spec import WorkloadSpecError, load_workload_spec

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
    run.add_argument("--out", type=Path, help="output folder (default results/battery-<time>)")
    return parser


async def _engine(args: argparse.Namespace, stack: AsyncExitStack, out: Path) -> EngineHandle:
    if args.engine == "external":
        return ExternalEngine(args.url)
    if args.engine == "sim":
        spec = resolve_spec(kind="sim", model="sim", extra_args=shlex.split(args.sim_args))
    else:
        spec = resolve_spec(args.preset)
    process = await stack.enter_async_context(EngineProcess(spec, out / f"engine-{args.engine}.log"))
    return LaunchedEngine(process)


def _check_inputs(args: argparse.Namespace) -> list[str] | None:
    """Bad input (exit 2) is found before an engine starts: test names, the workload, the SLOs."""
    names = [n.strip() for n in args.tests.split(",") if n.strip()] if args.tests else None
    try:
        ordered_tests(names)
    except KeyError as exc:
        raise BadInput(f"--tests: {exc.args[0]}") from None
    if args.workload not in WORKLOADS:
        try:
            load_workload_spec(args.workload)
        except (WorkloadSpecError, OSError, ValueError) as exc:
            raise BadInput(f"--workload: {exc}") from None
    for flag, value in (("--ttft-slo-ms", args.ttft_slo_ms), ("--tpot-slo-ms", args.tpot_slo_ms)):
        if value is not None and value <= 0:
            raise BadInput(f"{flag} must be > 0 (got {value:g})")
    if args.gpus < 0:
        raise BadInput(f"--gpus must be ≥ 0 (got {args.gpus})")
    if args.engine != "external" and args.url:
        raise BadInput("--url is only for --engine external (drop it, or add --engine external)")
    if args.engine == "external" and not args.url:
        raise BadInput("--engine external needs --url URL of the running engine")
    if args.engine == "external" and any(isinstance(t, EngineOverrides) for _, t in args.config):
        raise BadInput(
            f"--config NAME={ENGINE_PREFIX}... restarts the battery's engine; "
            "engine-settings configurations need --engine vllm|sim"
        )
    return names


async def _served(base_url: str) -> tuple[str, int | None]:
    """The served model; an engine that does not answer is bad input (the URL) for an external one."""
    try:
        return await served_model(base_url)
    except (aiohttp.ClientError, TimeoutError, KeyError, IndexError, ValueError) as exc:
        raise BadInput(
            f"no model list at {base_url}/v1/models ({type(exc).__name__}: {exc}); is the engine "
            "running, and is --url right?"
        ) from None


async def _run(args: argparse.Namespace) -> int:
    names = _check_inputs(args)  # before anything is written
    if args.engine == "external":
        await _served(args.url)  # a wrong URL is found before the output folder exists
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)  # noqa: ASYNC240  (once, before any load runs)
    async with AsyncExitStack() as stack:
        engine = await _engine(args, stack, out)
        model, max_len = await _served(engine.base_url)
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
        report = await run_battery(ctx, names, cold_start=args.cold_start, command=shlex.join(sys.argv))
    write_report(report, out)
    for t in report.tests:
        print(
            f"{t.section:>5} {t.title:<36} {t.status:<8} {t.verdict}"
            + (f"  ({t.reason})" if t.reason else "")
        )
    print(f"reports in {out}")
    return 1 if any(t.status == "failed" for t in report.tests) else 0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "list":
        for t in ordered_tests():
            print(f"{t.section:>5}  {t.name:<16} {t.title}")
        return 0
    args.out = args.out or Path("results") / f"battery-{time.strftime('%Y%m%d-%H%M%S')}"
    return run_cli(lambda: asyncio.run(_run(args)), lambda: args.out if args.out.is_dir() else None)
