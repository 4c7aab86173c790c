"""Engine steps as the engine reports them: vLLM's per-iteration log lines, SGLang's per-batch log
lines, or the sim's step log.

A ``StepSource`` marks a point (``await mark()``) and later returns every step after it
(``await since(mark)``). vLLM started with ``--enable-logging-iteration-details`` writes one line per
step (``Iteration(N): a context requests, b context tokens, c generation requests, d generation
tokens, iteration elapsed time: t ms``); the source reads the engine's log file from a byte offset.
SGLang logs every batch it ran ("Prefill batch, …" / "Decode batch, …": see ``SglangLogStepSource``).
The simulated engine serves its ground-truth step log at ``GET /sim/steps?since=N``.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any, Protocol

import aiohttp
from pydantic import Field

from benchcore.schema import StrictModel

__all__ = [
    "EngineStep",
    "SglangLogStepSource",
    "SimStepSource",
    "StepSource",
    "StepSourceFactory",
    "VllmLogStepSource",
    "no_step_source",
    "parse_iteration_lines",
    "parse_sglang_step_lines",
    "sglang_step_source",
    "sim_step_source",
    "vllm_step_source",
]


class EngineStep(StrictModel):
    """One engine step as the engine itself reported it (vLLM's per-iteration log, or the sim's)."""

    prefill_tokens: int = Field(ge=0, description="context (prompt) tokens computed in the step")
    decode_tokens: int = Field(ge=0, description="generation tokens computed in the step")
    prefill_requests: int = Field(ge=0)
    decode_requests: int = Field(ge=0)
    elapsed_ms: float | None = Field(
        ge=0,
        description="the step's duration; None where the engine did not report it (SGLang: the first "
        "step after the mark, whose start is not logged)",
    )


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


class _LogStepSource:
    """Step lines an engine appended to its log file after a byte offset; ``parse`` reads them."""

    def __init__(self, log_path: Path) -> None:
        self.log_path = log_path

    def parse(self, text: str) -> list[EngineStep]:
        raise NotImplementedError

    async def mark(self) -> int:
        return self.log_path.stat().st_size if self.log_path.exists() else 0

    async def since(self, mark: int) -> list[EngineStep]:
        with self.log_path.open("rb") as f:
            f.seek(mark)
            text = f.read().decode("utf-8", "replace")
        # only whole lines: the engine may be writing the last one right now
        return self.parse(text[: text.rfind("\n") + 1])


class VllmLogStepSource(_LogStepSource):
    """vLLM's iteration-details lines."""

    def parse(self, text: str) -> list[EngineStep]:
        return parse_iteration_lines(text)


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


# -- SGLang -----------------------------------------------------------------------------------------
# Why this source. SGLang 0.5.23 has no tokens-per-step histogram and logs no step duration. Its
# scheduler logs every prefill batch after it ran ("Prefill batch, #new-seq: 1, #new-token: 2048,
# #cached-token: 0, …, #running-req: 4, …") and every --decode-log-interval-th decode batch ("Decode
# batch, #running-req: 4, …"), from process_batch_result once the step's outputs are sent: with
# --decode-log-interval 1 that is one line per engine step, vLLM's --enable-logging-iteration-details
# coverage. The per-step alternatives do not serve a CPU box: the forward-pass metrics publisher
# (--enable-forward-pass-metrics, wall time per step over ZMQ) times steps with device events, and
# sglang:per_stage_req_latency_seconds{stage="chunked_prefill"} is a per-request count and sum.
# So: tokens and requests per step as SGLang states them, and a step's duration as the interval from the
# previous step's line to its own (one scheduler loop: schedule, forward, outputs), stamped with the
# record's epoch time in µs that engine_harness/sglang_logging.json adds ("@1795391674.359937");
# SGLang's own SGLANG_LOG_MS format (ms) is read too. With the overlap scheduler a step's results are
# handled after the next step ran, so its lines come a step late: the source needs it off.
# What SGLang does not report stays None: the first step after the mark has no duration (its start is
# not logged; the engine may have been idle), and a prefill line counts the running batch before mixing,
# not whether it rode along: its decode tokens are that batch when the engine runs --enable-mixed-chunk
# (SGLang's mix_with_running), else 0.

