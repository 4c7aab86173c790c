"""The calibration report: one typed record of how far a predicted trace is from the real one.

``calibration_report(real_dir, predicted_dir)`` reads both traces (``microbench.results.trace``), pairs
their requests by id (``metrics.split_requests``: warm-up and failed requests excluded and counted) and
computes, per metric (TTFT, TPOT, E2E: paired per request; ITL: the pooled distributions), the statistics
of ``analysis.calibrate.stats``; given a repeat run of the real trace's schedule, the engine's error against
itself beside the prediction's (``analysis.calibrate.repeat``). Markdown, HTML and JSON are renderers of
the one ``CalibrationReport`` (``analysis.calibrate.pages``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import numpy as np
import pandas as pd
from pydantic import Field, model_validator

from analysis.calibrate import stats
from analysis.calibrate.metrics import METRICS, itl_values, request_metrics, split_requests
from analysis.calibrate.repeat import RepeatFloor, repeat_floor
from analysis.calibrate.speed import EngineSpeed, engine_speed
from analysis.calibrate.steps import StepComposition, engine_log_steps, step_composition
from benchcore.schema import StrictModel
from engine_harness.step_model import StepModel
from microbench.results.trace import read_trace

__all__ = [
    "MIN_REQUESTS",
    "BandBias",
    "CalibrationReport",
    "MetricComparison",
    "PercentileError",
    "calibration_report",
]

MIN_REQUESTS = 30  # fewer compared requests: seed 003's "insufficient for statistical significance"
KNOWN_LIMITATIONS = [
    "Prefix cache divergence: the replay builds synthetic prefix token ids per prefix group; prefix-cache "
    "hits may differ from the real server's, especially after evictions.",
    "Speculative decoding is not modelled: tokens are generated one per step per request.",
    "Conversation rounds are replayed as independent requests of their recorded lengths: a round's reuse "
    "of the earlier rounds' KV is not modelled.",
    "Output lengths are the real ones (usage): the prediction does not predict when a model stops.",
]


class PercentileError(StrictModel):
    percentile: float
    real_ms: float
    predicted_ms: float
    error_pct: float


class BandBias(StrictModel):
    """One band of requests by prompt length: its median signed error per paired metric."""

    prompt_tokens: tuple[int, int] = Field(description="shortest and longest prompt of the band")
    n: int
    median_error_pct: dict[str, float] = Field(description="metric → median (predicted − real) / real, %")


class MetricComparison(StrictModel):
    """One metric, real against predicted."""

    metric: Literal["ttft", "tpot", "e2e", "itl"]
    description: str
    paired: bool = Field(description="per-request pairs (TTFT, TPOT, E2E) or only distributions (ITL)")
    n_real: int
    n_predicted: int
    mape_pct: float | None = None
    mape_ci_pct: tuple[float, float] | None = None
    median_ape_pct: float | None = None
    bias_pct: float | None = Field(default=None, description="mean signed error; > 0: over-predicts")
    bias_direction: str | None = None
    pearson_r: float | None = None
    pearson_r_ci: tuple[float, float] | None = None
    percentiles: list[PercentileError]
    ks_d: float
    ks_p: float
    ks_rejects_same: bool = Field(description="p < 0.05: the KS test rejects 'same distribution'")
    qq: list[tuple[float, float, float]] = Field(description="(level, real ms, predicted ms) × 100")
    rating: str | None = Field(default=None, description="seed 003's quality rating (paired metrics)")

    @model_validator(mode="after")
    def _consistent(self) -> MetricComparison:
        if self.mape_pct is not None and self.rating != stats.quality_rating(self.mape_pct, self.pearson_r):
            raise ValueError(f"{self.metric}: rating {self.rating} contradicts MAPE and r")
        if self.ks_rejects_same != (self.ks_p < 0.05):
            raise ValueError(f"{self.metric}: KS verdict contradicts its p-value")
        return self


class CalibrationReport(StrictModel):
    """Everything the calibration says; every renderer draws from it."""

    report_version: Literal[1] = 1  # bump on a breaking change
    real: str
    predicted: str
    prediction: dict[str, object] = Field(default_factory=dict, description="how the prediction was made")
    n_requests: int = Field(description="rows of the real trace")
    n_compared: int
    warmup_excluded: int
    failed_excluded: int = Field(description="requests that did not complete in the real run")
    not_predicted: int = Field(
        description="completed in the real run, missing or incomplete in the prediction"
    )
    duration_s: float = Field(description="the real trace's first send to its last chunk")
    bootstrap: dict[str, int] = Field(description="resamples and seed of the CIs")
    metrics: list[MetricComparison]
    steps: StepComposition | None = Field(default=None, description="the engine's steps against the replay's")
    speed: EngineSpeed | None = Field(
        default=None, description="the engine's decode-only steps over the fit's price"
    )
    by_prompt: list[BandBias] = Field(
        default_factory=list, description="median signed error per quartile of the prompt's length"
    )
    repeat: RepeatFloor | None = Field(
        default=None, description="the engine run again on the same schedule: its error against the real run"
    )
    warnings: list[str] = Field(default_factory=list)
    known_limitations: list[str] = Field(default_factory=lambda: list(KNOWN_LIMITATIONS))

    @model_validator(mode="after")
    def _counts(self) -> CalibrationReport:
        left_out = self.warmup_excluded + self.failed_excluded + self.not_predicted
        if self.n_compared + left_out != self.n_requests:
            raise ValueError(f"{self.n_compared} compared + {left_out} left out ≠ {self.n_requests} requests")
        if self.repeat is not None:
            if self.repeat.n_compared + self.repeat.not_in_repeat != self.n_compared:
                raise ValueError("the repeat's requests do not add up to the compared ones")
            for row in self.repeat.rows:
                m = self.metric(row.metric)
                if m.n_real < row.n:
                    raise ValueError(f"{row.metric}: the repeat counts more requests than the comparison")
                told = m.median_ape_pct
                if m.n_real == row.n and told is not None and abs(row.model_median_ape_pct - told) > 1e-9:
                    raise ValueError(f"{row.metric}: the floor's model error contradicts the comparison's")
        return self

    def metric(self, name: str) -> MetricComparison:
        return next(m for m in self.metrics if m.metric == name)


def _compare(
    name: str, real: np.ndarray, pred: np.ndarray, paired: bool, n_boot: int, seed: int
) -> MetricComparison:
    ks_d, ks_p = stats.ks_two_sample(real, pred)
    fields: dict[str, object] = {}
    if paired:
        m, r = stats.mape(real, pred), stats.pearson_r(real, pred)
        bias = stats.signed_bias(real, pred)
        fields = {
            "mape_pct": m,
            "mape_ci_pct": stats.bootstrap_ci(real, pred, stats.mape, n_boot, seed),
            "median_ape_pct": stats.median_ape(real, pred),
            "bias_pct": bias,
            "bias_direction": stats.bias_direction(bias),
            "pearson_r": r,
            "pearson_r_ci": stats.bootstrap_ci(real, pred, stats.pearson_r, n_boot, seed),
            "rating": stats.quality_rating(m, r),
        }
    return MetricComparison(
        metric=name,
        description=METRICS[name],
        paired=paired,
        n_real=int(real.size),
        n_predicted=int(pred.size),
        percentiles=[
            PercentileError(percentile=q, real_ms=r, predicted_ms=p, error_pct=e)
            for q, r, p, e in stats.percentile_errors(real, pred)
        ],
        ks_d=ks_d,
        ks_p=ks_p,
        ks_rejects_same=ks_p < 0.05,
        qq=stats.qq_pairs(real, pred),
        **fields,
    )


def calibration_report(
    real_dir: str | Path,
    predicted_dir: str | Path,
    n_boot: int = 1000,
    seed: int = 0,
    engine_log: str | Path | None = None,
    repeat_dir: str | Path | None = None,
) -> CalibrationReport:
    """Compare the predicted trace at ``predicted_dir`` with the real one at ``real_dir`` (and, given the
    real engine's log, its steps with the replay's; given ``repeat_dir``, a second real run of the same
    schedule, the engine's error against itself on the same requests); ``ValueError`` when no request can
    be compared or the repeat ran another schedule."""
    real_head, real = read_trace(real_dir)
    pred_head, pred = read_trace(predicted_dir)
    split = split_requests(real, pred)
    if not split.compared:
        raise ValueError(
            f"no request completed in both {real_dir} and {predicted_dir} outside warm-up: nothing to compare"
        )
    rm, pm = request_metrics(real).loc[split.compared], request_metrics(pred).loc[split.compared]
    warnings = list(real_head.warnings)
    if len(split.compared) < MIN_REQUESTS:
        warnings.append(
            f"Insufficient requests for statistical significance (N < {MIN_REQUESTS}): "
            f"{len(split.compared)} compared"
        )
    metrics = []
    for name in ("ttft", "tpot", "e2e"):
        both = rm[f"{name}_ms"].notna() & pm[f"{name}_ms"].notna() & (rm[f"{name}_ms"] > 0)
        if both.sum() >= 2:
            r, p = rm.loc[both, f"{name}_ms"].to_numpy(), pm.loc[both, f"{name}_ms"].to_numpy()
            metrics.append(_compare(name, r, p, True, n_boot, seed))
    prompts = real.set_index(real["request_id"].astype(str))["prompt_tokens"].loc[split.compared]
    real_itl, pred_itl = itl_values(real, split.compared), itl_values(pred, split.compared)
    if real_itl.size >= 2 and pred_itl.size >= 2:
        metrics.append(_compare("itl", real_itl, pred_itl, False, n_boot, seed))
    steps, speed = None, None
    if engine_log is not None:
        replayed = Path(predicted_dir) / "steps.parquet"
        if not replayed.is_file():
            raise ValueError(f"{predicted_dir} has no steps.parquet (the replay's step log) to compare with")
        real_steps = engine_log_steps(Path(engine_log), real_head, real)
        steps = step_composition(real_steps, pd.read_parquet(replayed), str(engine_log))
        sim = pred_head.engine.get("sim")
        if isinstance(sim, dict) and "step" in sim:
            speed = engine_speed(real_steps, StepModel.model_validate(sim["step"]))
    floor = None
    if repeat_dir is not None:
        _, again = read_trace(repeat_dir)
        try:
            floor = repeat_floor(real, pred, again, split.compared, str(repeat_dir), n_boot, seed)
        except ValueError as exc:
            raise ValueError(f"{repeat_dir} is not a repeat of {real_dir}: {exc}") from None
    sent = real.loc[real["send_ns"].notna(), "send_ns"].astype(float)
    last = real["last_chunk_ns"].dropna().astype(float)
    duration = float((last.max() - sent.min()) / 1e9) if len(sent) and len(last) else 0.0
    return CalibrationReport(
        real=str(real_dir),
        predicted=str(predicted_dir),
        prediction=dict(pred_head.engine),
        n_requests=split.total,
        n_compared=len(split.compared),
        warmup_excluded=split.warmup,
        failed_excluded=split.failed_real,
        not_predicted=split.not_predicted,
        duration_s=duration,
        bootstrap={"resamples": n_boot, "seed": seed},
        metrics=metrics,
        steps=steps,
        speed=speed,
        by_prompt=_by_prompt(prompts.to_numpy(float), rm, pm),
        repeat=floor,
        warnings=warnings,
    )


def _by_prompt(prompt_tokens: np.ndarray, rm: pd.DataFrame, pm: pd.DataFrame) -> list[BandBias]:
    """TTFT, TPOT and E2E median signed errors per quartile of the prompt's length (requests with every
    metric defined in both traces; none below ``MIN_REQUESTS`` of them: four bands of a few say nothing)."""
    names = ("ttft", "tpot", "e2e")
    ok = np.isfinite(prompt_tokens)
    for name in names:
        ok &= rm[f"{name}_ms"].notna().to_numpy() & pm[f"{name}_ms"].notna().to_numpy()
        ok &= (rm[f"{name}_ms"] > 0).to_numpy()
    if ok.sum() < MIN_REQUESTS:
        return []
    per = {
        n: stats.banded_bias(prompt_tokens[ok], rm[f"{n}_ms"].to_numpy()[ok], pm[f"{n}_ms"].to_numpy()[ok])
        for n in names
    }
    return [
        BandBias(prompt_tokens=(int(lo), int(hi)), n=count, median_error_pct={n: per[n][i][3] for n in names})
        for i, (lo, hi, count, _) in enumerate(per["ttft"])
    ]
