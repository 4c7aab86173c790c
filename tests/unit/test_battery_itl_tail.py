"""5.4's tail type on hand-drawn gaps: exponential, power-law, bounded, and too few to judge."""

import numpy as np
import pytest

from microbench.battery.sections.itl import itl_level, tail_type

RNG = np.random.default_rng(7)


@pytest.mark.parametrize(
    ("samples", "kind"),
    [
        (RNG.exponential(0.02, 5000), "exponential-type"),
        (RNG.normal(0.02, 0.002, 5000), "exponential-type"),
        (0.02 * (RNG.pareto(1.5, 5000) + 1), "heavy-tailed (power law)"),
        (RNG.uniform(0.01, 0.03, 5000), "bounded"),
    ],
)
def test_tail_type_reads_the_excesses_over_p90(samples: np.ndarray, kind: str) -> None:
    assert tail_type(samples).split(":")[0] == kind


def test_too_few_gaps_above_p90_are_not_classified() -> None:
    assert tail_type(RNG.exponential(0.02, 100)).startswith("not classified")
    assert tail_type(np.full(1000, 0.02)).startswith("not classified")  # no excess at all


def test_a_level_carries_its_tail_type() -> None:
    stamps = [list(np.cumsum(RNG.exponential(2e7, 60)).astype(int)) for _ in range(10)]
    level = itl_level(stamps, [[1] * 60] * 10, 0.5, 2.0, [60.0] * 10)
    assert level.tail_type.startswith("exponential-type")
