"""On paper: the wall time of seed 002's full grid (4 chunk sizes × 7 D × 7 P × 5 repetitions) on N GPUs
with ``--executor ray`` (one shard per chunk size), from measured per-point times.

The per-point times are the two 245-point ``--chunk 8192`` runs of the CPU engine stored for the ETA's test
(``tests/fixtures/sweep_point_times.csv``); a chunk size's grid is predicted with the sweep's own ETA rule
(``microbench.sweep.eta.remaining_s``: the mean time of the measured points of each kind at each P). Only
chunk 8192 was measured, so every chunk size's shard is assumed to take as long (stated in the output).
One shard per chunk size means at most 4 GPUs work, whatever N is; the last lines show what a finer split
(chunk × D groups, each paying its own engine start) would give, which this executor does not do.

Usage: ``.venv/bin/python scripts/ray_wall_estimate.py [--gpus 8] [--start-s 60] [--overhead-s 10]``.
"""

from __future__ import annotations

import argparse
import csv
import heapq
import math
import statistics
from collections import defaultdict
from pathlib import Path

from microbench.sweep.eta import remaining_s

FIXTURE = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "sweep_point_times.csv"
CHUNKS = [2048, 4096, 8192, 16384]
REPS = 5
SEED_002_H20_S = 10 * 3600  # seed 002's own budget for the full grid on one H20


def _lpt(jobs: list[float], bins: int) -> float:
    """Longest-processing-time-first onto ``bins`` workers: the makespan."""
    loads = [0.0] * bins
    heapq.heapify(loads)
    for job in sorted(jobs, reverse=True):
        heapq.heapreplace(loads, loads[0] + job)
    return max(loads)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--start-s", type=float, default=60.0, help="one engine start (CPU engine: ≈60 s)")
    parser.add_argument(
        "--overhead-s",
        type=float,
        default=10.0,
        help="Ray's start, stop and submission (docs/ray.md: 6-11 s)",
    )
    args = parser.parse_args()
    runs: dict[str, list[tuple[tuple[int, int], float]]] = defaultdict(list)
    with FIXTURE.open() as f:
        for row in csv.DictReader(f):
            runs[row["run"]].append(
                ((int(row["decode_batch"]), int(row["prefill_tokens"])), float(row["seconds"]))
            )
    for run, measured in sorted(runs.items()):
        ds = sorted({d for (d, _), _ in measured})
        ps = sorted({p for (_, p), _ in measured})
        grid = [(d, p) for d in ds for p in ps for _ in range(REPS)]
        shard = remaining_s(measured, grid) or 0.0  # one chunk size's grid
        per_d = {d: remaining_s(measured, [(d, p) for p in ps for _ in range(REPS)]) or 0.0 for d in ds}
        sequential = len(CHUNKS) * (shard + args.start_s)
        waves = math.ceil(len(CHUNKS) / args.gpus)  # shards run at once, one per GPU
        wall = waves * (shard + args.start_s) + args.overhead_s
        # a finer split: (chunk, D) jobs packed onto the GPUs, each job with its own engine start
        finer = _lpt([t + args.start_s for _ in CHUNKS for t in per_d.values()], args.gpus) + args.overhead_s
        print(f"{run}: one chunk size's grid ({len(grid)} points) {shard / 60:.1f} min of points")
        print(
            f"  sequential, 1 device: {sequential / 60:.1f} min ({len(CHUNKS)} shards + {len(CHUNKS)} starts)"
        )
        print(
            f"  --executor ray, {args.gpus} GPUs, a shard per chunk size: {wall / 60:.1f} min "
            f"({sequential / wall:.2f}× faster; {max(args.gpus - len(CHUNKS), 0)} GPUs idle)"
        )
        print(f"  (not built) shards of (chunk, D), packed on {args.gpus} GPUs: {finer / 60:.1f} min")
        factor = SEED_002_H20_S / sequential
        h20, h20_finer = wall * factor / 3600, finer * factor / 3600
        print(
            f"  seed 002's {SEED_002_H20_S / 3600:.0f} h on one H20, split alike: {h20:.1f} h "
            f"(a shard per chunk), {h20_finer:.1f} h (chunk × D)"
        )
    means = [statistics.fmean(s for _, s in m) for m in runs.values()]
    print(
        f"assumed: every chunk size's points take chunk 8192's (mean point {statistics.fmean(means):.2f} s)"
    )


if __name__ == "__main__":
    main()
