"""Token-length distributions of a workload: seeded, vectorised samplers registered by name.

Every distribution is a strict pydantic model with a ``type`` key (``fixed``, ``uniform``, ``normal``,
``lognormal``, ``pareto_lognormal``, ``exponential``, ``empirical``, ``quantiles``) and the common bounds
``floor`` and ``cap`` (draws outside are clipped to them, as the draft's Appendix A does). ``sample(rng, n)``
returns ``n`` integer lengths from a ``numpy.random.Generator``; the same generator state gives the same
lengths. ``empirical`` reads a PDF over token counts (ServeGen's format), weighted values, or raw samples;
``quantiles`` interpolates (in log space) through stated percentiles, for a distribution known only by a
few of them.
"""

from __future__ import annotations

import itertools
import json
import math
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal

import numpy as np
from pydantic import BeforeValidator, ConfigDict, Field, PrivateAttr, SerializeAsAny, model_validator

from benchcore.registry import Registry, validate_by_name
from benchcore.schema import StrictModel

__all__ = [
    "DISTRIBUTIONS",
    "EmpiricalDist",
    "ExponentialDist",
    "FixedDist",
    "LengthDist",
    "LengthDistField",
    "LogNormalDist",
    "NormalDist",
    "ParetoLogNormalDist",
    "QuantileDist",
    "UniformDist",
    "parse_length_dist",
]

DISTRIBUTIONS: Registry[type[LengthDist]] = Registry("length distribution")


class LengthDist(StrictModel):
    """A distribution of token counts; subclasses draw real values, the base rounds and clips them."""

    model_config = ConfigDict(allow_inf_nan=False, frozen=True)
    kind_key: ClassVar[str] = "type"

    type: str
    floor: int = Field(
        default=1, ge=0, description="smallest length returned; smaller draws are raised to it"
    )
    cap: int | None = Field(
        default=None, ge=1, description="largest length returned; larger draws are lowered to it"
    )

    @model_validator(mode="after")
    def _check_bounds(self) -> LengthDist:
        if self.cap is not None and self.cap < self.floor:
            raise ValueError(f"cap ({self.cap}) is below floor ({self.floor})")
        return self

    def draw(self, rng: np.random.Generator, n: int) -> np.ndarray:
        """``n`` raw real-valued draws (before rounding and clipping)."""
        raise NotImplementedError

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        """``n`` integer lengths, rounded and clipped to ``[floor, cap]``."""
        values = np.rint(self.draw(rng, n))
        upper = np.inf if self.cap is None else self.cap
        return np.clip(values, self.floor, upper).astype(np.int64)


def parse_length_dist(value: Any) -> LengthDist:
    """A mapping with a ``type`` key (or a ``LengthDist``) → the registered distribution model."""
    return validate_by_name(DISTRIBUTIONS, value, "type")


LengthDistField = Annotated[SerializeAsAny[LengthDist], BeforeValidator(parse_length_dist)]


