"""``python -m microbench.sweep``: the prefill–decode interference grid (chunk × D × P × repetitions).

Per chunk size the engine is (re)started with that token budget; per D one steady decode batch on a
shared warm prefix carries a Phase 1 baseline and then one cold-prefill injection per (P, repetition),
refreshed when its streams run short of tokens; D = 0 measures the bare prefill. Every point is
checked (zero prefix-cache hits, steady decodes spanning the window, no preemption) and retried when
invalid; records are written atomically as each point finishes, so an interrupted run resumes with
``--resume``. The end writes ``interference_table.csv`` and prints the seed's success criteria.

Examples::

    python -m microbench.sweep --chunk 8192                          # seed grid, embedded CPU engine
    python -m microbench.sweep --config sweeps/smoke.yaml            # the small CI grid
    python -m microbench.sweep --chunk 2048 8192 --D 0 4 --P 4096 --reps 2 --out results/my-run
    python -m microbench.sweep --engine external --url http://127.0.0.1:8000 --model my-model --chunk 8192
    python -m microbench.sweep --resume                              # continue the newest run in results/
    python -m microbench.sweep --resume --out results/my-run         # continue that run
    python -m microbench.sweep --config sweeps/seed-full.yaml --executor ray --ray-address auto  # GPU/chunk
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from benchcore.cli import EXIT_FAILURES, BadInput, Stopped, run_cli
from benchcore.flags import add_config, add_out, duration
from benchcore.provenance import new_run_id
from benchcore.redact import REDACTED, redact_argv, redact_env
from engine_harness.flags import add_engine_flags, engine_overrides
from engine_harness.handles import checked_endpoint
from engine_harness.launch import EngineError, context_limit, model_problem
from engine_harness.metrics import MetricsError
from microbench.client import aio
from microbench.executors import add_executor_flags, executor_from_args
from microbench.measure.engine_lifecycle import SweepAborted
from microbench.measure.grid import SweepConfig, SweepConfigError, load_sweep
from microbench.results.layout import RunFolder, new_manifest
from microbench.sweep.runner import SweepRunner

__all__ = ["build_parser", "main"]

RESULTS = Path("results")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m microbench.sweep",
        description=(__doc__ or "").split("\n\n")[0] + " Flags override the --config YAML; the resolved "
        "sweep is validated and stored in the run's manifest.",
        epilog="Defaults are seed 002's: D ∈ {0,1,2,4,6,8,12}, P ∈ {512…32768}, 5 repetitions, 4096-token "
        "decode context, the embedded CPU vLLM engine (tiny Qwen3-MoE, dummy weights). Exit codes: 0 every "
        "point valid, 1 some point invalid or the run stopped on an error, 2 bad input, 130/143 stopped.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    grid = p.add_argument_group("grid")
    add_config(grid, "sweeps/seed-reduced.yaml")
    grid.add_argument(
        "--chunk",
        type=int,
        nargs="+",
        dest="chunks",
        metavar="N",
        help="token budget(s) per engine step: vLLM max-num-batched-tokens (default 8192)",
    )
    grid.add_argument(
        "--D",
        type=int,
        nargs="+",
        dest="decode_batch_sizes",
        metavar="D",
        help="decode batch sizes (default 0 1 2 4 6 8 12)",
    )
    grid.add_argument(
        "--P",
        type=int,
        nargs="+",
        dest="prefill_tokens",
        metavar="P",
        help="cold prefill lengths in tokens (default 512 … 32768)",
    )
    grid.add_argument("--reps", type=int, dest="repetitions", help="repetitions per cell (default 5)")
    grid.add_argument("--decode-context", type=int, help="shared prefix of each decode stream (default 4096)")
    grid.add_argument(
        "--decode-prompts",
        choices=["shared", "distinct"],
        help="decode streams on one shared warm prefix (seed 002's protocol, default) or each on its own "
        "warm prompt (a serving mix's decodes, whose cost grows with the batch: the calibration sweeps)",
    )
    grid.add_argument(
        "--decode-tokens",
        type=int,
        help="max_tokens per decode stream (default: enough for warm-up, baseline and every "
        "injection's window and recovery, capped at 2048; batches are refreshed as needed)",
    )
    grid.add_argument(
        "--seed", type=int, help="seed of the shared decode prefix (cold prompts: always unique)"
    )
    grid.add_argument("--max-attempts", type=int, help="tries per point before it is recorded invalid (3)")
    grid.add_argument("--token-range", help="LO:HI token ids for prompts (default: read from the model)")
    eng = p.add_argument_group("engine")
    add_engine_flags(eng)
    eng.add_argument(
        "--start-timeout",
        type=duration,
        metavar="DURATION",
        help="how long an engine may take to answer /health at start (default 10m; --engine external: 30s)",
    )
    eng.add_argument(
        "--enforce-eager", action="store_true", default=None, help="disable CUDA graphs (seed 002's ablation)"
    )
    executor = p.add_argument_group("executor (DESIGN §7, docs/ray.md)")
    add_executor_flags(executor)
    executor.add_argument(
        "--shards",
        type=int,
        metavar="N",
        help="split the run into about N shards, each on its own engine and device: a chunk size's D values "
        "in groups when N exceeds the chunk sizes (default: as many as the executor runs at once, so "
        "--executor ray fills every GPU; local: one shard per chunk size)",
    )
    out = p.add_argument_group("output")
    add_out(out, "results/<UTC time>-<sweep name>")
    out.add_argument(
        "--resume",
        action="store_true",
        help="continue a stopped run (--out, or the newest in results/); measured points are kept",
    )
    return p


def _overrides(args: argparse.Namespace) -> dict[str, Any]:
    keys = (
        "chunks",
        "decode_batch_sizes",
        "prefill_tokens",
        "repetitions",
        "decode_context",
        "decode_prompts",
        "decode_tokens",
        "seed",
        "max_attempts",
        "token_range",
    )
    out: dict[str, Any] = {k: getattr(args, k) for k in keys}
    out["engine"] = engine_overrides(args) | {"enforce_eager": args.enforce_eager}
    return out


def _newest_run() -> Path:
    runs = sorted(RESULTS.glob("*/manifest.json")) if RESULTS.is_dir() else []
    if not runs:
        raise BadInput(f"--resume: no run with a manifest in {RESULTS}; name the run with --out")
    return max(runs, key=lambda p: p.stat().st_mtime).parent


def _resolve_run(args: argparse.Namespace) -> tuple[RunFolder, SweepConfig, bool]:
    """The run folder and sweep to use, and whether it is a resumed run."""
    overrides = _overrides(args)
    if args.resume:
        folder = RunFolder(args.out or _newest_run())
        if not folder.exists():
            raise BadInput(f"--resume: {folder.root} has no manifest.json; nothing to resume")
        given = [k for k, v in overrides.items() if k != "engine" and v is not None]
        given += [k for k, v in overrides["engine"].items() if v is not None] + (
            ["--config"] if args.config else []
        )
        if given:
            raise BadInput(
                f"--resume continues the stored sweep; drop {', '.join(given)} (or start a new run)"
            )
        try:
            stored = folder.read_manifest().sweep
        except (OSError, ValueError) as exc:
            raise BadInput(
                f"--resume: the manifest of {folder.root} cannot be read ({exc}); it is written before the "
                "first point, so a run without a readable manifest cannot be continued: start a new run "
                "with another --out (the points measured so far stay where they are)"
            ) from None
        try:
            sweep = SweepConfig.model_validate(_unredact(stored))
        except ValidationError as exc:
            problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
            raise BadInput(
                f"--resume: the sweep stored in {folder.root / 'manifest.json'} is not a valid sweep "
                f"({problems}); it was changed by hand or by another version: start a new run with another "
                "--out"
            ) from None
        _check_engine(sweep)
        return folder, sweep, True
    try:
        sweep = load_sweep(args.config, overrides)
    except SweepConfigError as exc:
        raise BadInput(str(exc)) from None
    _check_engine(sweep)
    folder = RunFolder(args.out or RESULTS / new_run_id(sweep.name))
    if folder.exists():
        raise BadInput(
            f"run {folder.root} already exists: pass --resume to continue it, or choose another --out"
        )
    return folder, sweep, False


def _check_engine(sweep: SweepConfig) -> None:
    """Bad input found before an engine start of a minute: a model folder that is not there, an external
    URL that is no OpenAI server (or refuses the key), a P, chunk or decode length above the model's limit."""
    spec, limit = sweep.engine_spec(), None
    if spec.kind == "external" and spec.url:
        served = aio.run(checked_endpoint(spec.url, spec.api_key_env, may_be_starting=True))
        if served is not None and served[1]:  # (refused: still starting; the run waits for its /health)
            limit = (served[1], f"max_model_len in {spec.url}/v1/models")
    for chunk in sweep.chunks:
        spec = sweep.engine_spec(chunk)
        if (problem := model_problem(spec)) is not None:
            raise BadInput(problem)
        if spec.kind != "external":
            limit = context_limit(spec)
        if limit is not None:
            _check_lengths(sweep, chunk, *limit)


