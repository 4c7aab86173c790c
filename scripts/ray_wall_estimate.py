"""On paper: the wall time of seed 002's full grid (4 chunk sizes × 7 D × 7 P × 5 repetitions) on N GPUs
with ``--executor ray``, from measured per-point times: one shard per chunk size, and the sweep's default
split (``--shards N``: each chunk size's D values in groups, ``microbench.measure.plan.split_plans``).

The per-point times are the two 245-point ``--chunk 8192`` runs of the CPU engine stored for the ETA's test
(``tests/fixtures/sweep_point_times.csv``, 10-11 min of points each); a shard's points are predicted with
the sweep's own ETA rule (``microbench.sweep.eta.remaining_s``: the mean time of the measured points of each
kind at each P). Only chunk 8192 was measured, so every chunk size's shard is assumed to take as long.

Those two runs were made on a fast 2-core box; ``results/reference-cpu`` (another run, chunk 8192's D 0-4
points) spaced its injections alike (1.05-1.28× the fixture's time on the cells both measured). The same
grid took 46-48 min on a slower 2-core box (issue #39's figure: engine-bound, 92% the engine's prefill
work), 4.4× the fixture's points: ``--slowdown`` scales every point (``--slowdown 4.4`` for that box). The
split's gain is a ratio of point times to engine starts, so a slower box gains more from it.

Usage: ``.venv/bin/python scripts/ray_wall_estimate.py [--gpus 8] [--start-s 60] [--overhead-s 10]
[--slowdown 1]``.
"""

from __future__ import annotations

import argparse
import csv
import math
import statistics
from collections import defaultdict
from pathlib import Path

from engine_harness.engines import EngineSpec
from microbench.measure.plan import ShardPlan, split_plans
from microbench.sweep.eta import remaining_s

FIXTURE = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "sweep_point_times.csv"
CHUNKS = [2048, 4096, 8192, 16384]
REPS = 5
SEED_002_H20_S = 10 * 3600  # seed 002's own budget for the full grid on one H20


def _plans(ds: list[int], ps: list[int]) -> list[ShardPlan]:
    return [
        ShardPlan(EngineSpec(kind="sim"), c, ds, ps, REPS, decode_context=0, seed=0, decode_budgets={})
        for c in CHUNKS
    ]


def _estimate(run: str, measured: list[tuple[tuple[int, int], float]], args: argparse.Namespace) -> None:
    ds = sorted({d for (d, _), _ in measured})
    ps = sorted({p for (_, p), _ in measured})

    def points_s(plan: ShardPlan) -> float:
        return remaining_s(measured, [(d, p) for d, p, _ in plan.points()]) or 0.0

    whole = _plans(ds, ps)
    shard = points_s(whole[0])  # one chunk size's grid
    sequential = len(CHUNKS) * (shard + args.start_s)
    waves = math.ceil(len(CHUNKS) / args.gpus)  # shards run at once, one per GPU
    wall = waves * (shard + args.start_s) + args.overhead_s
    parts = split_plans(whole, args.gpus)  # the sweep's default under Ray: --shards = the GPUs
    longest = max(parts, key=points_s)
    split = math.ceil(len(parts) / args.gpus) * (points_s(longest) + args.start_s) + args.overhead_s
    idle = max(args.gpus - len(CHUNKS), 0)
    print(f"{run}: one chunk size's grid ({len(whole[0].points())} points) {shard / 60:.1f} min of points")
    print(f"  sequential, 1 device: {sequential / 60:.1f} min ({len(CHUNKS)} shards + {len(CHUNKS)} starts)")
    print(
        f"  --executor ray, {args.gpus} GPUs, --shards {len(CHUNKS)} (one per chunk size): "
        f"{wall / 60:.1f} min ({sequential / wall:.2f}× faster; {idle} GPUs idle)"
    )
    print(
        f"  --executor ray, {args.gpus} GPUs, default split: {len(parts)} shards "
        f"({min(len(parts), args.gpus)} GPUs busy; the longest, {longest.name}, "
        f"{points_s(longest) / 60:.1f} min + a start): {split / 60:.1f} min "
        f"({sequential / split:.2f}× faster)"
    )
    factor = SEED_002_H20_S / sequential
    print(
        f"  seed 002's {SEED_002_H20_S / 3600:.0f} h on one H20, split alike: "
        f"{wall * factor / 3600:.1f} h (a shard per chunk), {split * factor / 3600:.1f} h (default split)"
    )


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
    parser.add_argument("--slowdown", type=float, default=1.0, help="every point this many times slower")
    args = parser.parse_args()
    runs: dict[str, list[tuple[tuple[int, int], float]]] = defaultdict(list)
    with FIXTURE.open() as f:
        for row in csv.DictReader(f):
            point = (int(row["decode_batch"]), int(row["prefill_tokens"]))
            runs[row["run"]].append((point, float(row["seconds"]) * args.slowdown))
    for run, measured in sorted(runs.items()):
        _estimate(run, measured, args)
    means = [statistics.fmean(s for _, s in m) for m in runs.values()]
    print(
        f"assumed: every chunk size's points take chunk 8192's (mean point {statistics.fmean(means):.2f} s"
        f"{f', the fixture ×{args.slowdown:g}' if args.slowdown != 1 else ''})"
    )


if __name__ == "__main__":
    main()
