"""Fit → sim: a sweep run folder's fitted step model and engine settings as one simulator configuration.

``fit_to_sim(run_dirs)`` fits the one step-time model (``analysis.models.fit_step_model``) to the steps of
one sweep run folder, or of several pooled (same engine, same settings: e.g. one grid swept at two decode
contexts, whose cost per context token one context cannot tell from the per-decode cost), the API
server's share of the first token (``analysis.frontend.fit_frontend``, less what the replay charges the
prefill steps beyond their log where that share held it too) where the run has it, and reads the
engine's settings from the manifest: the token budget (the chunk size the prediction is for), seats
(``max_num_seqs``), block size, KV capacity (vLLM CPU: ``cpu_kvcache_gib`` over the model's KV bytes per
token; SGLang: ``max_total_tokens``), prefix caching and the scheduling mode (vLLM; SGLang's default, a
prefill step replacing the decodes; SGLang ``--enable-mixed-chunk``). Every setting is listed
as *matched* (read from the run) or *defaulted* (the engine's default, said so), as seed 003 §9 asks.

``SimSettings.sim_params()`` is the same configuration as the simulated engine's ``--params`` YAML, so the
replay (``analysis.calibrate.replay``) and a sim server started from it schedule and price steps alike
(the stream time per step, ``analysis.calibrate.stream_time``, goes in as the sim's host work per step;
its per-streamed-token part and the prefill extra, ``analysis.calibrate.prefill_time``, have no sim
counterpart and are the replay's alone), and so do they charge the
first step after an idle spell the wake cost the runs' wake probes measured (``analysis.calibrate.wake``;
none where no run probed).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pydantic import Field

from analysis.calibrate.prefill_time import (
    PrefillTimeFit,
    beyond_log_ms,
    charged_ms,
    charged_twice_ms,
    fit_prefill_time,
)
from analysis.calibrate.stream_time import StreamTimeFit, fit_stream_time
from analysis.calibrate.wake import fit_wake
from analysis.frontend import fit_frontend
from analysis.models import StepFit, fit_step_model
from analysis.table import load_manifest, load_records
from benchcore.schema import StrictModel
from engine_harness.model_kv import read_model_kv
from engine_harness.scheduler_model import SchedulerMode
from engine_harness.spec import MODELS_DIR, SpecFields
from engine_harness.step_model import StepModel
from engine_harness.wake_model import WakeCost
from microbench.results.layout import RunFolder
from microbench.results.records import RunRecord

__all__ = ["DEFAULT_BLOCK_SIZE", "FitSummary", "SimSettings", "fit_to_sim"]

# Block (page) size an engine uses when not told: vLLM's CPU backend 128, vLLM on GPU 16, SGLang 1 token.
DEFAULT_BLOCK_SIZE = {"vllm-cpu": 128, "vllm": 16, "sglang": 1, "sim": 16, "external": 16}
DEFAULT_MAX_NUM_SEQS = {"vllm": 256, "sglang": 256, "sim": 256, "external": 256}  # their defaults
DEFAULT_KV_BLOCKS = 65536  # the sim's own pool where the run does not say how big the engine's was


class FitSummary(StrictModel):
    """Where the configuration's step model came from and how good the fit was."""

    run: str = Field(description="the sweep run folder fitted (its manifest gives the engine's settings)")
    pooled: list[str] = Field(
        default_factory=list, description="further sweep run folders of the same engine, steps pooled"
    )
    candidate: str = Field(description="the step-model candidate chosen (analysis.steps.CANDIDATES)")
    r2: float
    loo_step_mape_pct: float | None = Field(
        description="leave-one-P-out median error of held-out steps (%); None: no P could be held out (the "
        "other P values cannot determine every coefficient, e.g. 3 single-chunk P values for α + κ, β_c, γ)"
    )
    n_steps: int
    clipped: list[str] = Field(default_factory=list, description="negative estimates set to 0 (name=value)")


_PER_STEP = ("stream_fixed_ms", "stream_ms_per_token", "prefill_extra_ms", "prefill_extra_ns_per_token")


