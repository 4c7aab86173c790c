"""What a load-generation worker among N pays for the plan items the other workers send.

Every worker goes through every item of a stage's plan (that keeps one seeded schedule and one numbering
between them) and sends those whose count is its own modulo N (``microbench.loadgen.stages.share_of``).
Three ways of doing that are measured in one run, on a self-timed workload plan (``Workload.plan``), as
worker 0 of N, interleaved and in alternating order, ``--reps`` times:

- ``skip``: ``share_of``, what a worker does now: the others' items ``skip()``ped (their draws and numbers
  taken, no draft made), its own built;
- ``drafts``: pull every item's draft, build worker 0's (what a worker did before ``skip()``);
- ``all``: pull and build every item (what each worker did before drafts: the yardstick in the same run).

Per row: CPU µs (``time.process_time``) per item the worker sends, the median over the reps, and its ratio
to N = 1 of the same row. A worker whose cost per own item stays flat as N grows scales; one whose cost
grows with N (``all``: ≈ N) spends its core on requests it never sends. ``chat`` renders text through the
bundled model's tokenizer (``TextRenderer``: the chat API's exact-count text), the costlier build.

    .venv/bin/python scripts/bench_plan_share.py [--workers 1 2 4 8] [--items 4000] [--reps 5] [--out F]
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from engine_harness.engines import DEFAULT_MODEL
from microbench.loadgen.stages import share_of
from microbench.workloads.generator import Workload
from microbench.workloads.prompts import BYTE_SPACE, PromptFactory, prompt_source
from microbench.workloads.reference import load_workload

WORKLOADS = ("sweeps/workloads/calibrate-poisson.yaml", "sweeps/workloads/calibrate-bursty.yaml")
MODES = ("skip", "drafts", "all")


def machine() -> str:
    """The CPU model, cores and Python this ran on (timings are this box's)."""
    model = "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{model}, {os.cpu_count()} cores, Python {platform.python_version()}"


def cost(workload: Workload, items: int, workers: int, mode: str) -> float:
    """CPU µs per item worker 0 of ``workers`` sends, over ``items`` items of ``workload``'s plan."""
    plan = workload.plan(duration_s=1e6, aggregate_rate=100.0)
    own = 0
    cpu0 = time.process_time()
    if mode == "skip":
        for _, spec in share_of(plan, 0, workers, limit=items):
            if spec is not None:
                spec.built()
                own += 1
    else:
        for pulled, (_, spec) in enumerate(itertools.islice(plan, items)):
            mine = pulled % workers == 0
            if mine or mode == "all":
                spec.built()
            own += mine
    return (time.process_time() - cpu0) / own * 1e6


def run(args: argparse.Namespace) -> dict[str, Any]:
    chat = prompt_source("chat", DEFAULT_MODEL, salt=1)
    apis = {"completions": None, "chat": chat[1]}
    rows = [(Path(w).stem, api, mode) for w in args.workloads for api in apis for mode in MODES]
    specs = {Path(w).stem: load_workload(w) for w in args.workloads}
    runs: dict[str, list[float]] = {}
    for rep in range(args.reps):
        order = [(row, n) for row in rows for n in args.workers]
        for (name, api, mode), n in order if rep % 2 == 0 else order[::-1]:
            factory = PromptFactory(chat[0].space if api == "chat" else BYTE_SPACE, salt=rep)
            workload = Workload(specs[name], factory, text=apis[api])
            runs.setdefault(f"{name}|{api}|{mode}|{n}", []).append(cost(workload, args.items, n, mode))
        print(f"rep {rep + 1}/{args.reps} done", file=sys.stderr)
    table: dict[str, dict[str, float]] = {}
    for name, api, mode in rows:
        base = float(np.median(runs[f"{name}|{api}|{mode}|1"]))
        for n in args.workers:
            us = float(np.median(runs[f"{name}|{api}|{mode}|{n}"]))
            table[f"{name}|{api}|{mode}|{n}"] = {"us_per_own_item": us, "ratio_to_one": us / base}
    return {"machine": machine(), "items": args.items, "reps": args.reps, "table": table, "runs": runs}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2, 4, 8], help="worker counts N")
    parser.add_argument("--items", type=int, default=4000, help="plan items pulled per measurement")
    parser.add_argument("--reps", type=int, default=5, help="interleaved repetitions (medians)")
    parser.add_argument("--workloads", nargs="+", default=list(WORKLOADS), help="workload spec files")
    parser.add_argument("--out", type=Path, help="also write the report as JSON here")
    args = parser.parse_args()
    if min(args.workers) < 1 or 1 not in args.workers or args.reps < 1 or args.items < max(args.workers):
        parser.error("--workers must include 1 (the ratios' base), all ≥ 1; --reps ≥ 1; --items ≥ max N")
    report = run(args)
    print(report["machine"])
    print(f"{'workload':>18} {'api':>12} {'mode':>6} {'N':>3} {'CPU µs/own item':>16} {'÷ N=1':>7}")
    for key, fig in report["table"].items():
        name, api, mode, n = key.split("|")
        us, ratio = fig["us_per_own_item"], fig["ratio_to_one"]
        print(f"{name:>18} {api:>12} {mode:>6} {n:>3} {us:>16.1f} {ratio:>7.2f}")
    if args.out:
        args.out.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
