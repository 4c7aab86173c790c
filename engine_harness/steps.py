"""Engine steps as the engine reports them: vLLM's per-iteration log lines, or the sim's step log.

A ``StepSource`` marks a point (``await mark()``) and later returns every step after it
(``await since(mark)``). vLLM started with ``--enable-logging-iteration-details`` writes one line per
step (``Iteration(N): a context requests, b context tokens, c generation requests, d generation
tokens, iteration elapsed time: t ms``); the source reads the engine's log file from a byte offset.
The simulated engine serves its ground-truth step log at ``GET /sim/steps?since=N``.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

import aiohttp
from pydantic import Field

from benchcore.schema import StrictModel

__all__ = [
    "EngineStep",
    "SimStepSource",
    "StepSource",
    "StepSourceFactory",
    "VllmLogStepSource",
    "no_step_source",
    "parse_iteration_lines",
    "sim_step_source",
    "vllm_step_source",
]


class EngineStep(StrictModel):
    """One engine step as the engine itself reported it (vLLM's per-iteration log, or the sim's)."""

    prefill_tokens: int = Field(ge=0, description="context (prompt) tokens computed in the step")
    decode_tokens: int = Field(ge=0, description="generation tokens computed in the step")
    prefill_requests: int = Field(ge=0)
    decode_requests: int = Field(ge=0)
    elapsed_ms: float = Field(ge=0)


_ITERATION = re.compile(
    r"Iteration\((?P<index>\d+)\): (?P<ctx_req>\d+) context requests, (?P<ctx_tok>\d+) context tokens, "
    r"(?P<gen_req>\d+) generation requests, (?P<gen_tok>\d+) generation tokens, "
    r"iteration elapsed time: (?P<ms>[\d.]+) ms(?P<dummy> \(dummy\))?"
)


class StepSource(Protocol):
    async def mark(self) -> int: ...

    async def since(self, mark: int) -> list[EngineStep]: ...


def parse_iteration_lines(text: str) -> list[EngineStep]:
    """Every vLLM iteration-details line in ``text`` (dummy steps of idle data-parallel ranks skipped)."""
    steps = []
    for m in _ITERATION.finditer(text):
        if m["dummy"]:
            continue
        steps.append(
            EngineStep(
                prefill_tokens=int(m["ctx_tok"]),
                decode_tokens=int(m["gen_tok"]),
                prefill_requests=int(m["ctx_req"]),
                decode_requests=int(m["gen_req"]),
                elapsed_ms=float(m["ms"]),
            )
        )
    return steps


class VllmLogStepSource:
    """Reads iteration lines appended to a vLLM log file after a byte offset."""

    def __init__(self, log_path: Path) -> None:
        self.log_path = log_path

    async def mark(self) -> int:
        return self.log_path.stat().st_size if self.log_path.exists() else 0

    async def since(self, mark: int) -> list[EngineStep]:
        with self.log_path.open("rb") as f:
            f.seek(mark)
            text = f.read().decode("utf-8", "replace")
        # only whole lines: the engine may be writing the last one right now
        return parse_iteration_lines(text[: text.rfind("\n") + 1])


class SimStepSource:
    """The simulated engine's ground-truth step log over HTTP."""

    def __init__(self, session: aiohttp.ClientSession, base_url: str) -> None:
        self.session = session
        self.url = f"{base_url.rstrip('/')}/sim/steps"

    async def _get(self, since: int) -> dict[str, Any]:
        async with self.session.get(self.url, params={"since": str(since)}) as resp:
            resp.raise_for_status()
            body: dict[str, Any] = await resp.json()
        return body

    async def mark(self) -> int:
        return int((await self._get(1 << 62))["next"])

    async def since(self, mark: int) -> list[EngineStep]:
        return [
            EngineStep(
                prefill_tokens=int(s["prefill_tokens"]),
                decode_tokens=int(s["decode_tokens"]),
                prefill_requests=int(s["num_prefill_reqs"]),
                decode_requests=int(s["num_decode_reqs"]),
                elapsed_ms=int(s["duration_ns"]) / 1e6,
            )
            for s in (await self._get(mark))["steps"]
        ]


# How an engine kind reports its steps (a field of ``engine_harness.engines.EngineKind``): given the
# client's session, the engine's base URL and its log file, a source, or None where the kind has none.
StepSourceFactory = Callable[[aiohttp.ClientSession, str, Path | None], StepSource | None]


def no_step_source(session: aiohttp.ClientSession, base_url: str, log: Path | None) -> StepSource | None:
    return None


def vllm_step_source(session: aiohttp.ClientSession, base_url: str, log: Path | None) -> StepSource | None:
    """vLLM's per-iteration log lines (the spec's ``log_iteration_details`` must be on)."""
    return VllmLogStepSource(log) if log is not None else None


def sim_step_source(session: aiohttp.ClientSession, base_url: str, log: Path | None) -> StepSource | None:
    return SimStepSource(session, base_url)
