"""Engine steps as the engine reports them: vLLM's per-iteration log lines, SGLang's per-batch log
lines, or the sim's step log.

A ``StepSource`` marks a point (``await mark()``) and later returns every step after it
(``await since(mark)``); its ``mode`` says how the engine runs its steps (read from its start-up lines)
and so where each step's duration came from (``engine_harness.step_modes``). vLLM started with
``--enable-logging-iteration-details`` writes one line per step (``Iteration(N): a context requests, b
context tokens, c generation requests, d generation tokens, iteration elapsed time: t ms``), stamped
``@<epoch s>`` by the suite's logging config (``vllm_logging.json``); the source reads the engine's log
file from a byte offset. SGLang logs every batch it ran ("Prefill batch, …" / "Decode batch, …": see
``SglangLogStepSource``). The simulated engine serves its ground-truth step log at ``GET /sim/steps``,
or, in its GPU-like modes, logs like CUDA vLLM and is read as vLLM is.
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
from engine_harness.step_modes import StepMode, StepTiming, sglang_step_mode, vllm_step_mode, with_timing

__all__ = [
    "VLLM_LOGGING_CONFIG",
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
        description="the whole step's duration (engine_harness.step_modes): the engine's own field where it "
        "times whole steps, else the interval from the previous step line's stamp; None where neither is "
        "known (the first step after the mark, a mode that could not be determined)",
    )
    reported_ms: float | None = Field(
        None, ge=0, description="the engine's own elapsed field as logged (vLLM's 'iteration elapsed time'), "
        "whatever it timed in the engine's mode: kept to compare, never fitted"
    )  # fmt: skip
    t_end_s: float | None = Field(None, description="the step line's stamp (epoch seconds), where it had one")


_ITERATION = re.compile(
    r"^(?P<head>[^\n]*?)Iteration\((?P<index>\d+)\): (?P<ctx_req>\d+) context requests, "
    r"(?P<ctx_tok>\d+) context tokens, (?P<gen_req>\d+) generation requests, (?P<gen_tok>\d+) generation "
    r"tokens, iteration elapsed time: (?P<ms>[\d.]+) ms(?P<dummy> \(dummy\))?",
    re.MULTILINE,
)
_STAMP = re.compile(r" @(?P<epoch>\d{9,}\.\d+)[ \]]")
# vLLM's logging config (VLLM_LOGGING_CONFIG_PATH) that stamps every line with its epoch time in µs
VLLM_LOGGING_CONFIG = Path(__file__).resolve().parent / "vllm_logging.json"


class StepSource(Protocol):
    mode: StepMode | None

    async def mark(self) -> int: ...

    async def since(self, mark: int) -> list[EngineStep]: ...


def _interval_ms(t: float | None, last: float | None) -> float | None:
    return round((t - last) * 1e3, 3) if t is not None and last is not None and t >= last else None


def parse_iteration_lines(
    text: str, timing: StepTiming | None = "engine_field", previous_t: float | None = None
) -> list[EngineStep]:
    """Every vLLM iteration-details line in ``text`` (dummy steps of idle data-parallel ranks skipped).
    ``timing``: a step's duration is vLLM's own field (``engine_field``: only where it times whole
    steps), the interval from the previous line's stamp (``log_interval``; ``previous_t``: the stamp of
    the step line right before ``text``, if known), or unknown (``None``)."""
    steps, last = [], previous_t
    for m in _ITERATION.finditer(text):
        if m["dummy"]:
            continue
        stamp = _STAMP.search(m["head"])
        t = float(stamp["epoch"]) if stamp else None
        reported = float(m["ms"])
        elapsed = reported if timing == "engine_field" else None
        if timing == "log_interval":
            elapsed = _interval_ms(t, last)
        steps.append(
            EngineStep(
                prefill_tokens=int(m["ctx_tok"]),
                decode_tokens=int(m["gen_tok"]),
                prefill_requests=int(m["ctx_req"]),
                decode_requests=int(m["gen_req"]),
                elapsed_ms=elapsed,
                reported_ms=reported,
                t_end_s=t,
            )
        )
        last = t
    return steps


class _LogStepSource:
    """Step lines an engine appended to its log file after a byte offset; ``parse`` reads them."""

    def __init__(self, log_path: Path, mode: StepMode | None = None) -> None:
        self.log_path = log_path
        self.mode = mode

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
    """vLLM's iteration-details lines, timed as ``mode.timing`` says (no mode: the engine's own field, as
    on the CPU build)."""

    def parse(self, text: str) -> list[EngineStep]:
        return parse_iteration_lines(text, self.mode.timing if self.mode else "engine_field")


class SimStepSource:
    """The simulated engine's ground-truth step log over HTTP."""

    def __init__(self, session: aiohttp.ClientSession, base_url: str) -> None:
        self.session = session
        self.url = f"{base_url.rstrip('/')}/sim/steps"
        self.mode: StepMode | None = None  # known from the first answer

    async def _get(self, since: int) -> dict[str, Any]:
        async with self.session.get(self.url, params={"since": str(since)}) as resp:
            resp.raise_for_status()
            body: dict[str, Any] = await resp.json()
        if self.mode is None:
            self.mode = StepMode(
                engine="sim",
                async_scheduling=False,
                executor="mp",
                cuda_graph_max_tokens=int(body.get("cuda_graph_max_tokens", 0)),
                timing="engine_field",
                evidence=["the sim's ground-truth step log (GET /sim/steps): steps on the engine's clock"],
            )
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
                elapsed_ms=int(s["engine_ns"]) / 1e6,
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
# SGLang's own SGLANG_LOG_MS format (ms) is read too. With the overlap scheduler (on by default on GPU) a
# batch's results are processed, and its line written, after the next batch was launched: the lines stay
# one per step and in order, each written when its step's outputs went out, so the intervals still time
# whole steps as the decodes saw them (as with vLLM's async scheduling, engine_harness.step_modes); the
# record's step mode says the overlap was on.
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
    r"'(?P<name>enable_mixed_chunk|disable_overlap_schedule|decode_log_interval|disable_cuda_graph"
    r"|cuda_graph_max_bs|device)': '?(?P<v>[\w.]+)'?"
)


