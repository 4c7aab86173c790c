"""Where a run's shards execute (DESIGN §7): ``local`` in turn, or ``ray`` across a cluster.

A job resolves its run into shards (``microbench.measure.plan.ShardPlan``: one engine configuration ×
chunk size each, or a group of its D values) and hands them, with its run folder's ``FolderSink``, to an
``Executor`` (a job that measures something else hands it ``job.ShardJob``s: the characterization):

- ``local`` (``local.LocalExecutor``, the default): ``measure_shard`` on each in turn, in this process;
- ``ray`` (``ray.RayExecutor``, the optional ``[ray]`` extra): each shard a Ray task that owns a GPU (or,
  on CPU-only nodes, cores it pins itself to), starts its engine on its node, and streams every stored
  file back to this process, which writes it into the run folder as it arrives (``relay``).

Either way the run folder ends up as a sequential run's, plus the manifest's ``shards`` entries (host,
device, placement, engine version, wall time of every shard). Ray is imported only when ``ray`` is chosen.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
from collections.abc import Sequence
from typing import Protocol

from rich.console import Console

from benchcore.cli import BadInput
from microbench.executors.job import ShardJob
from microbench.measure.plan import ShardPlan
from microbench.measure.shard import ShardContext
from microbench.measure.sink import FolderSink
from microbench.measure.timing import Timing

__all__ = ["EXECUTORS", "Executor", "Job", "ShardJob", "add_executor_flags", "executor_from_args"]

EXECUTORS = ("local", "ray")
RAY_HINT = "pip install '.[ray]' (scripts/setup.sh installs it unless SETUP_RAY=0)"


Job = tuple[ShardPlan, FolderSink]  # a shard and the run folder its points go to


class Executor(Protocol):
    """Runs every point of ``plans`` that ``sink`` does not hold yet; measured points end up in ``sink``."""

    name: str

    async def run(self, plans: Sequence[ShardPlan], sink: FolderSink, context: ShardContext) -> None: ...

    async def run_jobs(self, jobs: Sequence[Job], context: ShardContext) -> None:
        """Every ``(plan, sink)`` at once where the executor can place them side by side (``capacity``),
        each into its own run folder (an ablation's arms); ``run`` is ``run_jobs`` with one sink."""
        ...

    async def run_tasks(self, jobs: Sequence[ShardJob], console: Console, timing: Timing) -> None:
        """Shards of any job (``ShardJob``: a characterization's too) as ``run_jobs`` runs interference
        shards; ``run_jobs`` is ``run_tasks`` of their ``shard_task.interference_job``."""
        ...

    def session(self, timing: Timing) -> contextlib.AbstractContextManager[None]:
        """Keeps the executor ready for every ``run`` inside (Ray: one start and stop for many rounds)."""
        ...

    def capacity(self) -> int:
        """How many shards can run at once, each alone on its device (inside ``session``)."""
        ...

    def account(self, timing: Timing) -> str:
        """Where the run's wall time went, in one line (``timing``: the context's of ``run``)."""
        ...


def add_executor_flags(group: argparse._ArgumentGroup) -> None:
    """``--executor``, ``--ray-address``, ``--shard-cpus``: the same flags for every job that has shards."""
    group.add_argument(
        "--executor",
        choices=EXECUTORS,
        default="local",
        help="where the shards (one per chunk size; in an ablation, per arm and chunk size each round) run: "
        "local, one after another (default), or ray: "
        "one Ray task per shard, each on its own GPU (CPU-only: its own cores), records streamed back "
        f"into the run folder as they are measured (needs the ray extra: {RAY_HINT})",
    )
    group.add_argument(
        "--ray-address",
        metavar="ADDR",
        help="join this running Ray cluster (auto, or the head's HOST:6379; run the sweep on one of its "
        "nodes); default: start a local Ray instance for the run",
    )
    group.add_argument(
        "--shard-cpus",
        type=int,
        metavar="N",
        help="on CPU-only Ray nodes: cores each shard owns and pins itself and its engine to (default: "
        "every core of a node, one shard per node at a time)",
    )


def executor_from_args(args: argparse.Namespace) -> Executor:
    """The executor the flags ask for; bad combinations and a missing Ray are bad input (exit 2)."""
    if args.executor != "ray":
        if args.ray_address or args.shard_cpus:
            raise BadInput("--ray-address and --shard-cpus are for --executor ray; add it or drop them")
        from microbench.executors.local import LocalExecutor

        return LocalExecutor()
    if importlib.util.find_spec("ray") is None:
        raise BadInput(f"--executor ray needs Ray, which is not installed here: {RAY_HINT}")
    if args.shard_cpus is not None and args.shard_cpus < 1:
        raise BadInput(f"--shard-cpus must be ≥ 1, got {args.shard_cpus}")
    from microbench.executors.ray import RayExecutor

    return RayExecutor(
        args.ray_address, args.shard_cpus, start_timeout_s=getattr(args, "start_timeout", None)
    )