@DISTRIBUTIONS.register("fixed")
class FixedDist(LengthDist):
    """Always ``value`` tokens."""

    type: Literal["fixed"] = "fixed"
    value: int = Field(..., ge=0, description="the length")

    def draw(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return np.full(n, float(self.value))


@DISTRIBUTIONS.register("uniform")
class UniformDist(LengthDist):
    """Integers uniformly in ``[min, max]`` (both included)."""

    type: Literal["uniform"] = "uniform"
    min: int = Field(..., ge=0)
    max: int = Field(..., ge=0)

    @model_validator(mode="after")
    def _check_range(self) -> UniformDist:
        if self.max < self.min:
            raise ValueError(f"max ({self.max}) is below min ({self.min})")
        return self

    def draw(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return rng.integers(self.min, self.max + 1, size=n).astype(float)


@DISTRIBUTIONS.register("normal")
class NormalDist(LengthDist):
    """Gaussian with ``mean`` and ``std``, clipped to ``[floor, cap]``."""

    type: Literal["normal"] = "normal"
    mean: float = Field(..., ge=0)
    std: float = Field(..., ge=0)

    def draw(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return rng.normal(self.mean, self.std, size=n)


@DISTRIBUTIONS.register("lognormal")
class LogNormalDist(LengthDist):
    """``exp(N(mu, sigma))``: the draft's synthetic-skewed lengths (median ``exp(mu)``)."""

    type: Literal["lognormal"] = "lognormal"
    mu: float = Field(..., description="mean of ln(length)")
    sigma: float = Field(..., gt=0, description="standard deviation of ln(length)")

    def draw(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return rng.lognormal(self.mu, self.sigma, size=n)


@DISTRIBUTIONS.register("pareto_lognormal")
class ParetoLogNormalDist(LengthDist):
    """ServeGen's input-length mixture: Pareto(alpha, xm) with probability ``mix_weight``, else log-normal."""

    type: Literal["pareto_lognormal"] = "pareto_lognormal"
    alpha: float = Field(..., gt=0, description="Pareto shape")
    xm: float = Field(..., gt=0, description="Pareto scale (its minimum)")
    mu: float = Field(..., description="log-normal mean of ln(length)")
    sigma: float = Field(..., gt=0, description="log-normal standard deviation of ln(length)")
    mix_weight: float = Field(..., ge=0, le=1, description="probability of a Pareto draw")

    def draw(self, rng: np.random.Generator, n: int) -> np.ndarray:
        pareto = self.xm * (1.0 + rng.pareto(self.alpha, size=n))
        lognormal = rng.lognormal(self.mu, self.sigma, size=n)
        return np.where(rng.random(n) < self.mix_weight, pareto, lognormal)


@DISTRIBUTIONS.register("exponential")
class ExponentialDist(LengthDist):
    """Exponential with ``mean``: ServeGen's output-length shape."""

    type: Literal["exponential"] = "exponential"
    mean: float = Field(..., gt=0)

    def draw(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return rng.exponential(self.mean, size=n)


def _load_empirical(path: Path) -> tuple[list[float], list[float]]:
    """A file → (values, weights). JSON: a PDF list (index = token count), ``{"pdf": [...]}`` or
    ``{"values": [...], "weights": [...]}``; any other file: one observed length per line."""
    if path.suffix == ".json":
        data = json.loads(path.read_text())
        if isinstance(data, dict) and "pdf" in data:
            data = data["pdf"]
        if isinstance(data, list):
            return [float(i) for i in range(len(data))], [float(p) for p in data]
        if isinstance(data, dict) and "values" in data:
            values = [float(v) for v in data["values"]]
            return values, [float(w) for w in data.get("weights", [1.0] * len(values))]
        raise ValueError(f"{path}: expected a PDF list, {{'pdf': [...]}} or {{'values': [...]}}")
    values = [float(line) for line in path.read_text().split() if line.strip()]
    return values, [1.0] * len(values)


@DISTRIBUTIONS.register("empirical")
class EmpiricalDist(LengthDist):
    """Inverse-CDF sampling of an observed distribution: ``file``, ``pdf``, or ``values`` with ``weights``."""

    type: Literal["empirical"] = "empirical"
    file: str | None = Field(
        default=None, description="JSON PDF/values file, or a text file of one length per line"
    )
    pdf: list[float] | None = Field(
        default=None, description="probability of each token count (index = count)"
    )
    values: list[float] | None = Field(
        default=None, description="possible lengths (weighted, or equally likely)"
    )
    weights: list[float] | None = Field(default=None, description="relative weight of each of ``values``")
    note: str = Field(
        default="", description="where the distribution comes from (reported with the workload)"
    )
    _table: tuple[np.ndarray, np.ndarray] | None = PrivateAttr(None)

    @model_validator(mode="after")
    def _check_source(self) -> EmpiricalDist:
        given = [name for name in ("file", "pdf", "values") if getattr(self, name) is not None]
        if len(given) != 1:
            raise ValueError(f"give exactly one of file, pdf, values (got {given or 'none'})")
        if self.weights is not None and self.values is None:
            raise ValueError("weights go with values")
        values, weights = self.support()
        if len(values) != len(weights):
            raise ValueError(f"{len(values)} values but {len(weights)} weights")
        if not values or any(w < 0 or not math.isfinite(w) for w in weights) or sum(weights) <= 0:
            raise ValueError("weights must be finite, non-negative and not all zero")
        if any(v < 0 or not math.isfinite(v) for v in values):
            raise ValueError("lengths must be finite and non-negative")
        return self

    def support(self) -> tuple[list[float], list[float]]:
        """(values, weights) of the distribution, read from wherever it was given."""
        if self.file is not None:
            return _load_empirical(Path(self.file))
        if self.pdf is not None:
            return [float(i) for i in range(len(self.pdf))], list(self.pdf)
        assert self.values is not None
        return list(self.values), list(self.weights or [1.0] * len(self.values))

    def draw(self, rng: np.random.Generator, n: int) -> np.ndarray:
        if self._table is None:
            values, weights = self.support()
            cdf = np.cumsum(weights, dtype=float)
            self._table = (np.asarray(values, dtype=float), cdf / cdf[-1])
        values_arr, cdf_arr = self._table
        return values_arr[np.searchsorted(cdf_arr, rng.random(n), side="right").clip(0, len(values_arr) - 1)]


def paired_sample(
    inputs: EmpiricalDist, outputs: EmpiricalDist, rng: np.random.Generator, n: int
) -> tuple[np.ndarray, np.ndarray]:
    """``n`` (input, output) lengths drawn together: index i of both ``values`` lists is one observed
    request (a dataset's pairs), picked with ``inputs``' weights; each clipped to its own bounds."""
    values_in, weights = inputs.support()
    values_out, _ = outputs.support()
    cdf = np.cumsum(weights, dtype=float)
    idx = np.searchsorted(cdf / cdf[-1], rng.random(n), side="right").clip(0, len(values_in) - 1)

    def bound(dist: EmpiricalDist, values: list[float]) -> np.ndarray:
        upper = np.inf if dist.cap is None else dist.cap
        return np.clip(np.rint(np.asarray(values, dtype=float)[idx]), dist.floor, upper).astype(np.int64)

    return bound(inputs, values_in), bound(outputs, values_out)


@DISTRIBUTIONS.register("quantiles")
class QuantileDist(LengthDist):
    """A distribution known by some quantiles: log-linear interpolation of the inverse CDF between them.

    ``points`` maps probabilities (must include 0 and 1) to lengths, e.g. ``{0: 4, 0.5: 156, 0.95: 892,
    0.99: 2134, 1: 4096}``; the stated percentiles are reproduced exactly, the shape between them is assumed.
    """

    type: Literal["quantiles"] = "quantiles"
    points: dict[float, float] = Field(..., description="probability → length, increasing, with 0 and 1")
    note: str = Field(default="", description="where the quantiles come from (reported with the workload)")

    @model_validator(mode="after")
    def _check_points(self) -> QuantileDist:
        probs = sorted(self.points)
        if len(probs) < 2 or probs[0] != 0.0 or probs[-1] != 1.0:
            raise ValueError("points need the probabilities 0 and 1 (the smallest and largest length)")
        lengths = [self.points[p] for p in probs]
        if any(v <= 0 for v in lengths) or any(b < a for a, b in itertools.pairwise(lengths)):
            raise ValueError("lengths must be positive and non-decreasing with probability")
        return self

    def draw(self, rng: np.random.Generator, n: int) -> np.ndarray:
        probs = sorted(self.points)
        log_lengths = np.log([self.points[p] for p in probs])
        return np.exp(np.interp(rng.random(n), probs, log_lengths))
