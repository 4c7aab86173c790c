"""Length distributions: large seeded samples match their specs; bounds, files and validation."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from microbench.workloads.distributions import DISTRIBUTIONS, parse_length_dist

N = 100_000


def _sample(spec: dict[str, object], seed: int = 1) -> np.ndarray:
    values = parse_length_dist(spec).sample(np.random.default_rng(seed), N)
    assert values.dtype == np.int64
    return values


def test_fixed_and_uniform() -> None:
    assert set(_sample({"type": "fixed", "value": 256}).tolist()) == {256}
    u = _sample({"type": "uniform", "min": 128, "max": 512})
    assert (u.min(), u.max()) == (128, 512)
    assert u.mean() == pytest.approx(320, rel=0.01)
    assert np.bincount(u)[128:513].std() / (N / 385) < 0.1  # flat


def test_normal_mean_and_std() -> None:
    x = _sample({"type": "normal", "mean": 1000, "std": 100})
    assert x.mean() == pytest.approx(1000, rel=0.005)
    assert x.std() == pytest.approx(100, rel=0.02)


def test_lognormal_with_floor_and_cap() -> None:
    x = _sample({"type": "lognormal", "mu": 5.5, "sigma": 1.0, "floor": 32, "cap": 4096})
    assert np.median(x) == pytest.approx(np.exp(5.5), rel=0.02)  # the draft's ~245
    assert x.min() == 32 and x.max() == 4096
    below = np.mean(x == 32)
    normal_cdf = 0.5 * (1 + math.erf((math.log(32.5) - 5.5) / math.sqrt(2)))
    assert below == pytest.approx(normal_cdf, abs=0.003)


def test_exponential_mean() -> None:
    x = _sample({"type": "exponential", "mean": 200, "floor": 0})
    assert x.mean() == pytest.approx(200, rel=0.02)


def test_pareto_lognormal_mixture() -> None:
    spec = {"type": "pareto_lognormal", "alpha": 2.5, "xm": 2000, "mu": 4.0, "sigma": 0.3, "mix_weight": 0.3}
    x = _sample(spec)
    # log-normal draws sit far below xm, Pareto draws at or above it: the split shows the weight
    assert np.mean(x >= 2000) == pytest.approx(0.3, abs=0.01)
    pareto = x[x >= 2000]
    assert pareto.mean() == pytest.approx(2000 * 2.5 / 1.5, rel=0.05)


def test_empirical_pdf_values_and_files(tmp_path: Path) -> None:
    x = _sample({"type": "empirical", "pdf": [0, 0.25, 0, 0.75]})
    assert np.bincount(x, minlength=4)[[1, 3]] / N == pytest.approx([0.25, 0.75], abs=0.01)
    x = _sample({"type": "empirical", "values": [100, 200], "weights": [3, 1]})
    assert np.mean(x == 100) == pytest.approx(0.75, abs=0.01)
    pdf = tmp_path / "pdf.json"
    pdf.write_text(json.dumps({"pdf": [0, 0, 1.0]}))
    assert set(_sample({"type": "empirical", "file": str(pdf)}).tolist()) == {2}
    lines = tmp_path / "lengths.txt"
    lines.write_text("10\n10\n10\n40\n")
    x = _sample({"type": "empirical", "file": str(lines)})
    assert np.mean(x == 10) == pytest.approx(0.75, abs=0.01)


def test_quantiles_reproduce_the_stated_percentiles() -> None:
    points = {0.0: 4, 0.5: 156, 0.95: 892, 0.99: 2134, 1.0: 4096}
    x = _sample({"type": "quantiles", "points": points})
    assert np.percentile(x, [50, 95, 99]) == pytest.approx([156, 892, 2134], rel=0.03)
    assert x.min() >= 4 and x.max() <= 4096


def test_same_generator_state_same_lengths() -> None:
    spec = {"type": "lognormal", "mu": 4, "sigma": 1}
    assert np.array_equal(_sample(spec, seed=9), _sample(spec, seed=9))
    assert not np.array_equal(_sample(spec, seed=9), _sample(spec, seed=10))


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({"type": "lognormal", "mu": float("nan"), "sigma": 1}, "mu: Input should be a finite number"),
        ({"type": "lognormal", "mu": 1, "sigma": -1}, "sigma: Input should be greater than 0"),
        ({"type": "uniform", "min": 10, "max": 5}, "max (5) is below min (10)"),
        ({"type": "fixed", "value": 5, "floor": 10, "cap": 4}, "cap (4) is below floor (10)"),
        ({"type": "fixed", "value": 5, "mean": 3}, "mean: Extra inputs are not permitted"),
        ({"type": "empirical", "pdf": [1], "values": [1]}, "exactly one of file, pdf, values"),
        ({"type": "empirical", "values": [1, 2], "weights": [1, -1]}, "non-negative"),
        ({"type": "quantiles", "points": {0.5: 3, 1.0: 9}}, "probabilities 0 and 1"),
        ({"type": "zipf"}, "unknown length distribution 'zipf'"),
        ({"value": 3}, "needs 'type'"),
    ],
)
def test_invalid_specs_are_rejected_with_the_field(spec: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        parse_length_dist(spec)


def test_registry_has_the_issue_s_kinds() -> None:
    assert {"fixed", "uniform", "normal", "lognormal", "pareto_lognormal", "exponential", "empirical"} <= set(
        DISTRIBUTIONS.names()
    )
