"""Command line: ``python -m microbench.battery run --engine sim|vllm|external [--url URL] --tests ttft itl
--workload NAME --profile conformant|quick --out DIR`` and ``python -m microbench.battery list``.

The suite's flag vocabulary (``benchcore.flags``): ``--engine KIND`` with the engine flags of
``engine_harness.flags`` (``--engine-args "…"`` reaches the launched engine, e.g. the sim's step model),
``--config FILE`` a battery definition (YAML, the run flags' names as keys; flags override it), ``--out DIR``
the folder this run writes, ``--arm NAME=…`` a configuration 5.10 compares, lists space-separated,
SLOs as durations (``--ttft-slo 500ms``). ``--engine sim`` and ``vllm`` launch the engine (restartable,
so 5.7 can turn prefix caching off and 5.10 can compare engine settings); ``external`` only reaches
``--url``. A plan prints before the tests and a progress line with ETA after each; ``--resume``
continues a stopped run in ``--out`` (or the newest battery run under results/). Exit status (benchcore.cli):
0 every selected test ran or was skipped with a reason; 1 a test failed or the report's consistency gate
failed; 2 bad input.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shlex
import sys
import time
from contextlib import AsyncExitStack, ExitStack
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, ValidationError

from benchcore.cli import BadInput, Failed, run_cli
from benchcore.flags import add_out, duration_ms
from benchcore.layered_config import read_yaml
from benchcore.schema import StrictModel
from engine_harness.engines import DEFAULT_PRESET, engine_kind, resolve_spec
from engine_harness.flags import add_engine_flags, engine_overrides
from engine_harness.handles import (
    ENGINE_PREFIX,
    EngineHandle,
    EngineOverrides,
    ExternalEngine,
    LaunchedEngine,
    checked_endpoint,
    parse_arm,
)
from engine_harness.launch import EngineError, EngineProcess
from microbench.battery.compare import add_compare_parser, run_compare
from microbench.battery.context import BatteryContext
from microbench.battery.disclosures import SUT_BOUNDARIES
from microbench.battery.profiles import PROFILES, profile
from microbench.battery.requirement_table import link_tests, markdown_table, scan
from microbench.battery.warmup import warm_up
from microbench.results.layout import hold_folder
from microbench.workloads.prompts import prompt_source
from microbench.workloads.reference import WORKLOADS, load_workload
from microbench.workloads.spec import WorkloadSpecError

__all__ = ["BatteryConfig", "build_parser", "main"]

ARM_HELP = (
    "a configuration for 5.10 (repeat; the first is the baseline): NAME=URL, an endpoint, or "
    f"NAME={ENGINE_PREFIX}[KEY=VALUE,...], the battery's engine (--engine vllm|sim) restarted with "
    f"those EngineSpec fields changed ('{ENGINE_PREFIX}' alone: as launched), e.g. "
    f"--arm bare={ENGINE_PREFIX} --arm small-batch={ENGINE_PREFIX}max_num_seqs=4"
)
RESULTS = Path("results")


class BatteryConfig(StrictModel):
    """A battery definition file (``--config``): the run flags by name; a flag given overrides its key."""

    tests: list[str] | None = None
    workload: str = "synthetic-uniform"
    profile: str = "conformant"
    seed: int = 0
    cold_start: bool = False
    arms: dict[str, str] = Field(default_factory=dict, description="NAME: URL or engine:KEY=VALUE,...")
    ttft_slo: str | None = Field(default=None, description="a duration, e.g. 500ms")
    tpot_slo: str | None = None
    gpus: int = Field(default=0, ge=0)
    api: Literal["completions", "chat"] = "completions"
    tokenizer: str | None = None
    salt: int | None = None
    sharegpt: str | None = None
    sut_boundary: str | None = None
    guardrails: str | None = None


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m microbench.battery", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("list", help="list the battery's tests")
    sub.add_parser("requirements", help="print the requirement table (README), read off the code and tests")
    run = sub.add_parser("run", help="run the battery against an engine and write its reports")
    add_engine_flags(run, default_text="sim")
    run.add_argument(
        "--config", type=Path, metavar="FILE", help="battery definition (YAML); flags override it"
    )
    run.add_argument("--tests", nargs="+", metavar="NAME", help="test names (default: all)")
    run.add_argument(
        "--workload", help=f"spec YAML or one of {', '.join(WORKLOADS)} (default synthetic-uniform)"
    )
    run.add_argument("--profile", choices=list(PROFILES), help="counts and durations (default conformant)")
    run.add_argument("--seed", type=int)
    run.add_argument(
        "--plan-only",
        action="store_true",
        help="start the engine, warm up, probe briefly, print the plan with its estimated time, and stop",
    )
    run.add_argument("--cold-start", action="store_true", default=None, help="skip warm-up, declared (4.5.3)")
    run.add_argument(
        "--arm",
        type=parse_arm,
        action="append",
        metavar=f"NAME=URL|NAME={ENGINE_PREFIX}KEY=VALUE,...",
        help=ARM_HELP,
    )
    run.add_argument(
        "--ttft-slo", type=duration_ms, help="TTFT P99 SLO, e.g. 500ms (5.2 search, 5.3 optimum)"
    )
    run.add_argument("--tpot-slo", type=duration_ms, help="TPOT P99 SLO, e.g. 50ms (5.2 search)")
    run.add_argument("--gpus", type=int, help="accelerator count of the SUT (default 0: CPU only)")
    run.add_argument("--api", choices=["completions", "chat"], help="endpoint family (default completions)")
    run.add_argument("--tokenizer", help="tokenizer.json or model folder (chat's text prompts; 4.4.1)")
    run.add_argument("--sharegpt", metavar="FILE", help="ShareGPT JSON for the conversation workload (A.3)")
    run.add_argument("--salt", type=int, help="prompt salt of an earlier run (its report): same prompts")
    run.add_argument(
        "--sut-boundary", help=f"what the URL reaches: {' | '.join(SUT_BOUNDARIES)} (external engines)"
    )
    run.add_argument("--guardrails", help="filtering in front of the engine, e.g. 'none' or 'Llama Guard 3'")
    run.add_argument(
        "--resume", action="store_true", help="continue the stopped run in --out (or the newest)"
    )
    run.add_argument(
        "--workers", type=int, default=1,
        help="load-generation processes sharing each run's schedule (past one core's rate; default 1)",
    )  # fmt: skip
    add_out(run, "results/battery-<time>")
    add_compare_parser(sub)
    return parser


def _settings(args: argparse.Namespace) -> dict[str, Any]:
    """Defaults → ``--config`` file → flags, validated once."""
    base: dict[str, Any] = {}
    if args.config is not None:
        base = read_yaml(args.config, "--config", BadInput) or {}  # unreadable, not UTF-8, not YAML: named
    try:
        config = BatteryConfig.model_validate(base)
    except ValidationError as exc:
        raise BadInput(f"--config {args.config}: {exc}") from None
    arms = [(n, parse_arm(f"{n}={v}")[1]) for n, v in config.arms.items()] if args.arm is None else args.arm
    slo = {
        k: duration_ms(v) if v else None for k, v in (("ttft", config.ttft_slo), ("tpot", config.tpot_slo))
    }
    given = {k: v for k, v in vars(args).items() if v is not None}
    return {
        "tests": given.get("tests", config.tests),
        "workload": given.get("workload", config.workload),
        "profile": given.get("profile", config.profile),
        "seed": given.get("seed", config.seed),
        "cold_start": given.get("cold_start", config.cold_start),
        "arms": arms,
        "ttft_slo_ms": given.get("ttft_slo", slo["ttft"]),
        "tpot_slo_ms": given.get("tpot_slo", slo["tpot"]),
        "gpus": given.get("gpus", config.gpus),
        **{
            k: given.get(k, getattr(config, k))
            for k in ("api", "tokenizer", "salt", "sharegpt", "sut_boundary", "guardrails")
        },
    }


def _out(args: argparse.Namespace) -> Path:
    """The run folder: ``--out``, the newest battery run with ``--resume``, or a new timestamped one."""
    if args.out is None and args.resume:
        runs = sorted(p.parent for p in RESULTS.glob("battery-*/state/context.json"))
        if not runs:
            raise BadInput("--resume: no stopped battery run under results/; name it with --out")
        return runs[-1]
    out: Path = args.out or RESULTS / f"battery-{time.strftime('%Y%m%d-%H%M%S')}"
    stopped = (out / "state" / "context.json").is_file()
    if stopped and not args.resume:
        raise BadInput(
            f"{out} holds a stopped battery run: add --resume to continue it, or pick another --out"
        )
    if args.resume and not stopped:
        raise BadInput(f"--resume: {out} holds no stopped battery run")
    return out


async def _engine(
    args: argparse.Namespace, arms: list[Any], stack: AsyncExitStack, out: Path
) -> EngineHandle:
    kind = args.engine or "sim"
    if not engine_kind(kind).launched:
        if not args.url:
            raise BadInput("--engine external needs --url")
        if any(isinstance(target, EngineOverrides) for _, target in arms):
            raise BadInput(
                f"--arm NAME={ENGINE_PREFIX}... restarts the battery's engine; "
                "engine-settings configurations need --engine vllm|sim"
            )
        return await ExternalEngine.reached(args.url, api_key_env=args.api_key_env)
    if args.url:
        raise BadInput("--url is only for --engine external")
    overrides = {**engine_overrides(args), "kind": kind}
    overrides["model"] = overrides["model"] or engine_kind(kind).default_model
    try:
        spec = resolve_spec(overrides.pop("preset") or DEFAULT_PRESET, **overrides)
    except ValueError as exc:
        raise BadInput(str(exc)) from None
    process = await stack.enter_async_context(EngineProcess(spec, out / f"engine-{kind}.log"))
    return LaunchedEngine(process)


def _check_inputs(args: argparse.Namespace, s: dict[str, Any]) -> None:
    """Bad input (exit 2) is found before anything is written or started: the workload, the SLOs, the
    accelerator count, the engine flags."""
    try:
        fields = load_workload(s["workload"], sharegpt_path=s["sharegpt"]).timing_fields()
    except (WorkloadSpecError, OSError, ValueError) as exc:
        raise BadInput(f"--workload: {exc}") from None
    if fields:
        raise BadInput(
            f"--workload {s['workload']}: the battery sets every test's load itself, so the spec's "
            f"{', '.join(fields)} would be ignored; remove them (or run the spec with "
            "python -m microbench.loadgen, which honours them)"
        )
    if s["sut_boundary"] is not None and s["sut_boundary"] not in SUT_BOUNDARIES:
        raise BadInput(
            f"--sut-boundary must be one of {', '.join(SUT_BOUNDARIES)} (got {s['sut_boundary']!r})"
        )
    for flag, value in (("--ttft-slo", s["ttft_slo_ms"]), ("--tpot-slo", s["tpot_slo_ms"])):
        if value is not None and value <= 0:
            raise BadInput(f"{flag} must be > 0 (got {value:g} ms)")
    if args.workers < 1:
        raise BadInput(f"--workers must be ≥ 1 (got {args.workers})")
    if s["gpus"] < 0:
        raise BadInput(f"--gpus must be ≥ 0 (got {s['gpus']})")
    engine_overrides(args)  # e.g. an --api-key-env naming an unset variable
    if args.engine == "external" and not args.url:
        raise BadInput("--engine external needs --url URL of the running engine")
    if args.engine != "external" and args.url:
        raise BadInput("--url is only for --engine external (drop it, or add --engine external)")
    if args.engine == "external" and any(isinstance(target, EngineOverrides) for _, target in s["arms"]):
        raise BadInput(
            f"--arm NAME={ENGINE_PREFIX}... restarts the battery's engine; "
            "engine-settings configurations need --engine vllm|sim"
        )


async def _run(args: argparse.Namespace, out: Path, held: ExitStack) -> int:
    from microbench.battery.render import gate_lines
    from microbench.battery.runner import ordered_tests, plan_battery, run_battery, write_report

    s = _settings(args)
    names = s["tests"]
    try:
        ordered_tests(names)  # unknown names fail before an engine starts
        chosen = profile(s["profile"])
    except (KeyError, ValueError) as exc:
        raise BadInput(f"--tests/--profile: {exc.args[0]}") from None
    _check_inputs(args, s)
    if args.engine == "external":
        await checked_endpoint(args.url, args.api_key_env)  # a wrong URL: found before --out exists
    held.enter_context(hold_folder(out))  # one writer per folder, taken once the inputs are checked
    async with AsyncExitStack() as stack:
        engine = await _engine(args, s["arms"], stack, out)
        model, max_len = await checked_endpoint(engine.base_url, engine.api_key_env)
        try:
            prompts, text, disclosure = prompt_source(
                s["api"], model, tokenizer=s["tokenizer"], salt=s["salt"]
            )
        except ValueError as exc:
            raise BadInput(str(exc)) from None
        ctx = BatteryContext(
            engine=engine,
            model=model,
            profile=chosen,
            workload_name=s["workload"],
            seed=s["seed"],
            out_dir=out,
            max_model_len=max_len,
            guardrail_configs=dict(s["arms"]),
            ttft_slo_ms=s["ttft_slo_ms"],
            tpot_slo_ms=s["tpot_slo_ms"],
            accelerators=s["gpus"],
            cpu_count=os.cpu_count() or 1,
            emit=_emit,
            prompts=prompts,
            text=text,
            api_kind=s["api"],
            prompt_disclosure=disclosure,
            sut_boundary=s["sut_boundary"],
            guardrails=s["guardrails"],
            sharegpt_path=s["sharegpt"],
            workers=args.workers,
        )
        if args.plan_only:
            await warm_up(ctx, cold_start=s["cold_start"])
            rows = await plan_battery(ctx, ordered_tests(names), _emit)
            (out / "plan.json").write_text(json.dumps([r.model_dump() for r in rows], indent=1) + "\n")
            print(f"plan only: nothing else ran; plan in {out / 'plan.json'}")
            return 0
        report = await run_battery(
            ctx, names, cold_start=s["cold_start"], command=shlex.join(sys.argv), emit=_emit
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
    # imported after the parse: the tests and their figures pull in matplotlib (≈ 1 s), which --help or
    # a refused flag never needs
    from microbench.battery.runner import REPO, ordered_tests

    if args.command == "requirements":
        print(markdown_table(link_tests(scan(), REPO / "tests")), end="")
        return 0
    if args.command == "compare":
        return run_cli(lambda: run_compare(args), lambda: args.out)
    if args.command == "list":
        for t in ordered_tests():
            print(f"{t.section:>5}  {t.name:<16} {t.title}")
        return 0
    where: list[Path] = []

    def body() -> int:
        where.append(_out(args))
        try:
            with ExitStack() as held:
                return asyncio.run(_run(args, where[0], held))
        except EngineError as exc:  # an engine that would not start or died: finished tests are kept
            kept = (where[0] / "state" / "context.json").is_file()
            hint = f"; finished tests are kept: continue with --resume --out {where[0]}" if kept else ""
            raise Failed(f"{exc}{hint}") from None

    return run_cli(body, lambda: where[0] if where else None)
