"""Command line: ``python -m microbench.loadgen run --workload NAME|spec.yaml --url URL ...``.

Runs an optional warm-up, then one stage per rate (or concurrency) given, and writes the trace folder.
Settings flow defaults → flags → the same validated objects the Python API takes.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp

from benchcore.cli import BadInput, run_cli
from benchcore.flags import add_out, duration
from engine_harness.handles import model_cards
from microbench.client import aio
from microbench.client.prompts import TokenSpace
from microbench.client.requests import ApiSettings
from microbench.loadgen.events import JsonlEventWriter
from microbench.loadgen.session import LoadSession
from microbench.loadgen.stages import SessionSettings, Stage, sweep_stages
from microbench.loadgen.trace import write_trace
from microbench.workloads.generator import Workload
from microbench.workloads.prompts import PromptFactory
from microbench.workloads.reference import WORKLOADS, reference_workload
from microbench.workloads.schedulers import SCHEDULERS, parse_scheduler
from microbench.workloads.spec import WorkloadSpec, load_workload_spec

__all__ = ["build_parser", "main"]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m microbench.loadgen", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run a workload against an engine and write its trace")
    run.add_argument("--workload", required=True, help=f"a spec YAML or one of: {', '.join(WORKLOADS)}")
    run.add_argument("--url", required=True, help="engine base URL")
    run.add_argument("--model", help="served model name (default: the engine's first /v1/models entry)")
    run.add_argument("--api", choices=["completions", "chat"], default="completions")
    run.add_argument("--scheduler", default="poisson", choices=SCHEDULERS.names())
    run.add_argument("--rate", type=float, nargs="+", help="requests/s; several values make a sweep")
    run.add_argument("--concurrency", type=int, nargs="+", help="closed-loop in-flight requests; a sweep")
    run.add_argument("--cv", type=float, help="gap coefficient of variation (gamma, weibull)")
    run.add_argument("--trace-file", help="timestamps to replay (scheduler trace)")
    run.add_argument("--seed", type=int, default=0, help="arrival seed")
    run.add_argument("--requests", type=int, help="first-round requests per stage")
    run.add_argument("--duration", type=duration, help="issuing time per stage, e.g. 30s")
    run.add_argument("--warmup-requests", type=int, default=0, help="warm-up requests (closed loop, 4)")
    run.add_argument("--token-range", default="0:256", help="token ids LO:HI prompts are drawn from")
    run.add_argument("--max-model-len", type=int, help="engine's context limit: longer requests are clipped")
    run.add_argument(
        "--drain-timeout", type=duration, default=60.0, help="in-flight drain limit (default 60s)"
    )
    run.add_argument("--events", action="store_true", help="also write events.jsonl")
    add_out(run, "results/load-<UTC time>")
    return parser


def _workload_spec(name: str, max_model_len: int | None) -> WorkloadSpec:
    if name in WORKLOADS:
        return reference_workload(name, max_model_len=max_model_len)
    return load_workload_spec(name)


async def _first_model(url: str) -> str:
    try:
        async with aiohttp.ClientSession() as http:
            return str((await model_cards(http, url))[0]["id"])
    except (aiohttp.ClientError, TimeoutError, KeyError, IndexError, ValueError) as exc:
        raise BadInput(
            f"no model list at {url}/v1/models ({exc}); is the engine running? (or pass --model)"
        ) from None


def _check(args: argparse.Namespace) -> None:
    """Bad numbers are bad input, before anything is sent."""
    for flag, values in (("--rate", args.rate), ("--concurrency", args.concurrency)):
        if values and any(v <= 0 for v in values):
            raise BadInput(f"{flag} must be > 0 (got {' '.join(str(v) for v in values)})")
    for flag, value in (("--requests", args.requests), ("--warmup-requests", args.warmup_requests)):
        if value is not None and value < (1 if flag == "--requests" else 0):
            raise BadInput(f"{flag} must be ≥ {1 if flag == '--requests' else 0} (got {value})")


async def _run(args: argparse.Namespace) -> dict[str, Any]:
    _check(args)
    try:
        spec = _workload_spec(args.workload, args.max_model_len)
        space = TokenSpace.parse(args.token_range)
    except ValueError as exc:
        raise BadInput(str(exc)) from None
    prompts = PromptFactory(space)
    workload = Workload(spec, prompts, max_model_len=args.max_model_len)
    model = args.model or await _first_model(args.url)
    params: dict[str, Any] = {"kind": args.scheduler, "seed": args.seed}
    params.update({k: v for k, v in (("cv", args.cv), ("path", args.trace_file)) if v is not None})
    loads: list[float] = list(args.concurrency or args.rate or [])
    axis = SCHEDULERS.get(args.scheduler).sweep_axis
    if axis is not None:
        if not loads:
            raise BadInput(f"scheduler {args.scheduler!r} needs --{axis}")
        params[axis] = loads[0]
    requests = workload.requests()
    stages: list[Stage] = []
    if args.warmup_requests:
        warm = parse_scheduler({"kind": "concurrency", "concurrency": 4})
        stages.append(
            Stage.scheduled("warmup", warm, requests, max_requests=args.warmup_requests, warmup=True)
        )
    scheduler = parse_scheduler(params)
    limits = {"max_requests": args.requests, "duration_s": args.duration}
    if axis is not None:
        stages += sweep_stages(scheduler, loads, requests, **limits)
    else:
        stages.append(Stage.scheduled(scheduler.kind, scheduler, requests, **limits))
    settings = SessionSettings(
        base_url=args.url, api=ApiSettings(model=model, api=args.api), drain_timeout_s=args.drain_timeout
    )
    args.out.mkdir(parents=True, exist_ok=True)
    writer = JsonlEventWriter(args.out / "events.jsonl") if args.events else None
    try:
        async with LoadSession(settings, hooks=[writer] if writer else []) as session:
            result = await session.run(stages)
    finally:
        if writer:
            writer.close()
    header = write_trace(
        args.out,
        result,
        workload={"name": spec.name, "spec": spec.model_dump(mode="json"), "notes": spec.notes,
                  "clipped_requests": workload.clipped},
        seed=spec.seed,
        prompts={"token_space": [space.lo, space.hi], "salt": str(prompts.salt), "form": "token ids"},
        engine={"base_url": args.url, "model": model, "api": args.api, "max_model_len": args.max_model_len},
    )  # fmt: skip
    return header.model_dump(include={"stages", "saturated", "warnings"})


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    args.out = args.out or Path("results") / f"load-{time.strftime('%Y%m%d-%H%M%S')}"
    return run_cli(lambda: _report(aio.run(_run(args))), lambda: args.out)


def _report(summary: dict[str, Any]) -> int:
    json.dump(summary, sys.stdout, indent=2)
    sys.stdout.write("\n")
    problems = list(summary.get("warnings", []))
    for stage in summary.get("stages", []):
        counts = stage.get("status_counts", {})
        bad = sum(n for status, n in counts.items() if status != "ok")
        if bad:
            problems.append(
                f"stage {stage['name']}: {bad} of {sum(counts.values())} requests did not complete "
                f"({', '.join(f'{k} {v}' for k, v in sorted(counts.items()) if k != 'ok')})"
            )
    for w in problems:
        print(f"warning: {w}", file=sys.stderr)
    return 1 if problems else 0