class SimSettings(StrictModel):
    """A simulated engine configured from a fit: scheduling, capacity, step model, API-server time."""

    kind: str = Field(description="the engine kind the run measured (vllm, sglang, sim, external)")
    mode: SchedulerMode
    max_num_batched_tokens: int = Field(ge=1)
    max_num_seqs: int = Field(ge=1)
    block_size: int = Field(ge=1)
    num_kv_blocks: int = Field(ge=1)
    enable_prefix_caching: bool
    max_model_len: int = Field(ge=2)
    frontend_ns_per_token: float = Field(ge=0, description="API-server time per prompt token (ns)")
    frontend_fixed_ms: float = Field(
        ge=0, description="the rest of the API server's and the network's time per request (ms)"
    )
    stream_fixed_ms: float = Field(
        0.0, ge=0, description="time per step the engine's step log leaves out (API server, hand-off; ms)"
    )
    stream_ms_per_token: float = Field(
        0.0, ge=0, description="the API server's time per token a step streams (ms; stream_time.py)"
    )
    prefill_extra_ms: float = Field(
        0.0, ge=0, description="what a step carrying prompt tokens costs beyond its logged time and stream "
        "time (ms; prefill_time.py)"
    )  # fmt: skip
    prefill_extra_ns_per_token: float = Field(
        0.0, ge=0, description="and per prompt token it carries (ns; prefill_time.py)"
    )
    step: StepModel
    wake: WakeCost = Field(
        default_factory=WakeCost, description="extra time of the first step after an idle spell (wake.py)"
    )
    fit: FitSummary
    matched: list[str] = Field(default_factory=list, description="settings read from the run (name=value)")
    defaulted: list[str] = Field(default_factory=list, description="settings not in the run: the default")

    def beyond_log_ms(self, streamed: int, prefill_tokens: int) -> float:
        """What a step streaming ``streamed`` tokens and carrying ``prefill_tokens`` prompt tokens costs
        beyond its logged time (the replay's ``stream_ns``)."""
        return beyond_log_ms(
            streamed,
            prefill_tokens,
            stream_fixed_ms=self.stream_fixed_ms,
            stream_ms_per_token=self.stream_ms_per_token,
            extra_ms=self.prefill_extra_ms,
            extra_ns_per_token=self.prefill_extra_ns_per_token,
        )

    def at_speed(self, factor: float) -> SimSettings:
        """Every time a step costs (its step model, the stream time and prefill extra beyond its log) at
        ``factor``× the fit's; the per-request API-server time and the wake cost stay as fitted."""
        note = f"engine_speed={factor:g} (asked: every step's time at {factor:g}× the fit's)"
        return self.model_copy(
            update={k: getattr(self, k) * factor for k in _PER_STEP}
            | {"step": self.step.scaled(factor), "matched": [*self.matched, note]}
        )

    def sim_params(self) -> dict[str, Any]:
        """The configuration as ``python -m engine_harness.sim --params FILE`` reads it (SimConfig keys)."""
        return {
            "mode": self.mode,
            "max_num_batched_tokens": self.max_num_batched_tokens,
            "max_num_seqs": self.max_num_seqs,
            "block_size": self.block_size,
            "num_kv_blocks": self.num_kv_blocks,
            "enable_prefix_caching": self.enable_prefix_caching,
            "max_model_len": self.max_model_len,
            "frontend_ns_per_token": self.frontend_ns_per_token,
            "host_ms": self.stream_fixed_ms,
            "step": self.step.model_dump(),
            "wake": self.wake.model_dump(),
        }


def _mode(kind: str, spec: dict[str, Any], scheduling: str | None) -> SchedulerMode:
    """The scheduler mode of the run's engine: its kind, SGLang's mixed-chunk flag, the sim's --mode."""
    args = list(spec.get("extra_args") or [])
    if kind == "sim" and "--mode" in args[:-1]:
        mode = args[args.index("--mode") + 1]
        if mode in ("vllm", "sglang", "sglang-mixed"):
            return mode
    if spec.get("mixed_chunk") and kind in ("sglang", "sim"):
        return "sglang-mixed"
    if kind == "sglang" or scheduling == "exclusive":
        return "sglang"
    return "vllm"