_SGLANG_STEP = re.compile(
    r"^\[(?P<date>\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)?)(?: @(?P<epoch>\d+\.\d+))?[^\]]*\] "
    r"(?P<kind>Prefill|Decode) batch(?: \[\d+\])?, (?P<body>.*)$",
    re.MULTILINE,
)
_SGLANG_FIELD = re.compile(r"#(?P<name>[a-z-]+): (?P<value>\d+)")
_SGLANG_ARG = re.compile(
    r"'(?P<name>enable_mixed_chunk|disable_overlap_schedule|decode_log_interval)': (?P<v>\w+)"
)


def _sglang_time(m: re.Match[str]) -> float:
    if m["epoch"]:
        return float(m["epoch"])
    fmt = "%Y-%m-%d %H:%M:%S.%f" if "." in m["date"] else "%Y-%m-%d %H:%M:%S"
    return datetime.strptime(m["date"], fmt).timestamp()


def _sglang_step(kind: str, fields: dict[str, int], mixed: bool, elapsed_ms: float | None) -> EngineStep:
    running = fields.get("running-req", 0)
    if kind == "Decode":
        return EngineStep(
            prefill_tokens=0,
            decode_tokens=running,
            prefill_requests=0,
            decode_requests=running,
            elapsed_ms=elapsed_ms,
        )
    riders = running if mixed else 0
    return EngineStep(
        prefill_tokens=fields.get("new-token", 0),
        decode_tokens=riders,
        prefill_requests=fields.get("new-seq", 0),
        decode_requests=riders,
        elapsed_ms=elapsed_ms,
    )


def parse_sglang_step_lines(text: str, mixed: bool, previous_t: float | None = None) -> list[EngineStep]:
    """Every SGLang step line in ``text``, in order. ``mixed``: the engine runs ``--enable-mixed-chunk``.
    ``previous_t``: epoch seconds of the step line right before ``text``, if known (else the first
    step's duration is None)."""
    steps = []
    last = previous_t
    for m in _SGLANG_STEP.finditer(text):
        t = _sglang_time(m)
        elapsed = round((t - last) * 1e3, 3) if last is not None and t >= last else None
        fields = {f["name"]: int(f["value"]) for f in _SGLANG_FIELD.finditer(m["body"])}
        steps.append(_sglang_step(m["kind"], fields, mixed, elapsed))
        last = t
    return steps


def sglang_settings(log_text: str) -> dict[str, str] | None:
    """The scheduling settings of the last SGLang start in a log (its ``server_args=…`` line), or None."""
    start = log_text.rfind("server_args=")
    if start < 0:
        return None
    line = log_text[start : log_text.find("\n", start) if "\n" in log_text[start:] else None]
    return {m["name"]: m["v"] for m in _SGLANG_ARG.finditer(line)}


class SglangLogStepSource(_LogStepSource):
    """SGLang's scheduler step lines (``mixed``: started with --enable-mixed-chunk)."""

    def __init__(self, log_path: Path, mixed: bool) -> None:
        super().__init__(log_path)
        self.mixed = mixed

    def parse(self, text: str) -> list[EngineStep]:
        return parse_sglang_step_lines(text, self.mixed)


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


def sglang_step_source(session: aiohttp.ClientSession, base_url: str, log: Path | None) -> StepSource | None:
    """SGLang's per-batch log lines, read in the scheduling mode its log states; None where the lines
    are not one per step in order (overlap scheduler on, or --decode-log-interval other than 1)."""
    if log is None or not log.exists():
        return None
    settings = sglang_settings(log.read_text(encoding="utf-8", errors="replace"))
    if not settings or settings.get("disable_overlap_schedule") != "True":
        return None
    if settings.get("decode_log_interval") != "1":
        return None
    return SglangLogStepSource(log, mixed=settings.get("enable_mixed_chunk") == "True")
