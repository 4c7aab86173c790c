"""``python -m microbench.characterize``: seed 001's characterization of one engine configuration.

(1) The batch-budget search: the largest max-num-batched-tokens (or max-num-seqs) whose worst-case
batches all pass, each candidate started for real; (2) the concurrency sweep, 1, 2, 4 … N closed-loop
users, of the configurations named (the found setting, the default, others); (3) the dataset rows, in the
run folder's rows.parquet and, with --dataset, appended to a table shared across runs. Read them with
``python -m analysis.characterize``. The search and each swept configuration are shards (one engine
configuration each): ``--executor ray`` runs the configurations side by side, each on a device of its own
(docs/ray.md).

Examples::

    python -m microbench.characterize --config sweeps/characterize/sim-memory.yaml
    python -m microbench.characterize --engine sim --search budget --range 256:65536 --max-num-seqs 4 \\
        --context 1024 --engine-args '--memory-tokens 40000 --max-model-len 1024' --no-sweep
    python -m microbench.characterize --config sweeps/characterize/cpu-small-kv.yaml \\
        --dataset results/characterization.parquet
    python -m microbench.characterize --resume --out results/<run-id>
    python -m microbench.characterize --config sweeps/characterize/sim-memory.yaml --configs found,default \
        --executor ray  # the two configurations at once
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path
from typing import Any

from rich.console import Console

from benchcore.cli import EXIT_FAILURES, BadInput, run_cli
from benchcore.flags import add_config, add_out, duration
from benchcore.layered_config import read_yaml
from benchcore.provenance import new_run_id
from benchcore.redact import redact_argv
from engine_harness.flags import add_engine_flags, engine_overrides
from engine_harness.launch import EngineError, model_problem
from microbench.characterize.budget import BudgetSearch
from microbench.characterize.config import CharacterizeConfig, CharacterizeConfigError, load_characterization
from microbench.characterize.runner import CharacterizeRunner
from microbench.characterize.shards import search_job, sweep_job
from microbench.executors import Executor, add_executor_flags, executor_from_args
from microbench.measure.engine_lifecycle import SweepAborted
from microbench.measure.timing import Timing
from microbench.results.layout import CharacterizeFolder, new_manifest

__all__ = ["build_parser", "main"]

RESULTS = Path("results")


def _range(text: str) -> tuple[int, int]:
    lo, sep, hi = text.partition(":")
    try:
        out = (int(lo), int(hi))
    except ValueError:
        out = (0, 0)
    if not sep or out[0] < 1 or out[1] < out[0]:
        raise argparse.ArgumentTypeError(
            f"--range {text!r}: want MIN:MAX with 1 <= MIN <= MAX, e.g. 256:65536"
        )
    return out


def _users(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        values = []
    if not values or sorted(set(values)) != values or values[0] < 1:
        raise argparse.ArgumentTypeError(f"--users {text!r}: rising counts from 1, e.g. 1,2,4,8,16,32")
    return values


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m microbench.characterize",
        description=__doc__,
        epilog="Exit codes: 0 done, 1 no setting passed or an engine failed while measuring, 2 bad input "
        "(an engine that refuses every setting tried included), 130/143 stopped.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_config(p, "sweeps/characterize/sim-memory.yaml")
    add_engine_flags(p)
    s = p.add_argument_group("batch-budget search")
    s.add_argument("--search", choices=["budget", "seqs"], help="the setting searched (default budget)")
    s.add_argument("--no-search", action="store_true", help="skip the search (sweep 'default' then)")
    s.add_argument("--range", type=_range, metavar="MIN:MAX", help="the searched setting's range")
    s.add_argument("--initial", type=int, help="first value probed (default MIN)")
    s.add_argument("--max-num-seqs", type=int, help="held max-num-seqs of a budget search")
    s.add_argument("--budget", type=int, help="held max-num-batched-tokens of a seqs search")
    s.add_argument("--context", type=int, help="longest request, prompt + output (default max_model_len)")
    s.add_argument("--preemption-limit", type=int, help="preemptions a batch may cause (default 0)")
    s.add_argument("--probe-ttft-ms", type=float, help="SLO: TTFT of the max-length prompt")
    s.add_argument("--probe-itl-ms", type=float, help="SLO: ITL P99 of the decode batch at max context")
    w = p.add_argument_group("users sweep")
    w.add_argument("--no-sweep", action="store_true", help="only the search")
    w.add_argument("--users", type=_users, metavar="N,N,…", help="levels (default 1,2,4,…,128)")
    w.add_argument(
        "--configs", metavar="NAME,…", help="configurations to sweep: found, default, … (default found)"
    )
    w.add_argument(
        "--level-duration", type=duration, metavar="DURATION", help="a level's minimum (default 30s)"
    )
    w.add_argument("--max-level-duration", type=duration, metavar="DURATION", help="a level's maximum (120s)")
    w.add_argument(
        "--workload", help="reference workload name or client-mix YAML (default synthetic-uniform)"
    )
    w.add_argument(
        "--joint-lengths", type=Path, metavar="FILE", help="CSV/Parquet of observed (input, output) pairs"
    )
    p.add_argument(
        "--dataset", type=Path, metavar="FILE", help="also append the rows to this shared Parquet table"
    )
    p.add_argument("--start-timeout", type=duration, metavar="DURATION", help="engine start-up limit")
    add_executor_flags(p.add_argument_group("executor (DESIGN §7, docs/ray.md)"))
    add_out(p, "results/<UTC time>-<name>")
    p.add_argument("--resume", action="store_true", help="continue the run in --out")
    return p


def _overrides(args: argparse.Namespace) -> dict[str, Any]:
    search: dict[str, Any] = {}
    if args.search:
        search["dimension"] = args.search
    if args.no_search:
        search["enabled"] = False
    if args.range:
        search["minimum"], search["maximum"] = args.range
    held = args.max_num_seqs if (args.search or "budget") == "budget" else args.budget
    for key, value in (
        ("initial", args.initial),
        ("fixed", held),
        ("context", args.context),
        ("preemption_limit", args.preemption_limit),
        ("ttft_slo_ms", args.probe_ttft_ms),
        ("itl_slo_ms", args.probe_itl_ms),
    ):
        if value is not None:
            search[key] = value
    sweep: dict[str, Any] = {}
    if args.no_sweep:
        sweep["enabled"] = False
    for key, value in (
        ("users", args.users),
        ("min_duration_s", args.level_duration),
        ("max_duration_s", args.max_level_duration),
    ):
        if value is not None:
            sweep[key] = value
    if args.configs:
        sweep["configs"] = [c.strip() for c in args.configs.split(",") if c.strip()]
    elif args.no_search:
        sweep.setdefault("configs", ["default"])
    return {
        "engine": engine_overrides(args),
        "search": search or None,
        "sweep": sweep or None,
        "workload": args.workload,
        "joint_lengths": args.joint_lengths,
        "dataset": args.dataset,
        "start_timeout_s": args.start_timeout,
    }


def _load(path: Path | None, overrides: dict[str, Any]) -> CharacterizeConfig:
    """The layered definition; sections given on the command line merge into the file's key by key."""
    if path is not None and path.is_file():
        data = read_yaml(path, "characterization definition", CharacterizeConfigError) or {}
        if not isinstance(data, dict):
            data = {}  # load_characterization names what the file holds instead of a mapping
        for section in ("search", "sweep"):
            if overrides.get(section) is not None and isinstance(data.get(section), dict):
                overrides[section] = {**data[section], **overrides[section]}
    return load_characterization(path, overrides)


