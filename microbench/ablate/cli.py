"""``python -m microbench.ablate``: engine A/B ablations of the interference grid, with statistics.

Arms A, B (and more) are the grid's engine with typed overrides; each round measures one repetition of
every point under each arm (one engine start per arm and chunk size), the arms' order reversed every
other round. The end compares every arm with the first (``analysis.compare``: B/A per cell with a
bootstrap CI, a rank test corrected across cells, the minimum detectable effect, a verdict).

Examples::

    python -m microbench.ablate --config sweeps/ablations/sim-step-cost.yaml
    python -m microbench.ablate --sweep sweeps/smoke.yaml --arm A=engine: --arm B=engine:enforce_eager=true
    python -m microbench.ablate --config sweeps/ablations/sim-step-cost.yaml --until-resolved 0.05
    python -m microbench.ablate --resume --out results/my-ablation
    python -m microbench.ablate --config sweeps/ablations/sim-step-cost.yaml --executor ray  # side by side
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from benchcore.cli import EXIT_FAILURES, BadInput, Stopped, run_cli
from benchcore.flags import add_config, add_out, duration
from benchcore.provenance import new_run_id
from benchcore.redact import redact_argv, redact_env
from engine_harness.handles import EngineOverrides, parse_engine_arm
from engine_harness.launch import EngineError, model_problem
from engine_harness.metrics import MetricsError
from microbench.ablate.config import AblateConfig, AblateConfigError, load_ablation
from microbench.ablate.runner import AblateRunner, ArmFailed, NotComparable
from microbench.client import aio
from microbench.executors import add_executor_flags, executor_from_args
from microbench.measure.engine_lifecycle import SweepAborted
from microbench.results.layout import AblateFolder, RunFolder, new_manifest

__all__ = ["build_parser", "main"]

RESULTS = Path("results")
_DEFINITION_FLAGS = ("config", "sweep", "arm", "rounds", "until_resolved", "max_rounds", "max_minutes")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m microbench.ablate",
        description=(__doc__ or "").split("\n\n")[0],
        epilog="Exit codes: 0 done, 1 an arm failed or the run stopped on an error, 2 bad input, 130/143 "
        "stopped.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_config(p, "sweeps/ablations/sim-step-cost.yaml")
    p.add_argument("--sweep", type=Path, metavar="FILE", help="the grid: a sweep definition (sweeps/*.yaml)")
    p.add_argument(
        "--arm",
        type=parse_engine_arm,
        action="append",
        metavar="NAME=engine:KEY=VALUE,...",
        help="an arm: the grid's engine with these settings changed, kind and model included (repeat; the "
        "first is A)",
    )
    p.add_argument("--rounds", type=int, help="rounds to measure (default 3)")
    p.add_argument(
        "--until-resolved",
        type=float,
        metavar="EFFECT",
        help="add rounds until every cell's CI excludes 1 or lies within ±EFFECT (e.g. 0.05)",
    )
    p.add_argument("--max-rounds", type=int, help="with --until-resolved: the most rounds (default 12)")
    p.add_argument("--max-minutes", type=float, help="with --until-resolved: stop adding rounds after")
    p.add_argument("--start-timeout", type=duration, metavar="DURATION", help="engine start-up limit")
    add_out(p, "results/<UTC time>-<ablation name>")
    p.add_argument("--resume", action="store_true", help="continue the ablation in --out")
    add_executor_flags(p.add_argument_group("executor (DESIGN §7, docs/ray.md)"))
    return p


def _arms(values: list[tuple[str, str | EngineOverrides]] | None) -> dict[str, dict[str, Any]] | None:
    if not values:
        return None
    out: dict[str, dict[str, Any]] = {}
    for name, target in values:
        if not isinstance(target, EngineOverrides):
            raise BadInput(
                f"--arm {name}={target}: an ablation launches each arm; give {name}=engine:KEY=VALUE"
            )
        if name in out:
            raise BadInput(f"--arm {name} is given twice")
        out[name] = target.values
    return out


def _resolve(args: argparse.Namespace) -> tuple[AblateFolder, AblateConfig, bool]:
    if args.resume:
        if args.out is None:
            raise BadInput("--resume needs --out (the ablation's run folder)")
        given = [f"--{k.replace('_', '-')}" for k in _DEFINITION_FLAGS if getattr(args, k) is not None]
        if given:
            raise BadInput(
                f"--resume continues the stored ablation; drop {', '.join(given)} (or start a new run)"
            )
        folder = AblateFolder(args.out)
        if not folder.exists():
            raise BadInput(f"--resume: {folder.root} has no manifest.json; nothing to resume")
        return folder, AblateConfig.model_validate(folder.read_manifest().sweep), True
    overrides: dict[str, Any] = {
        "grid": str(args.sweep) if args.sweep else None,
        "arms": _arms(args.arm),
        "rounds": args.rounds,
        "until_resolved": args.until_resolved,
        "max_rounds": args.max_rounds,
        "max_minutes": args.max_minutes,
    }
    try:
        config = load_ablation(args.config, overrides)
    except AblateConfigError as exc:
        raise BadInput(str(exc)) from None
    for name in config.names:
        if (problem := model_problem(config.spec(name, config.grid.chunks[0]))) is not None:
            raise BadInput(f"arm {name}: {problem}")
    folder = AblateFolder(args.out or RESULTS / new_run_id(config.name))
    if folder.exists():
        raise BadInput(
            f"run {folder.root} already exists: pass --resume to continue it, or choose another --out"
        )
    return folder, config, False


def _stored(data: dict[str, Any], spec: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """A definition and an engine spec as stored: secret-looking values replaced (benchcore.redact)."""
    engine = data.get("grid", data).get("engine")
    if isinstance(engine, dict) and isinstance(engine.get("env"), dict):
        engine["env"] = redact_env(engine["env"])
    return data, {k: v for k, v in spec.items() if k != "env"} | {
        "extra_args": redact_argv(spec["extra_args"])
    }


def _write_manifests(folder: AblateFolder, config: AblateConfig) -> None:
    specs = {name: config.spec(name, config.grid.chunks[0]).model_dump(mode="json") for name in config.names}
    definition, engine = _stored(config.model_dump(mode="json"), specs[config.names[0]])
    folder.write_manifest(new_manifest(folder, definition, engine, seed=config.grid.seed))
    for name in config.names:
        arm: RunFolder = folder.arm(name)
        grid = config.arm_grid(name).model_dump(mode="json") | {"name": f"{config.name}-{name}"}
        grid["engine"] = grid["engine"] | config.arms[name]
        definition, engine = _stored(grid, specs[name])
        arm.write_manifest(new_manifest(arm, definition, engine, seed=config.grid.seed))


def _run(args: argparse.Namespace, state: dict[str, Path]) -> int:
    executor = executor_from_args(args)
    folder, config, resumed = _resolve(args)
    state["out"] = folder.root
    resume = f"python -m microbench.ablate --resume --out {folder.root}"
    with folder.lock():  # one writer: a second run into this folder is bad input (exit 2)
        if not resumed:
            _write_manifests(folder, config)
        runner = AblateRunner(folder, config, args.start_timeout, executor)
        if differs := config.identity_differs():
            note = f"the arms run different engines: {'; '.join(differs)}"
            runner.console.print(note)
            if not resumed:
                folder.add_note(note)
        try:
            aio.run(runner.run())
        except (KeyboardInterrupt, Stopped):
            runner.console.print(f"[yellow]stopped; continue with: {resume}", soft_wrap=True)
            raise
        except (ArmFailed, SweepAborted, EngineError, MetricsError, OSError) as exc:
            runner.console.print(f"[red]error: {exc}", soft_wrap=True)
            runner.console.print(
                f"measured points are kept in {folder.root}; continue with: {resume}", soft_wrap=True
            )
            return EXIT_FAILURES
        try:
            comparisons = runner.finish()
        except NotComparable as exc:
            runner.console.print(f"[red]error: {exc}", soft_wrap=True)
            runner.console.print(f"measured points are kept in {folder.root}", soft_wrap=True)
            return EXIT_FAILURES
        for c in comparisons:
            counts = ", ".join(f"{n} {v}" for v, n in sorted(c.counts().items()))
            runner.console.print(f"{c.name_b} against {c.name_a}: {counts}")
            for w in c.warnings:
                runner.console.print(f"[yellow]warning: {w}")
        runner.console.print(f"comparisons written under {folder.root}")
        return 0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if hasattr(sys.stdout, "reconfigure"):
        sys.stdout.reconfigure(line_buffering=True)
    state: dict[str, Path] = {}
    return run_cli(lambda: _run(args, state), lambda: state.get("out"))
