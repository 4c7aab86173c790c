"""Observe → predict → calibrate (seed 003 §11): predict a recorded trace with a simulator fitted from a
sweep, and say with statistics how far the prediction is from reality.

  python -m analysis.calibrate predict TRACE --model RUN_FOLDER [RUN_FOLDER ...] --out DIR
      Fit the step model and read the engine settings of sweep RUN_FOLDER (analysis.calibrate.config;
      several folders of one engine are pooled in one fit, e.g. one grid at two decode contexts),
      replay TRACE's requests (their send times, prompt and output lengths, prefix groups) through the
      simulator's scheduler in virtual time, and write the predicted trace (same format) into DIR. The
      first step after an idle spell pays the wake cost the sweep's wake probe measured (--no-wake: none),
      and a step carrying prompt tokens the prefill extra the sweep measured (--no-prefill-extra: none).
  python -m analysis.calibrate report REAL PREDICTED [--repeat REAL2] --out DIR
      Compare two traces per request and metric (TTFT, TPOT, E2E, ITL): MAPE, bias, Pearson r, percentile
      errors, KS, QQ, bootstrap CIs, seed 003's rating; calibration.{json,md,html} and figures in DIR.
      REAL2, the same workload run again on the engine (same spec and seed, a new prompt salt), gives the
      engine's error against itself beside the prediction's: the floor no prediction is expected to beat.

Exit codes: 0 done; 2 bad input (a folder that is not a trace or a sweep run, a chunk size to choose, a
--repeat of another schedule).
"""

from __future__ import annotations

import argparse
import time
from contextlib import ExitStack
from pathlib import Path

from benchcore.cli import BadInput, run_cli
from benchcore.flags import add_out
from microbench.results.layout import hold_folder

__all__ = ["build_parser", "main"]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m analysis.calibrate",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("predict", help="replay a trace through the fitted simulator (virtual time)")
    p.add_argument("trace", type=Path, help="a trace folder (python -m microbench.loadgen run --out ...)")
    p.add_argument(
        "--model", type=Path, nargs="+", required=True, metavar="RUN_FOLDER",
        help="a sweep run folder, or several of one engine and its settings whose steps are pooled in one "
        "fit (the first gives the settings)",
    )  # fmt: skip
    p.add_argument("--chunk", type=int, help="token budget to predict for (default: the run's only one)")
    p.add_argument("--candidate", help="step-model candidate (default: the fit's choice)")
    p.add_argument(
        "--no-wake", action="store_true",
        help="charge no wake cost after idle spells, whatever the sweep's wake probe measured (the same "
        "prediction without the term, to see what it carries)",
    )  # fmt: skip
    p.add_argument(
        "--no-prefill-extra", action="store_true",
        help="charge prompt-carrying steps no time beyond their step model and stream time, and fit the "
        "API server's time without taking it out (the same prediction without the term, to see what it "
        "carries)",
    )  # fmt: skip
    p.add_argument(
        "--engine-speed", type=float, default=1.0, metavar="F",
        help="what if every step took F times the fit's time (its step model, and the stream time and "
        "prefill extra beyond its log; not the per-request API-server time or the wake cost): an engine on a "
        "box F× slower (F > 1) or faster (default 1: as fitted). The report's 'engine speed against the fit' "
        "reads F off a trace's own step log: a prediction told that F knows of the trace it is scored on",
    )  # fmt: skip
    add_out(p, "results/predict-<UTC time>")
    r = sub.add_parser("report", help="compare a predicted trace with the real one")
    r.add_argument("real", type=Path, help="the real trace folder")
    r.add_argument("predicted", type=Path, help="the predicted trace folder")
    r.add_argument("--bootstrap", type=int, default=1000, help="bootstrap resamples of the CIs (1000)")
    r.add_argument("--seed", type=int, default=0, help="seed of the bootstrap (0)")
    r.add_argument(
        "--engine-log", type=Path, metavar="FILE",
        help="the real engine's log (vLLM with --enable-logging-iteration-details, or SGLang): compare "
        "its steps during the trace with the replay's (a .gz log is read through gzip)",
    )  # fmt: skip
    r.add_argument(
        "--repeat", type=Path, metavar="REAL2",
        help="the same workload run again on the engine (same spec and seed, new prompt salt): report its "
        "error against REAL beside the prediction's, the run-to-run floor of this box and engine",
    )  # fmt: skip
    add_out(r, "results/calibration-<UTC time>")
    return parser