def _resolve(args: argparse.Namespace) -> tuple[CharacterizeFolder, CharacterizeConfig, bool]:
    if args.resume:
        if args.out is None:
            raise BadInput("--resume needs --out (the characterization's run folder)")
        folder = CharacterizeFolder(args.out)
        if not folder.exists():
            raise BadInput(f"--resume: {folder.root} has no manifest.json; nothing to resume")
        return folder, CharacterizeConfig.model_validate(folder.read_manifest().sweep), True
    try:
        config = _load(args.config, _overrides(args))
    except CharacterizeConfigError as exc:
        raise BadInput(str(exc)) from None
    if (problem := model_problem(config.base_spec())) is not None:
        raise BadInput(problem)
    if config.base_spec().kind == "external":
        raise BadInput(
            "the characterization restarts its engine with each setting: --engine external cannot be"
        )
    folder = CharacterizeFolder(args.out or RESULTS / new_run_id(config.name))
    if folder.exists():
        raise BadInput(
            f"run {folder.root} already exists: pass --resume to continue it, or choose another --out"
        )
    return folder, config, False


def _refused(search: BudgetSearch) -> str | None:
    """When every probe was a refused start: the engine's words for the fewest-setting one."""
    if search.found is not None or any(p.started for p in search.probes):
        return None
    first = min(search.probes, key=lambda p: (p.candidate.budget, p.candidate.max_seqs))
    plan = search.plan
    return (
        f"the engine refused to start with every {plan.dimension} tried in [{plan.minimum}, {plan.maximum}] "
        f"(the smallest, {first.candidate.label}: {first.why}); choose a range it accepts "
        "(--range MIN:MAX) or other held settings"
    )


