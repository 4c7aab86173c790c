"""The characterization's shards (issue #39): the batch-budget search is one (each probe depends on the
probes before it: one device, in turn), and each swept configuration is one (its own engine), run side by
side where the executor has the devices (``--executor ray``: a GPU each, or cores of their own).

Either executor runs them (``microbench.executors``). ``local`` calls the runner in this process, as a
sequential run always did. ``ray`` runs ``stream_characterization`` on a worker: a runner there works in a
scratch copy of the run folder (its manifest and the shard's stored probes or levels, so it goes on where
the shard stopped) and sends every file it stores (``Written``) and every dataset row (``Rows``) as it
goes, then its engines' logs; the driver writes the files into the run folder, a probe's or level's
record after its stamps, and appends the rows as a local run does (``CharacterizeRelay``). Either way the
run folder is the sequential run's, and its manifest lists every shard's execution (``ShardRun``).
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console

from analysis.characterize.dataset import DatasetRow
from benchcore.provenance import hardware_info
from engine_harness.engines import EngineSpec
from engine_harness.telemetry import NvmlSource
from microbench.characterize.config import CharacterizeConfig
from microbench.characterize.runner import CharacterizeRunner
from microbench.executors import ShardJob
from microbench.executors.relay import Finished, FolderWatch, write_files
from microbench.executors.shard_task import Emit, TaskBody, TaskOptions, stream_task
from microbench.measure.grid import hardware_name
from microbench.measure.timing import Timing
from microbench.results.layout import CharacterizeFolder

__all__ = [
    "SEARCH",
    "CharacterizeRelay",
    "Rows",
    "Written",
    "search_job",
    "stream_characterization",
    "sweep_job",
]

SEARCH = "search"  # the search shard's name; a swept configuration's is its own ("found", "default", …)
_RECORDS = ("levels/", "search/")  # a unit's record: written after the stamps it summarises
_NOT_SENT = ("manifest.json", ".lock", "engines/", "rows.parquet")  # the driver's, or sent at the end


@dataclass(frozen=True)
class Written:
    """Files a worker's runner stored (relative path, bytes), and the engine it measured them on."""

    files: list[tuple[str, bytes]]
    engine_version: str | None


@dataclass(frozen=True)
class Rows:
    rows: list[DatasetRow]


def _order(rel: str) -> int:
    return 1 if rel.startswith(_RECORDS) else 0


def _seed(folder: CharacterizeFolder, name: str) -> list[tuple[str, bytes]]:
    """What a worker needs of the run folder to go on where the shard ``name`` stopped."""
    root = folder.root
    stored = root / "search" if name == SEARCH else root / "levels" / name
    paths = [folder.manifest_path, *sorted(stored.rglob("*.json"))]
    return [(p.relative_to(root).as_posix(), p.read_bytes()) for p in paths]


@dataclass
class CharacterizeRelay:
    """The driver's side of one remote shard: its files into the run folder, its rows as a local run's."""

    runner: CharacterizeRunner  # the driver's
    engine_version: str | None = None

    def apply(self, message: object) -> None:
        if isinstance(message, Written | Finished):
            write_files(self.runner.folder.root, message.files, _order)
        if isinstance(message, Written):
            self.engine_version = message.engine_version or self.engine_version
        elif isinstance(message, Rows):
            self.runner.rows(message.rows)


class _Body:
    """A shard on a worker: a runner over a scratch copy of the run folder, sending what it stores."""

    def __init__(
        self, config: CharacterizeConfig, root: Path, seed: list[tuple[str, bytes]], name: str,
        spec: EngineSpec | None, emit: Emit,
    ) -> None:  # fmt: skip
        write_files(root, seed, _order)
        watch = FolderWatch(root, _NOT_SENT)
        console = Console(file=sys.stdout, width=160, force_terminal=False, soft_wrap=True)
        self.name, self.spec = name, spec
        self.runner = CharacterizeRunner(
            CharacterizeFolder(root), config, console,
            hardware=hardware_info(NvmlSource.gpu_names()),  # this node's
            rows=lambda rows: emit(Rows(rows)),
            stored=lambda: emit(Written(watch.changed(), self.runner.engine_version)),
        )  # fmt: skip

    async def measure(self, timing: Timing) -> None:
        self.runner.timing = timing  # sent back at the end: the shard's own account
        if self.spec is None:
            await self.runner.search()
        else:
            await self.runner.sweep(self.name, self.spec)

    def end_files(self) -> list[tuple[str, bytes]]:
        root = self.runner.folder.root
        logs = sorted((root / "engines").glob("*.log"))
        return [(p.relative_to(root).as_posix(), p.read_bytes()) for p in logs]


def stream_characterization(
    config: CharacterizeConfig,
    run_id: str,
    name: str,
    spec: EngineSpec | None,
    seed: list[tuple[str, bytes]],
    options: TaskOptions,
) -> Iterator[object]:
    """On a worker: the shard ``name`` (the search when ``spec`` is None) of run ``run_id``, as messages."""

    def body(scratch: Path, emit: Emit) -> TaskBody:
        return _Body(config, scratch / run_id, seed, name, spec, emit)

    return stream_task(name, options.hardware or "", options, body)


def _job(runner: CharacterizeRunner, name: str, spec: EngineSpec | None, total: int) -> ShardJob:
    engine = spec or runner.config.base_spec()

    async def local() -> None:
        await (runner.search() if spec is None else runner.sweep(name, spec))

    def done() -> int:
        return int(runner.stored_search() is not None) if spec is None else len(runner.done_levels(name))

    return ShardJob(
        name=name,
        chunk=engine.chunk_size or 0,
        part=name,
        spec=engine,
        hardware=hardware_name(runner.folder.read_manifest().hardware),
        folder=runner.folder,
        local=local,
        task=stream_characterization,
        args=lambda: (runner.config, runner.run_id, name, spec, _seed(runner.folder, name)),
        relay=lambda: CharacterizeRelay(runner),
        done=done,
        total=total,
        engine_version=lambda: runner.engine_version,
    )


def search_job(runner: CharacterizeRunner) -> ShardJob:
    """The batch-budget search as one shard (its probes in turn, each on its own engine)."""
    return _job(runner, SEARCH, None, 1)


def sweep_job(runner: CharacterizeRunner, name: str, spec: EngineSpec) -> ShardJob:
    """The users sweep of the configuration ``name`` (engine ``spec``) as one shard."""
    return _job(runner, name, spec, len(runner.config.sweep.users))
