"""The committed reference run re-derives to exactly what it stores: records come from stored data only."""

from __future__ import annotations

from pathlib import Path

from analysis.rederive import differences, rederive_run

REFERENCE = Path(__file__).resolve().parents[2] / "results" / "reference-cpu"


def test_every_record_of_the_reference_run_re_derives_exactly() -> None:
    changed = rederive_run(REFERENCE, write=False)
    assert changed == {}, list(changed.items())[:3]
    assert len(list((REFERENCE / "runs").glob("*/*.json"))) >= 100


def test_differences_compares_floats_to_1e9_relative() -> None:
    assert differences({"a": 1.0, "b": [1, 2.0]}, {"a": 1.0 + 1e-12, "b": [1, 2.0]}) == []
    assert differences({"a": 1.0}, {"a": 1.0 + 1e-6}) == [".a: 1.0 → 1.000001"]
    assert differences({"a": None}, {"a": 0.0}) == [".a: None → 0.0"]