async def _measure(runner: CharacterizeRunner, executor: Executor, console: Console, timing: Timing) -> int:
    """The search, then the sweeps, each a shard run by ``executor``; the exit code."""
    config = runner.config
    found = None
    code = 0
    with executor.session(timing):
        if config.search.enabled:
            await executor.run_tasks([search_job(runner)], console, timing)
            search = runner.stored_search()
            if search is None:  # the shard ended without a result and without an error
                raise SweepAborted("the search stored no result")
            if (refused := _refused(search)) is not None:
                raise BadInput(refused)
            found = search.found_candidate
            if found is None:
                last = search.probes[-1].why if search.probes else "no probe ran"
                console.print(f"[red]search: no setting passed, even the minimum ({last})", soft_wrap=True)
                code = EXIT_FAILURES
            else:
                console.print(
                    f"search: found {search.plan.dimension} = {search.found} ({found.label}) in "
                    f"{search.wall_s:.0f} s, {len(search.probes)} probes"
                )
        if config.sweep.enabled:
            jobs = []
            for name in config.sweep.configs:
                if name == "found" and found is None:
                    console.print("[yellow]sweep found: skipped, the search found no passing setting")
                    continue
                jobs.append(sweep_job(runner, name, config.sweep_spec(name, found)))
            await executor.run_tasks(jobs, console, timing)
    return code


def _run(args: argparse.Namespace, state: dict[str, Path]) -> int:
    executor = executor_from_args(args)
    folder, config, resumed = _resolve(args)
    state["out"] = folder.root
    console = Console(stderr=True, highlight=False)
    timing = Timing()
    with folder.lock():
        if not resumed:
            spec = config.base_spec().model_dump(mode="json", exclude={"env"})
            spec["extra_args"] = redact_argv(spec["extra_args"])
            folder.write_manifest(
                new_manifest(folder, config.model_dump(mode="json"), spec, seed=config.seed)
            )
        runner = CharacterizeRunner(folder, config, console)
        runner.timing = timing
        try:
            code = asyncio.run(_measure(runner, executor, console, timing))
        except (EngineError, SweepAborted) as exc:
            console.print(f"[red]error: {exc}", soft_wrap=True)
            console.print(
                f"what was measured is kept; continue with: python -m microbench.characterize --resume "
                f"--out {folder.root}"
            )
            return EXIT_FAILURES
        console.print(executor.account(timing), soft_wrap=True)
        console.print(f"run folder: {folder.root} (rows: {folder.rows_path.name})")
        return code


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    state: dict[str, Path] = {}
    return run_cli(lambda: _run(args, state), lambda: state.get("out"))


if __name__ == "__main__":
    sys.exit(main())