def _predict(args: argparse.Namespace, held: ExitStack) -> int:
    # imported here: the step-model fit pulls in statsmodels (≈ 2.5 s), which --help or a refused flag
    # never needs
    from analysis.calibrate.config import fit_to_sim
    from analysis.calibrate.predict import predict_trace
    from engine_harness.wake_model import WakeCost

    if not (args.trace / "header.json").is_file():
        raise BadInput(f"{args.trace} is not a trace folder (no header.json): give a load generator's --out")
    if not 0 < args.engine_speed <= 100:
        raise BadInput(f"--engine-speed must be in (0, 100] (1: the fit's speed), got {args.engine_speed:g}")
    try:
        settings = fit_to_sim(args.model, args.chunk, args.candidate, not args.no_prefill_extra)
        if args.engine_speed != 1:
            settings = settings.at_speed(args.engine_speed)
        if args.no_wake:
            note = "wake=none (--no-wake)"
            settings = settings.model_copy(
                update={"wake": WakeCost(), "defaulted": [*settings.defaulted, note]}
            )
    except (FileNotFoundError, ValueError, KeyError) as exc:
        raise BadInput(f"--model {' '.join(map(str, args.model))}: {exc}") from None
    held.enter_context(hold_folder(args.out))
    try:
        pred = predict_trace(args.trace, settings, args.out)
    except ValueError as exc:
        raise BadInput(f"{args.trace}: {exc}") from None
    print(
        f"predicted {pred.requests} requests ({pred.steps} engine steps) of a {pred.trace_s:.1f} s trace in "
        f"{pred.wall_s:.2f} s: {pred.speed_ratio:.0f}× faster than real time"
    )
    loo = settings.fit.loo_step_mape_pct
    held_out = f"{loo:.1f}%" if loo is not None else "none: too few P values to hold one out"
    print(
        f"simulator: {settings.mode}, budget {settings.max_num_batched_tokens}, step model "
        f"{settings.fit.candidate} (R² {settings.fit.r2:.3f}, leave-one-P-out error {held_out}; "
        f"{settings.fit.n_steps} steps of {1 + len(settings.fit.pooled)} sweep run(s))"
    )
    for line in (m for m in settings.matched if m.startswith("wake: ") and settings.wake.points):
        print(line)
    for d in settings.defaulted:
        print(f"defaulted: {d}")
    print(f"wrote {args.out}")
    return 0


def _report(args: argparse.Namespace, held: ExitStack) -> int:
    # imported here: the statistics and figures pull in scipy and seaborn (≈ 2.5 s)
    from analysis.calibrate.pages import lines, write_pages
    from analysis.calibrate.report import calibration_report
    from analysis.calibrate.steps import EngineLogError

    if args.bootstrap < 100:
        raise BadInput(f"--bootstrap must be ≥ 100 (got {args.bootstrap})")
    named = [("REAL", args.real), ("PREDICTED", args.predicted)] + (
        [("--repeat", args.repeat)] if args.repeat else []
    )
    for name, path in named:
        if not (path / "header.json").is_file():
            raise BadInput(f"{name} {path} is not a trace folder (no header.json)")
    try:
        report = calibration_report(
            args.real, args.predicted, args.bootstrap, args.seed, args.engine_log, args.repeat
        )
    except EngineLogError as exc:
        raise BadInput(f"--engine-log: {exc}") from None
    except (OSError, ValueError) as exc:
        raise BadInput(str(exc)) from None
    held.enter_context(hold_folder(args.out))
    paths = write_pages(report, args.out)
    print("\n".join(lines(report)))
    print("wrote " + ", ".join(str(p) for p in paths))
    return 0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    args.out = (
        args.out or Path("results") / f"{'predict' if args.command == 'predict' else 'calibration'}-{stamp}"
    )

    def body() -> int:
        with ExitStack() as held:
            return (_predict if args.command == "predict" else _report)(args, held)

    return run_cli(body, lambda: args.out)


if __name__ == "__main__":
    raise SystemExit(main())
