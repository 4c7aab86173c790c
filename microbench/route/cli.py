"""``python -m microbench.route``: the offload table applied live, against always-colocated and
always-disaggregated, on one seeded bursty workload.

Two engines joined by a KV connector (a prefill worker and a decode worker, each pinned to its own
cores) and a router in front of them (``microbench.route.router``). Every policy replays the same seeded
workload — long-running decode streams plus bursts of cold long prompts — in counterbalanced rounds; the
report compares them (decode ITL/TPOT, cold TTFT, goodput under an SLO, offload fraction, transfer time,
total latency) with the A/B statistics of ``analysis.effects``. The table is an ``analysis.policy`` JSON:
``python -m analysis.policy build results/<sweep run> --link <link>``.

Examples::

    python -m microbench.route --config sweeps/route-cpu.yaml
    python -m microbench.route \\
        --table results/reference-cpu/policy/offload_policy_measured-local-handoff_bulk.json
    python -m microbench.route --policies colocated table --reps 2
    python -m microbench.route --resume --out results/<run>        # replays without a valid record again
    python -m microbench.route --report --out results/<run>        # only re-render the report
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path
from typing import Any

from rich.markup import escape

from benchcore.cli import EXIT_FAILURES, BadInput, Stopped, run_cli
from benchcore.console import console as make_console
from benchcore.flags import add_config, add_out
from benchcore.provenance import new_run_id, package_versions
from engine_harness.flags import add_engine_flags, engine_overrides
from engine_harness.kv_connectors import CONNECTOR_DISTRIBUTIONS, list_connectors
from engine_harness.launch import EngineError
from microbench.measure.engine_pair import PairAborted
from microbench.results.layout import RouteFolder, new_manifest
from microbench.route.config import RouteConfig, RouteConfigError, load_route_config
from microbench.route.decide import POLICIES
from microbench.route.report import write_report
from microbench.route.runner import RouteRunner

__all__ = ["build_parser", "main"]

REPO = Path(__file__).resolve().parents[2]
_KEYS = ("policies", "repetitions", "seed", "table", "connector", "prefill_chunk", "decode_chunk",
         "prefill_cores", "decode_cores", "token_range", "slo_ttft_ms", "slo_tpot_ms")  # fmt: skip


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m microbench.route",
        description=(__doc__ or "").split("\n\n")[0],
        epilog=(__doc__ or "").split("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    a = p.add_argument
    add_config(p, "sweeps/route-cpu.yaml")
    a("--policies", nargs="+", choices=POLICIES, help="policies to compare (default: all three)")
    a("--reps", type=int, dest="repetitions", help="rounds; each replays every policy once (default 3)")
    a("--seed", type=int, help="the workload's shape: times and lengths (default 0)")
    a("--table", type=Path, help="offload table of the table policy (python -m analysis.policy build …)")
    a("--connector", help=f"connector preset: {', '.join(list_connectors())} (default nixl-cpu)")
    a("--prefill-chunk", type=int, help="prefill worker's token budget")
    a("--decode-chunk", type=int, help="decode worker's token budget (the chunk the table is asked at)")
    a("--prefill-cores", help="VLLM_CPU_OMP_THREADS_BIND of the prefill worker (default 0)")
    a("--decode-cores", help="VLLM_CPU_OMP_THREADS_BIND of the decode worker (default 1)")
    a("--token-range", help="LO:HI token ids for prompts (default: read from the model)")
    a("--slo-ttft-ms", type=float, help="goodput SLO on time to first token (default 2000)")
    a("--slo-tpot-ms", type=float, help="goodput SLO on time per output token (default 100)")
    add_engine_flags(
        p, kinds=["vllm", "sim"], default_text="vllm: both workers, the embedded CPU default", reachable=False
    )
    add_out(p, "results/<UTC time>-route-<name>")
    a("--resume", action="store_true", help="continue the run in --out: replays without a valid record again")
    a("--report", action="store_true", help="only (re)write the report of the run in --out")
    return p


def _resolve(args: argparse.Namespace) -> tuple[RouteFolder, RouteConfig, bool]:
    overrides: dict[str, Any] = {k: getattr(args, k) for k in _KEYS}
    overrides["engine"] = {k: v for k, v in engine_overrides(args).items() if v is not None}
    if args.resume or args.report:
        flag = "--resume" if args.resume else "--report"
        if args.out is None:
            raise RouteConfigError(f"{flag} needs --out: the run folder to continue")
        folder = RouteFolder(args.out)
        if not folder.exists():
            raise RouteConfigError(f"{flag}: {folder.root} has no manifest.json (not a route run folder)")
        given = [k for k, v in overrides.items() if k != "engine" and v is not None]
        given += [k for k, v in overrides["engine"].items() if v is not None] + (
            ["--config"] if args.config else []
        )
        if given:
            raise RouteConfigError(f"{flag} continues the stored definition; drop {', '.join(given)}")
        return folder, RouteConfig.model_validate(folder.read_manifest().sweep), True
    cfg = load_route_config(args.config, overrides)
    if cfg.table is not None and not cfg.table.is_file():
        raise RouteConfigError(
            f"offload table {cfg.table} does not exist (python -m analysis.policy build …)"
        )
    folder = RouteFolder(args.out or REPO / "results" / new_run_id(f"route-{cfg.name}"))
    if folder.exists():
        raise RouteConfigError(f"run {folder.root} exists: pass --resume to continue it, or another --out")
    return folder, cfg, False


def _run(args: argparse.Namespace, state: dict[str, Path]) -> int:
    try:
        folder, cfg, resumed = _resolve(args)
    except RouteConfigError as exc:
        raise BadInput(str(exc)) from None
    state["out"] = folder.root
    console = make_console()
    with folder.lock():
        if args.report:
            report = write_report(folder, cfg)
            console.print("\n".join(report.verdict_lines) or "no valid replay stored", soft_wrap=True)
            return 0
        if not resumed:
            engines = {
                "prefill": cfg.prefill_spec().model_dump(mode="json"),
                "decode": cfg.decode_spec().model_dump(mode="json"),
            }
            folder.write_manifest(
                new_manifest(folder, cfg.model_dump(mode="json"), engines, seed=cfg.seed,
                             packages=package_versions(CONNECTOR_DISTRIBUTIONS))
            )  # fmt: skip
        console.print(f"run folder: {folder.root}", soft_wrap=True)
        resume = f"python -m microbench.route --resume --out {folder.root}"
        runner = RouteRunner(folder, cfg, console)
        try:
            asyncio.run(runner.run())
        except (KeyboardInterrupt, Stopped):
            console.print(f"[yellow]stopped; continue with: {escape(resume)}", soft_wrap=True)
            raise
        except (PairAborted, EngineError, OSError) as exc:
            console.print(f"[red]error:[/red] {escape(str(exc))}", soft_wrap=True)
            console.print(f"stored replays are kept; continue with: {escape(resume)}", soft_wrap=True)
            return EXIT_FAILURES
        finally:
            report = write_report(folder, cfg)
            console.print("\n".join(report.verdict_lines), soft_wrap=True)
            console.print(f"report: {folder.root / 'report.html'}", soft_wrap=True)
    return EXIT_FAILURES if runner.failures else 0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    state: dict[str, Path] = {}
    return run_cli(lambda: _run(args, state), lambda: state.get("out"))


if __name__ == "__main__":
    sys.exit(main())