def _kv_tokens(kind: str, spec: dict[str, Any]) -> tuple[int | None, str]:
    """The engine's KV pool in tokens and how it was found (None: the run does not say)."""
    if kind == "sglang" and spec.get("max_total_tokens"):
        return int(spec["max_total_tokens"]), f"max_total_tokens={spec['max_total_tokens']}"
    gib = spec.get("cpu_kvcache_gib")
    model = str(spec.get("model") or "")
    if kind == "vllm" and gib and model:
        path = Path(model) if Path(model).exists() else MODELS_DIR / Path(model).name
        kv = read_model_kv(path, spec.get("dtype"))
        if kv is not None:
            tokens = int(float(gib) * 2**30 // kv.kv_bytes_per_token)
            return tokens, f"cpu_kvcache_gib={gib} / {kv.kv_bytes_per_token} B per token of {kv.name}"
    return None, ""


def _step_model(params: dict[str, float], ceiling: int) -> tuple[StepModel, list[str]]:
    """The fitted coefficients as a ``StepModel`` (coefficients the candidate lacks are 0; a negative
    estimate, which a step cannot have, is set to 0 and named)."""
    clipped = [f"{k}={v:.4g}" for k, v in params.items() if v < 0]
    values = {k: max(0.0, float(v)) for k, v in params.items() if math.isfinite(v)}
    return StepModel.model_validate(values | {"cuda_graph_max_tokens": ceiling}), clipped


def _physical_fit(records: list[RunRecord], candidate: str | None) -> StepFit:
    """The step-model fit to simulate with: the named candidate, else the fit's choice unless it has a
    negative coefficient (a step cannot cost less with more work: a term the data cannot pin down, e.g.
    the decodes' context on a small grid), then the next candidate by leave-one-P-out error that has none.
    A candidate whose leave-one-P-out error the grid cannot give (too few prompt lengths for its terms:
    without one P the rest cannot determine it) is never the next one: it fits the grid's few lengths exactly
    and nothing checks it (the first SGLang calibration fit's three single-chunk lengths, 2026-11-25 14:50
    UTC, since replaced, give a prefill step's own fixed cost κ and γ no check: γ comes out 25 ns, against 5.6
    from a grid of nine lengths; with κ in every candidate none of that grid's candidates can be checked, and
    the choice is that exact fit)."""
    fit = fit_step_model(records, candidate)
    if candidate is not None or all(v >= 0 for v in fit.params.values()):
        return fit
    checked = fit.selection.dropna(subset=["loo_p_median_ape_pct"])
    for name in checked.sort_values("loo_p_median_ape_pct")["model"]:
        other = fit_step_model(records, str(name))
        if all(v >= 0 for v in other.params.values()):
            return other
    return fit


# Engine-spec keys that say where or how an engine was reached or logged, not what it computes: two sweep
# runs whose specs differ only in these measured the same engine.
_SPEC_PLACE = frozenset({"python", "host", "port", "url", "api_key_env", "log_iteration_details"})
# A setting a manifest predates (torch_compile, added 2026-11-28) is the default the engine ran with.
_SPEC_DEFAULTS = {n: f.get_default(call_default_factory=True) for n, f in SpecFields.model_fields.items()}


def _pooled_records(run_dirs: Sequence[Path]) -> tuple[dict[str, Any], list[RunRecord]]:
    """The first run's engine spec and the records of every run, which must have measured the same engine
    with the same settings (a fit across two engines' steps describes neither)."""
    spec: dict[str, Any] | None = None
    records: list[RunRecord] = []
    for run_dir in run_dirs:
        manifest = load_manifest(run_dir)
        if manifest is None:
            raise ValueError(f"{run_dir} has no manifest.json: not a sweep run folder")
        this = {k: v for k, v in (_SPEC_DEFAULTS | manifest.engine_spec).items() if k not in _SPEC_PLACE}
        this["engine_version"] = manifest.engine_version
        if spec is None:
            spec = this
        elif this != spec:
            differ = sorted(k for k in spec.keys() | this.keys() if spec.get(k) != this.get(k))
            raise ValueError(
                f"{run_dir} measured another engine or other settings than {run_dirs[0]} "
                f"({', '.join(f'{k}: {spec.get(k)!r} vs {this.get(k)!r}' for k in differ)}): "
                "pool only sweeps of one engine"
            )
        records += load_records(run_dir)
    assert spec is not None
    return spec, records


def fit_to_sim(
    run_dirs: str | Path | Sequence[str | Path],
    chunk_size: int | None = None,
    candidate: str | None = None,
    prefill_extra: bool = True,
) -> SimSettings:
    """The sim configuration fitted from sweep run folder ``run_dirs`` (or several of one engine, their
    steps pooled: the first one's manifest gives the settings) for token budget ``chunk_size`` (default:
    the runs' only chunk size; runs of several need one named). ``candidate``: a step-model candidate
    (default: the fit's own choice). ``prefill_extra`` False: none, and the front end fitted without it
    (``predict --no-prefill-extra``). Raises ``ValueError`` naming what is missing."""
    dirs = [Path(run_dirs)] if isinstance(run_dirs, str | Path) else [Path(d) for d in run_dirs]
    if not dirs:
        raise ValueError("no sweep run folder given")
    run_dir = dirs[0]
    spec, records = _pooled_records(dirs)
    chunks = sorted({r.config.chunk_size for r in records})
    if chunk_size is None:
        if len(chunks) > 1:
            raise ValueError(
                f"{run_dir} measured chunk sizes {chunks}: say which one the prediction is for (--chunk)"
            )
        chunk_size = chunks[0]
    kind = str(spec.get("kind") or "vllm")
    fit = _physical_fit(records, candidate)
    step, clipped = _step_model(fit.params, fit.cuda_graph_max_tokens)
    scheduling = next((r.config.scheduling for r in records if r.config.chunk_size == chunk_size), None)
    matched = [f"max_num_batched_tokens={chunk_size}" + ("" if chunk_size in chunks else " (not measured)")]
    defaulted: list[str] = []

    def setting(name: str, value: Any, default: Any) -> Any:
        if value is None:
            defaulted.append(f"{name}={default} (the engine's default; the run does not say)")
            return default
        matched.append(f"{name}={value}")
        return value

    cpu = kind == "vllm" and bool(spec.get("cpu_kvcache_gib"))
    block = setting("block_size", spec.get("block_size"), DEFAULT_BLOCK_SIZE["vllm-cpu" if cpu else kind])
    seats = setting("max_num_seqs", spec.get("max_num_seqs"), DEFAULT_MAX_NUM_SEQS.get(kind, 256))
    tokens, how = _kv_tokens(kind, spec)
    if tokens is None:
        blocks = DEFAULT_KV_BLOCKS
        defaulted.append(f"num_kv_blocks={blocks} (the run does not say how big the KV pool was)")
    else:
        blocks = max(1, tokens // block)
        matched.append(f"num_kv_blocks={blocks} ({how})")
    max_len = setting("max_model_len", spec.get("max_model_len"), 65536)
    caching = bool(spec.get("prefix_caching", True))
    matched.append(f"enable_prefix_caching={caching}")
    mode = _mode(kind, spec, scheduling)
    matched.append(f"mode={mode} (kind {kind}, scheduling {scheduling or 'mixed'})")
    stream = _stream_time(records, matched, defaulted)
    prefill = _prefill_time(records, stream, matched, defaulted) if prefill_extra else None
    if not prefill_extra:
        defaulted.append("prefill extra=0 (--no-prefill-extra)")
    per_token, fixed = _frontend(records, stream, prefill, matched, defaulted)
    wake = _wake(dirs, chunk_size, matched, defaulted)
    return SimSettings(
        kind=kind,
        mode=mode,
        max_num_batched_tokens=chunk_size,
        max_num_seqs=seats,
        block_size=block,
        num_kv_blocks=blocks,
        enable_prefix_caching=caching,
        max_model_len=max_len,
        frontend_ns_per_token=per_token,
        frontend_fixed_ms=fixed,
        stream_fixed_ms=max(0.0, stream.fixed_ms) if stream else 0.0,
        stream_ms_per_token=max(0.0, stream.per_token_ms) if stream else 0.0,
        prefill_extra_ms=prefill.per_step_ms if prefill else 0.0,
        prefill_extra_ns_per_token=prefill.per_token_ns if prefill else 0.0,
        step=step,
        wake=wake,
        fit=FitSummary(
            run=str(run_dir),
            pooled=[str(d) for d in dirs[1:]],
            candidate=fit.model,
            r2=fit.r2,
            loo_step_mape_pct=fit.loo_step_mape if math.isfinite(fit.loo_step_mape) else None,
            n_steps=fit.n,
            clipped=clipped,
        ),
        matched=matched,
        defaulted=defaulted,
    )


def _stream_time(records: list[RunRecord], matched: list[str], defaulted: list[str]) -> StreamTimeFit | None:
    """The stream time per step (``analysis.calibrate.stream_time``), said in ``matched``; None (and why,
    in ``defaulted``) where the run cannot say."""
    try:
        stream = fit_stream_time(records)
    except ValueError as exc:
        defaulted.append(f"stream time=0 ({exc})")
        return None
    matched.append(stream.text())
    return stream


def _prefill_time(
    records: list[RunRecord], stream: StreamTimeFit | None, matched: list[str], defaulted: list[str]
) -> PrefillTimeFit | None:
    """What a prefill step costs beyond its log and stream time (``analysis.calibrate.prefill_time``),
    said in ``matched``; None (and why, in ``defaulted``) where the run cannot say."""
    if stream is None:
        defaulted.append("prefill extra=0 (no stream time to measure it beyond)")
        return None
    try:
        fit = fit_prefill_time(records, stream)
    except ValueError as exc:
        defaulted.append(f"prefill extra=0 ({exc})")
        return None
    matched.append(fit.text())
    return fit


def _frontend(
    records: list[RunRecord],
    stream: StreamTimeFit | None,
    prefill: PrefillTimeFit | None,
    matched: list[str],
    defaulted: list[str],
) -> tuple[float, float]:
    """(ns per prompt token, fixed ms) of the API server's time (``analysis.frontend``) less what the
    replay charges the prefill steps beyond their log where the record's front-end time held it too."""
    charged = (lambda r: charged_twice_ms(r, charged_ms(r, stream, prefill))) if stream is not None else None
    try:
        front = fit_frontend(records, charged)
    except ValueError as exc:
        defaulted.append(f"frontend=0 ({exc})")
        return 0.0, 0.0
    per_token, fixed = max(0.0, front.per_token_ns), max(0.0, front.fixed_ms)
    less = (
        f" (less the {'stream and prefill' if prefill else 'stream'} time the replay charges)"
        if charged
        else ""
    )
    matched.append(f"frontend: {per_token:.3g} ns/token + {fixed:.3g} ms (fitted, n={front.n}){less}")
    return per_token, fixed


def _wake(dirs: Sequence[Path], chunk_size: int, matched: list[str], defaulted: list[str]) -> WakeCost:
    """The wake cost from the runs' wake probes (those of ``chunk_size``, else every one), said in
    ``matched``; none (and why, in ``defaulted``) where no run probed or the probe gives no reference."""
    probes = [p for d in dirs for p in RunFolder(d).wake_probes()]
    try:
        fit = fit_wake([p for p in probes if p.chunk_size == chunk_size] or probes)
    except ValueError as exc:
        defaulted.append(f"wake=none ({exc})")
        return WakeCost()
    matched.append(fit.text())
    return fit.cost
