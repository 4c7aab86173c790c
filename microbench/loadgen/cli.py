"""Command line: ``python -m microbench.loadgen run --workload NAME|spec.yaml --url URL ...``.

Runs an optional warm-up, then one stage per rate (or concurrency) given, and writes the trace folder.
Settings flow defaults → flags → the same validated objects the Python API takes.

A spec that times its own arrivals (``aggregate_rate``, a client's non-Poisson ``arrival``, ``windows``;
``WorkloadSpec.timing_fields``) runs self-timed: every client on its own process at its share of the
aggregate rate (``--rate`` values sweep that rate), for ``--duration`` (default: its last window's end).
A flag that would override those fields (``--concurrency``, ``--scheduler``, ``--cv``, ``--trace-file``)
is refused, naming them. ``--api chat`` sends text prompts of exact token counts (``--tokenizer``);
``--salt`` with the header's salt repeats a run's prompts exactly. ``--workers N`` sends from N processes
(``microbench.loadgen.workers``): one schedule, merged trace, each worker's schedule delay in the summary.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from benchcore.cli import BadInput, run_cli
from benchcore.flags import add_out, duration
from engine_harness.handles import checked_endpoint
from microbench.client import aio
from microbench.client.prompts import TokenSpace
from microbench.client.requests import ApiSettings, RequestSpec
from microbench.loadgen.events import JsonlEventWriter
from microbench.loadgen.metrics_series import MetricsSampler, series_frame, series_header
from microbench.loadgen.stages import SessionSettings, Stage, sweep_stages
from microbench.loadgen.trace import write_trace
from microbench.loadgen.workers import run_sessions, worker_delays
from microbench.results.layout import hold_folder
from microbench.workloads.generator import Workload
from microbench.workloads.prompts import prompt_source
from microbench.workloads.reference import WORKLOADS, load_workload
from microbench.workloads.schedulers import SCHEDULERS, parse_scheduler
from microbench.workloads.spec import WorkloadSpec

__all__ = ["build_parser", "main"]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m microbench.loadgen", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run a workload against an engine and write its trace")
    run.add_argument("--workload", required=True, help=f"a spec YAML or one of: {', '.join(WORKLOADS)}")
    run.add_argument("--url", required=True, help="engine base URL")
    run.add_argument("--model", help="served model name (default: the engine's first /v1/models entry)")
    run.add_argument("--api", choices=["completions", "chat"], default="completions")
    run.add_argument("--api-key-env", metavar="VAR", help="environment variable holding the bearer key")
    run.add_argument("--tokenizer", help="tokenizer.json or model folder for text prompts (chat)")
    run.add_argument("--scheduler", choices=SCHEDULERS.names(), help="arrival process (default: poisson)")
    run.add_argument("--rate", type=float, nargs="+", help="requests/s; several values make a sweep")
    run.add_argument("--concurrency", type=int, nargs="+", help="closed-loop in-flight requests; a sweep")
    run.add_argument("--cv", type=float, help="gap coefficient of variation (gamma, weibull)")
    run.add_argument("--trace-file", help="timestamps to replay (scheduler trace)")
    run.add_argument("--seed", type=int, default=0, help="arrival seed")
    run.add_argument("--requests", type=int, help="first-round requests per stage")
    run.add_argument("--duration", type=duration, help="issuing time per stage, e.g. 30s")
    run.add_argument("--warmup-requests", type=int, default=0, help="warm-up requests (closed loop, 4)")
    run.add_argument("--sharegpt", metavar="FILE", help="ShareGPT JSON for the conversation workload (A.3)")
    run.add_argument("--salt", type=int, help="prompt salt of an earlier run (its header): same prompts")
    run.add_argument("--token-range", help="token ids LO:HI prompts are drawn from (default: the model's)")
    run.add_argument("--max-model-len", type=int, help="engine's context limit: longer requests are clipped")
    run.add_argument(
        "--drain-timeout", type=duration, default=60.0, help="in-flight drain limit (default 60s)"
    )
    run.add_argument(
        "--warm-connections", type=int, default=0, metavar="K",
        help="open K connections before each stage (per worker), so a burst of late sends reuses them "
        "instead of connecting (default 0)",
    )  # fmt: skip
    run.add_argument("--events", action="store_true", help="also write events.jsonl")
    run.add_argument(
        "--workers", type=int, default=1,
        help="load-generation processes, each its own event loop and connections, sharing one seeded "
        "schedule (past one core's rate; 1: this process)",
    )  # fmt: skip
    add_out(run, "results/load-<UTC time>")
    return parser


def _check(args: argparse.Namespace) -> None:
    """Bad numbers are bad input, before anything is sent."""
    for flag, values in (("--rate", args.rate), ("--concurrency", args.concurrency)):
        if values and any(v <= 0 for v in values):
            raise BadInput(f"{flag} must be > 0 (got {' '.join(str(v) for v in values)})")
    for flag, value in (("--requests", args.requests), ("--warmup-requests", args.warmup_requests)):
        if value is not None and value < (1 if flag == "--requests" else 0):
            raise BadInput(f"{flag} must be ≥ {1 if flag == '--requests' else 0} (got {value})")
    if args.cv is not None and not args.cv > 0:
        raise BadInput(f"--cv must be > 0 (got {args.cv})")
    if args.workers < 1:
        raise BadInput(f"--workers must be ≥ 1 (got {args.workers})")
    if not 0 <= args.warm_connections <= 10_000:
        raise BadInput(f"--warm-connections must be 0-10000 (got {args.warm_connections})")
    if args.workers > 1 and args.events:
        raise BadInput("--events needs one process: drop --events or use --workers 1")


def _spec(args: argparse.Namespace) -> tuple[WorkloadSpec, TokenSpace | None]:
    """The workload and token range, checked before the engine is asked anything (bad input is named
    as such, not as an engine that does not answer)."""
    try:
        spec = load_workload(args.workload, max_model_len=args.max_model_len, sharegpt_path=args.sharegpt)
        return spec, TokenSpace.parse(args.token_range) if args.token_range else None
    except ValueError as exc:
        raise BadInput(str(exc)) from None


def _prompts(
    args: argparse.Namespace, model: str, spec: WorkloadSpec, space: TokenSpace | None
) -> tuple[Workload, dict[str, Any]]:
    try:
        factory, text, disclosure = prompt_source(
            args.api, model, tokenizer=args.tokenizer, space=space, salt=args.salt
        )
    except ValueError as exc:
        raise BadInput(str(exc)) from None
    return Workload(spec, factory, text=text, max_model_len=args.max_model_len), disclosure


def _self_timed_stages(args: argparse.Namespace, workload: Workload, fields: list[str]) -> list[Stage]:
    """One stage per aggregate rate, each client on its own arrival process inside its windows."""
    spec = workload.spec
    named = ", ".join(fields)
    for flag, value in (("--concurrency", args.concurrency), ("--scheduler", args.scheduler),
                        ("--cv", args.cv), ("--trace-file", args.trace_file)):  # fmt: skip
        if value is not None:
            raise BadInput(
                f"workload {spec.name!r} times its own arrivals ({named}): {flag} would override them"
            )
    rates = list(args.rate or ([spec.aggregate_rate] if spec.aggregate_rate else []))
    if not rates:
        raise BadInput(
            f"workload {spec.name!r} times its own arrivals ({named}): give --rate (aggregate req/s)"
        )
    ends = [w.end_s for c in spec.clients for w in c.windows]
    duration_s = args.duration or (max(ends) if ends else None)
    if duration_s is None:
        raise BadInput(f"workload {spec.name!r} times its own arrivals ({named}): give --duration")
    return [
        Stage(f"spec-rate-{rate:g}", workload.plan(duration_s, rate), max_requests=args.requests,
              duration_s=duration_s, requested_rate=rate,
              description={"kind": "spec", "aggregate_rate": rate, "timing_fields": fields})
        for rate in rates
    ]  # fmt: skip


def _scheduled_stages(args: argparse.Namespace, requests: Iterator[RequestSpec]) -> list[Stage]:
    kind = args.scheduler or "poisson"
    params: dict[str, Any] = {"kind": kind, "seed": args.seed}
    params.update({k: v for k, v in (("cv", args.cv), ("path", args.trace_file)) if v is not None})
    loads: list[float] = list(args.concurrency or args.rate or [])
    axis = SCHEDULERS.get(kind).sweep_axis
    if axis is not None:
        if not loads:
            raise BadInput(f"scheduler {kind!r} needs --{axis}")
        params[axis] = loads[0]
    try:
        scheduler = parse_scheduler(params)
    except ValueError as exc:  # a bad --cv, a missing or unreadable --trace-file: named by the scheduler
        raise BadInput(f"--scheduler {kind}: {exc}") from None
    if args.requests is None and args.duration is None:
        raise BadInput("a stage needs an end: give --requests N, --duration T or both")
    limits = {"max_requests": args.requests, "duration_s": args.duration}
    if axis is not None:
        return sweep_stages(scheduler, loads, requests, **limits)
    return [Stage.scheduled(scheduler.kind, scheduler, requests, **limits)]


async def _run(args: argparse.Namespace, held: ExitStack) -> dict[str, Any]:
    _check(args)
    if args.api_key_env and args.api_key_env not in os.environ:
        raise BadInput(
            f"--api-key-env {args.api_key_env}: that variable is not set; export it before the run"
        )
    spec, space = _spec(args)
    if args.model:  # no model list needed, but whatever answers must be an OpenAI server (or not up yet)
        await checked_endpoint(args.url, args.api_key_env, may_be_starting=True, model_named=True)
        model = args.model
    else:
        model = (await checked_endpoint(args.url, args.api_key_env))[0]
    workload, prompt_disclosure = _prompts(args, model, spec, space)
    requests = workload.requests()
    stages: list[Stage] = []
    if args.warmup_requests:
        warm = parse_scheduler({"kind": "concurrency", "concurrency": 4})
        stages.append(
            Stage.scheduled("warmup", warm, requests, max_requests=args.warmup_requests, warmup=True)
        )
    fields = spec.timing_fields()
    stages += _self_timed_stages(args, workload, fields) if fields else _scheduled_stages(args, requests)
    settings = SessionSettings(
        base_url=args.url,
        api=ApiSettings(model=model, api=args.api),
        drain_timeout_s=args.drain_timeout,
        api_key_env=args.api_key_env,
        warm_connections=args.warm_connections,
    )
    held.enter_context(hold_folder(args.out))  # one writer per folder, taken once the inputs are checked
    writer = JsonlEventWriter(args.out / "events.jsonl") if args.events else None
    sampler = MetricsSampler(args.url)  # the engine's /metrics beside the trace (names: what it serves)
    try:
        async with sampler:
            result = await run_sessions(settings, stages, args.workers, hooks=[writer] if writer else [])
    finally:
        if writer:
            writer.close()
    series = series_frame(sampler.samples, result.t0_ns)
    header = write_trace(
        args.out,
        result,
        workload={"name": spec.name, "spec": spec.model_dump(mode="json"), "notes": spec.notes,
                  "clipped_requests": sum(r.spec.clipped for r in result.records), "arrival_seed": args.seed,
                  "self_timed": fields},
        seed=spec.seed,
        prompts=prompt_disclosure,
        engine={"base_url": args.url, "model": model, "api": args.api, "max_model_len": args.max_model_len},
        metrics=(series, series_header(sampler, series)),
    )  # fmt: skip
    summary = header.model_dump(include={"stages", "saturated", "warnings"})
    if args.workers > 1:  # which worker kept its schedule: the merged delays hide a lagging one
        summary["worker_schedule_delay"] = worker_delays(result)
    return summary


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    args.out = args.out or Path("results") / f"load-{time.strftime('%Y%m%d-%H%M%S')}"

    def body() -> int:
        with ExitStack() as held:
            return _report(aio.run(_run(args, held)))

    return run_cli(body, lambda: args.out)


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