def _sglang_time(m: re.Match[str]) -> float:
    if m["epoch"]:
        return float(m["epoch"])
    fmt = "%Y-%m-%d %H:%M:%S.%f" if "." in m["date"] else "%Y-%m-%d %H:%M:%S"
    return datetime.strptime(m["date"], fmt).timestamp()


def _sglang_step(
    kind: str, fields: dict[str, int], mixed: bool, elapsed_ms: float | None, t: float
) -> EngineStep:
    running = fields.get("running-req", 0)
    riders = running if kind == "Decode" or mixed else 0
    return EngineStep(
        prefill_tokens=fields.get("new-token", 0) if kind == "Prefill" else 0,
        decode_tokens=riders,
        prefill_requests=fields.get("new-seq", 0) if kind == "Prefill" else 0,
        decode_requests=riders,
        elapsed_ms=elapsed_ms,
        t_end_s=t,
    )


def parse_sglang_step_lines(text: str, mixed: bool, previous_t: float | None = None) -> list[EngineStep]:
    """Every SGLang step line in ``text``, in order. ``mixed``: the engine runs ``--enable-mixed-chunk``.
    ``previous_t``: epoch seconds of the step line right before ``text``, if known (else the first
    step's duration is None)."""
    steps = []
    last = previous_t
    for m in _SGLANG_STEP.finditer(text):
        t = _sglang_time(m)
        fields = {f["name"]: int(f["value"]) for f in _SGLANG_FIELD.finditer(m["body"])}
        steps.append(_sglang_step(m["kind"], fields, mixed, _interval_ms(t, last), t))
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
    """SGLang's scheduler step lines (``mixed``: started with --enable-mixed-chunk), timed by the intervals
    between their stamps."""

    def __init__(self, log_path: Path, mixed: bool, mode: StepMode | None = None) -> None:
        super().__init__(log_path, mode)
        self.mixed = mixed

    def parse(self, text: str) -> list[EngineStep]:
        return parse_sglang_step_lines(text, self.mixed)


# How an engine kind reports its steps (a field of ``engine_harness.engines.EngineKind``): given the
# client's session, the engine's base URL and its log file, a source, or None where the kind has none.
StepSourceFactory = Callable[[aiohttp.ClientSession, str, Path | None], StepSource | None]


def no_step_source(session: aiohttp.ClientSession, base_url: str, log: Path | None) -> StepSource | None:
    return None


def _log_text(log: Path) -> str:
    return log.read_text(encoding="utf-8", errors="replace") if log.exists() else ""


def vllm_step_source(session: aiohttp.ClientSession, base_url: str, log: Path | None) -> StepSource | None:
    """vLLM's per-iteration log lines (the spec's ``log_iteration_details`` must be on), timed as the
    mode vLLM stated at start-up allows (``engine_harness.step_modes``)."""
    if log is None:
        return None
    text = _log_text(log)
    return VllmLogStepSource(log, with_timing(vllm_step_mode(text), _STAMP.search(text) is not None))


def sim_step_source(session: aiohttp.ClientSession, base_url: str, log: Path | None) -> StepSource | None:
    """The sim's ground-truth step log; in its GPU-like modes (``--vllm-log``) it logs like CUDA vLLM, and
    is read as vLLM is, so the derivation the sim checks is the one real runs get."""
    if log is not None and "Initializing a V1 LLM engine" in _log_text(log):
        return vllm_step_source(session, base_url, log)
    return SimStepSource(session, base_url)


def sglang_step_source(session: aiohttp.ClientSession, base_url: str, log: Path | None) -> StepSource | None:
    """SGLang's per-batch log lines, read in the scheduling mode its log states; None where the lines
    are not one per step (--decode-log-interval other than 1)."""
    if log is None or not log.exists():
        return None
    settings = sglang_settings(_log_text(log))
    if not settings or settings.get("decode_log_interval") != "1":
        return None
    mode = with_timing(sglang_step_mode(settings), stamped=True)  # dated lines: ms at least, µs stamped
    return SglangLogStepSource(log, mixed=settings.get("enable_mixed_chunk") == "True", mode=mode)
