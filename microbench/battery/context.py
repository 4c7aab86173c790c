"""What a battery test gets: the engine, the profile, workloads, a way to run stages, and shared estimates.

``BatteryContext.run(label, stages)`` runs load-generator stages, writes their trace under
``traces/<label>/`` (raw timestamps, so any statistic can be recomputed, and the engine's /metrics sampled
during the run) and returns a ``Run`` with the
trace frame, per-request latencies and each stage's window. Estimates one test produces and others need
(the capacity measurement and its ledger of every load level; maximum concurrency from 5.5) are memoised here.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from engine_harness.handles import EngineHandle, EngineOverrides
from engine_harness.metrics import MetricsError, Snapshot, scrape
from microbench.battery.profiles import Profile
from microbench.battery.progress import progress_line
from microbench.client.requests import ApiSettings, RequestSpec
from microbench.client.session import engine_session
from microbench.loadgen.metrics_series import DEFAULT_INTERVAL_S, MetricsSampler, series_frame, series_header
from microbench.loadgen.stages import SessionSettings, Stage
from microbench.loadgen.trace import write_trace
from microbench.loadgen.workers import SentCount, run_sessions
from microbench.measure.capacity import CapacityPlan, CapacitySearch, capacity_ledger, measure_capacity
from microbench.measure.runs import Run, run_of
from microbench.measure.saturation import SATURATION_RULE
from microbench.measure.sustainable import Capacity, LedgerEntry, capacity_from
from microbench.workloads.generator import Workload
from microbench.workloads.prompts import PromptFactory, TextRenderer, as_prompt
from microbench.workloads.reference import load_workload
from microbench.workloads.spec import WorkloadSpec

__all__ = ["BatteryContext"]


@dataclass
class BatteryContext:
    """Shared by the tests of one battery run."""

    engine: EngineHandle
    model: str
    profile: Profile
    workload_name: str = "synthetic-uniform"
    seed: int = 0
    out_dir: Path | None = None
    max_model_len: int | None = None
    drain_timeout_s: float = 120.0
    guardrail_configs: dict[str, str | EngineOverrides] = field(default_factory=dict)  # URL or settings
    ttft_slo_ms: float | None = None
    tpot_slo_ms: float | None = None
    accelerators: int = 0
    cpu_count: int = 1
    estimates: dict[str, float] = field(default_factory=dict)
    ledger: list[LedgerEntry] = field(default_factory=list)
    search: CapacitySearch | None = None  # once measured
    capacity_note: str | None = None
    on_capacity: Callable[[], None] | None = None  # called once the capacity is measured (saves state)
    emit: Callable[[str], None] | None = None  # progress lines of long load runs (None: quiet)
    progress_every_s: float = 60.0
    metrics_interval_s: float = DEFAULT_INTERVAL_S  # the engine's /metrics sampled this often during runs
    workers: int = 1  # load-generation processes (microbench.loadgen.workers); 1: this one
    prompts: PromptFactory = field(default_factory=PromptFactory)
    text: TextRenderer | None = None  # text prompts (the chat API) through the model's tokenizer
    api_kind: Literal["completions", "chat"] = "completions"
    prompt_disclosure: dict[str, Any] = field(default_factory=dict)  # form, token space, salt, tokenizer
    sut_boundary: str | None = None  # as stated by the user (None: measured or not stated)
    guardrails: str | None = None
    sharegpt_path: str | None = None  # the conversation workload's ShareGPT file (None: its stand-in)
    _runs: int = 0
    _labels: set[str] = field(default_factory=set)

    @property
    def api(self) -> ApiSettings:
        return ApiSettings(model=self.model, api=self.api_kind)

    def workload_spec(self, name: str | None = None) -> WorkloadSpec:
        """A reference workload by name or a spec YAML path (default: the battery's ``--workload``)."""
        name = name or self.workload_name
        sharegpt = self.sharegpt_path if name == "conversation" else None
        return load_workload(name, max_model_len=self.max_model_len, sharegpt_path=sharegpt)

    def requests(self, spec: WorkloadSpec, prompts: PromptFactory | None = None) -> Iterator[RequestSpec]:
        """Endless requests of ``spec``, fitted to the engine's context and capped by the profile."""
        workload = Workload(spec, prompts or self.prompts, text=self.text, max_model_len=self.max_model_len)
        cap = self.profile.output_cap
        for request in workload.requests():
            if cap is not None and request.max_tokens > cap:
                request = dataclasses.replace(request, max_tokens=cap)
            yield request

    def fixed_requests(self, input_tokens: int, output_tokens: int) -> Iterator[RequestSpec]:
        """Endless cold requests of exactly ``input_tokens`` in and ``output_tokens`` out (drafts: the
        worker that sends one makes its prompt)."""
        while True:
            build = functools.partial(self._prompt, self.prompts.cold, input_tokens, self.prompts.item())
            yield RequestSpec([], input_tokens, output_tokens, build_prompt=build)

    def document_requests(self, input_tokens: int, output_tokens: int) -> Iterator[RequestSpec]:
        """Endless Long Context requests (IETF A.5): a cold document and the fixed question, ``input_tokens``
        in all, ``output_tokens`` out (drafts, as ``fixed_requests``)."""
        while True:
            draw = self.prompts.document_question
            build = functools.partial(self._prompt, draw, input_tokens, self.prompts.item())
            yield RequestSpec([], input_tokens, output_tokens, build_prompt=build)

    def _prompt(self, draw: Callable[..., list[int]], n: int, item: int) -> tuple[list[int] | str, int]:
        return as_prompt(draw(n, item=item), self.text)

    async def run(self, label: str, stages: list[Stage], base_url: str | None = None) -> Run:
        """Run ``stages`` against the engine (or ``base_url``) and keep their trace."""
        settings = SessionSettings(
            base_url=base_url or self.engine.base_url,
            api=self.api,
            drain_timeout_s=self.drain_timeout_s,
            api_key_env=self.engine.api_key_env,
        )
        sampler = MetricsSampler(self.engine.base_url, self.engine.metrics, self.metrics_interval_s)
        sent = SentCount(self.workers)
        async with sampler:
            ticker = asyncio.create_task(self._tick(label, sent, stages)) if self.emit else None
            try:
                result = await run_sessions(settings, stages, self.workers, sent=sent)
            finally:
                if ticker is not None:
                    ticker.cancel()
        series = series_frame(sampler.samples, result.t0_ns)
        self._runs += 1
        if self.out_dir is not None:
            folder = self.out_dir / "traces" / label
            if label in self._labels:  # a repeated label (warm-up after a restart) keeps both traces
                folder = folder.with_name(f"{folder.name}-{self._runs}")
            self._labels.add(label)
            spec = self.workload_spec()  # the battery's workload; a test's own is named by its label
            write_trace(
                folder,
                result,
                workload={"battery_label": label, "name": spec.name, "spec": spec.model_dump(mode="json")},
                seed=spec.seed,
                prompts=self.prompt_disclosure,
                engine={"base_url": settings.base_url, "model": self.model, "kind": self.engine.kind,
                        "api": self.api_kind, "settings": self.engine.settings},
                metrics=(series, series_header(sampler, series)),
            )  # fmt: skip
        return run_of(result, series)

    async def _tick(self, label: str, sent: SentCount, stages: list[Stage]) -> None:
        """Print a progress line every ``progress_every_s`` while ``stages`` run (reads only the workers'
        counts of requests sent)."""
        assert self.emit is not None
        counts = [s.max_requests for s in stages]
        durations = [s.duration_s for s in stages]
        planned_n = None if None in counts else sum(c or 0 for c in counts)
        planned_s = None if None in durations else sum(d or 0.0 for d in durations)
        t0 = time.perf_counter()
        while True:
            await asyncio.sleep(self.progress_every_s)
            done = sent.total()
            self.emit(progress_line(label, done, time.perf_counter() - t0, planned_n, planned_s))

    async def scrape(self, base_url: str | None = None) -> Snapshot | None:
        """A /metrics snapshot, or None when the engine exposes none (external gateways)."""
        async with engine_session() as http:
            try:
                return await scrape(http, base_url or self.engine.base_url)
            except MetricsError:
                return None

    async def wait_idle(self, timeout_s: float = 60.0) -> bool | None:
        """Until the engine reports no running or waiting request; None if it does not report them."""
        deadline = time.monotonic() + timeout_s
        names = self.engine.metrics
        while True:
            snap = await self.scrape()
            if snap is None:
                return None
            running = snap.total(names.requests_running)
            waiting = snap.total(names.requests_waiting)
            if running is None and waiting is None:
                return None
            if (running or 0) + (waiting or 0) == 0:
                return True
            if time.monotonic() > deadline:
                return False
            await asyncio.sleep(0.05)

    async def capacity_search(self) -> CapacitySearch:
        """The one capacity measurement (5.2.3), run when a test first asks; its levels join ``ledger``."""
        if self.search is None:
            spec = self.workload_spec()
            self.search = await measure_capacity(self.run, lambda: self.requests(spec), self.capacity_plan())
            self.ledger += capacity_ledger(self.search, "5.2")
            if self.on_capacity is not None:
                self.on_capacity()
        return self.search

    async def capacity_rps(self) -> float:
        """The battery's sustainable open-loop rate (req/s), from the one capacity measurement.

        Measured the first time a test asks (``measure.capacity.measure_capacity``: closed-loop ramp,
        then an open-loop search, every level in ``ledger`` as 5.2's). When no open-loop level was
        sustainable, half the lowest rate probed stands in, and ``capacity_note`` says so.
        """
        search = await self.capacity_search()
        if search.sustainable_rps is not None:
            return search.sustainable_rps
        lowest = min(s.value for s in search.search)
        self.capacity_note = (
            "no open-loop level was sustainable; loads scale by half the lowest probed rate "
            f"({lowest:.2f} req/s)"
        )
        return lowest / 2

    def capacity_plan(self) -> CapacityPlan:
        """The profile's capacity settings, the run's seed and SLOs (5.2's search; 5.6's, 5.10's ramps)."""
        p = self.profile
        return CapacityPlan(
            start_concurrency=p.probe_concurrency,
            max_concurrency=p.capacity_max,
            level_duration_s=p.level_duration_s,
            closed_ttft_p99_ms=p.capacity_ttft_p99_ms,
            search_probes=p.search_probes,
            seed=self.seed,
            ttft_slo_ms=self.ttft_slo_ms,
            tpot_slo_ms=self.tpot_slo_ms,
        )

    def capacity(self) -> Capacity:
        """Max sustainable throughput, rate and peak over every level entered so far."""
        return capacity_from(self.ledger, SATURATION_RULE)
