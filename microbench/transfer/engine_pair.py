"""The engines of a transfer run, from its config: the shared pair and lone engine of the measurement floor
(``microbench.measure.engine_pair``) with the producer's and consumer's specs of a ``TransferConfig``."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

from rich.console import Console

from engine_harness.kv_connectors import ConnectorPreset
from engine_harness.launch import EngineProcess
from microbench.measure import engine_pair as shared
from microbench.results.layout import TransferFolder
from microbench.transfer.config import TransferConfig

__all__ = ["alone_engine", "check_runnable", "engine_pair"]


def check_runnable(cfg: TransferConfig, preset: ConnectorPreset) -> None:
    """Refuse a GPU-only preset on this box and a connector whose package is missing, with the fix."""
    shared.check_runnable(cfg.producer_spec().kind, preset)


@contextlib.asynccontextmanager
async def engine_pair(
    folder: TransferFolder, cfg: TransferConfig, preset: ConnectorPreset, console: Console
) -> AsyncIterator[tuple[EngineProcess, EngineProcess]]:
    """Producer and consumer of ``cfg`` started together; both stopped on every exit path."""
    async with shared.engine_pair(
        folder, cfg.producer_spec(), cfg.consumer_spec(), preset, console,
        startup_timeout_s=cfg.startup_timeout_s, pin=cfg.pin_engine_threads,
    ) as pair:  # fmt: skip
        yield pair


@contextlib.asynccontextmanager
async def alone_engine(
    folder: TransferFolder, cfg: TransferConfig, console: Console
) -> AsyncIterator[EngineProcess]:
    """The producer's engine started alone: same settings and cores, no connector, no peer."""
    async with shared.alone_engine(
        folder, cfg.producer_spec(), console, startup_timeout_s=cfg.startup_timeout_s,
        pin=cfg.pin_engine_threads,
    ) as engine:  # fmt: skip
        yield engine