def _check_lengths(sweep: SweepConfig, chunk: int, limit: int, source: str) -> None:
    """Every request of the grid fits the model: a cold prompt of P tokens and its one token, a decode
    stream's context and budget; a chunk above the limit is never filled by one prompt."""
    too_long = [p for p in sweep.prefill_tokens if p + 1 > limit]
    if too_long:
        raise BadInput(
            f"prefill length(s) {too_long} do not fit the model's limit of {limit} tokens ({source}): a "
            "cold prompt of P tokens plus its one generated token must fit; drop them (--P) or raise "
            "max_model_len (engine: max_model_len)"
        )
    if chunk > limit:
        raise BadInput(
            f"chunk size {chunk} is above the model's limit of {limit} tokens ({source}): no prompt can "
            "fill it; choose a smaller --chunk or raise max_model_len"
        )
    decodes = [d for d in sweep.decode_batch_sizes if d > 0]
    if decodes and (need := sweep.decode_context + sweep.decode_budget(chunk, max(decodes))) > limit:
        raise BadInput(
            f"a decode stream needs {need} tokens (decode_context {sweep.decode_context} + "
            f"{need - sweep.decode_context} decode tokens) above the model's limit of {limit} tokens "
            f"({source}); lower decode_context or decode_tokens"
        )


def _redacted(sweep: SweepConfig) -> dict[str, Any]:
    """The sweep as stored: secret-looking engine env values and flag values replaced (benchcore.redact)."""
    data = sweep.model_dump(mode="json")
    engine = data["engine"]
    if isinstance(engine.get("env"), dict):
        engine["env"] = redact_env(engine["env"])
    if isinstance(engine.get("extra_args"), list):
        engine["extra_args"] = redact_argv(engine["extra_args"])
    return data


def _unredact(stored: dict[str, Any]) -> dict[str, Any]:
    """A stored sweep with its redacted engine env values taken from this shell's environment again."""
    env = (stored.get("engine") or {}).get("env") or {}
    missing = [k for k, v in env.items() if v == REDACTED and k not in os.environ]
    if missing:
        raise BadInput(
            f"--resume: the run's engine environment {', '.join(missing)} was not stored (secrets never "
            f"are); export {' '.join(f'{k}=…' for k in missing)} in this shell and --resume again"
        )
    restored = {k: os.environ[k] if v == REDACTED else v for k, v in env.items()}
    return stored | {"engine": stored["engine"] | {"env": restored}} if env else stored


def _write_manifest(folder: RunFolder, sweep: SweepConfig) -> None:
    spec = sweep.engine_spec()
    engine = spec.model_dump(mode="json", exclude={"env"}) | {"extra_args": redact_argv(spec.extra_args)}
    folder.write_manifest(new_manifest(folder, _redacted(sweep), engine, seed=sweep.seed))


def _problem(exc: Exception) -> str:
    """One line naming what went wrong; a file-system error names the file and the fix."""
    if isinstance(exc, OSError) and exc.filename:
        return (
            f"cannot write {exc.filename}: {exc.strerror or exc}; free some space or make the folder "
            "writable (the file was not half-written)"
        )
    return str(exc)


def _run(args: argparse.Namespace, state: dict[str, Path]) -> int:
    executor = executor_from_args(args)
    if args.shards is not None and args.shards < 1:
        raise BadInput(f"--shards must be ≥ 1, got {args.shards}")
    folder, sweep, resumed = _resolve_run(args)
    state["out"] = folder.root
    resume = f"python -m microbench.sweep --resume --out {folder.root}"
    with folder.lock():
        if not resumed:
            try:
                _write_manifest(folder, sweep)
            except OSError as exc:
                raise BadInput(
                    f"cannot write the run folder {folder.root}: {exc}; choose another --out"
                ) from None
        runner = SweepRunner(folder, sweep, args.start_timeout, executor, args.shards)
        try:
            aio.run(runner.run())
        except (KeyboardInterrupt, Stopped):
            runner.console.print(
                f"[yellow]stopped; everything measured is in {folder.root}. Continue with: {resume}",
                soft_wrap=True,
            )  # one line: survives copy and paste
            raise
        except (SweepAborted, EngineError, MetricsError, OSError) as exc:
            runner.console.print(f"[red]error: {_problem(exc)}", soft_wrap=True)
            runner.console.print(
                f"measured points are kept in {folder.root}; continue with: {resume}", soft_wrap=True
            )
            return EXIT_FAILURES
        finally:
            runner.finish()
        return EXIT_FAILURES if runner.invalid_points() else 0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if hasattr(sys.stdout, "reconfigure"):
        sys.stdout.reconfigure(line_buffering=True)  # progress lines reach a log file as they happen
    state: dict[str, Path] = {}
    return run_cli(lambda: _run(args, state), lambda: state.get("out"))
