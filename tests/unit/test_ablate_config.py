"""The ablation definition (arms, grid, rounds) and the counterbalanced order of its rounds."""

from __future__ import annotations

from pathlib import Path

import pytest

from microbench.ablate.config import AblateConfig, AblateConfigError, load_ablation
from microbench.ablate.runner import arm_order, round_groups

SHIPPED = sorted((Path(__file__).resolve().parents[2] / "sweeps" / "ablations").glob("*.yaml"))


def test_rounds_alternate_the_arms_order() -> None:
    assert [arm_order(["A", "B"], r) for r in range(4)] == [["A", "B"], ["B", "A"], ["A", "B"], ["B", "A"]]
    assert arm_order(["A", "B", "C"], 1) == ["C", "B", "A"]


@pytest.mark.parametrize("path", SHIPPED, ids=[p.stem for p in SHIPPED])
def test_shipped_ablations_validate(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(path.parents[2])  # a grid given as a sweep file is relative to the repository
    config = load_ablation(path, {})
    assert len(config.names) >= 2 and config.grid.chunks


def test_an_arm_is_the_grids_engine_with_its_overrides() -> None:
    config = AblateConfig.model_validate(
        {"grid": {"chunks": [512], "engine": {"kind": "sim"}}, "arms": {"A": {}, "B": {"max_num_seqs": 4}}}
    )
    a, b = config.spec("A", 512), config.spec("B", 512)
    assert (a.kind, a.chunk_size, a.max_num_seqs) == ("sim", 512, None)
    assert (b.kind, b.chunk_size, b.max_num_seqs) == ("sim", 512, 4)


@pytest.mark.parametrize(
    ("arms", "message"),
    [
        ({"A": {}}, "arms: Dictionary should have at least 2 items"),
        ({"A": {}, "B": {"no_such": 1}}, "arm B: unknown engine setting 'no_such'"),
        (
            {"A": {}, "B": {"chunk_size": 8192}},
            "an arm changes chunk_size: give a grid of one chunk (not [512, 1024])",
        ),
        ({"A": {}, "B": {"max_num_seqs": -1}}, "arm B: max_num_seqs=-1"),
    ],
)
def test_a_bad_definition_names_the_problem(arms: dict[str, dict[str, object]], message: str) -> None:
    with pytest.raises(AblateConfigError) as err:
        load_ablation(None, {"arms": arms, "grid": {"chunks": [512, 1024], "engine": {"kind": "sim"}}})
    assert message in str(err.value)


def test_a_chunk_size_arm_measures_its_own_chunk() -> None:
    config = AblateConfig.model_validate(
        {
            "grid": {"chunks": [2048], "engine": {"kind": "sim"}},
            "arms": {"c2k": {}, "c8k": {"chunk_size": 8192}},
        }
    )
    assert config.arm_grid("c2k").chunks == [2048] and config.arm_grid("c8k").chunks == [8192]
    assert config.spec("c8k", 2048).chunk_size == 8192


def test_a_missing_grid_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(AblateConfigError, match=r"nope\.yaml does not exist"):
        load_ablation(None, {"grid": str(tmp_path / "nope.yaml"), "arms": {"A": {}, "B": {}}})


def test_an_arm_may_run_another_engine_kind() -> None:
    config = AblateConfig.model_validate(
        {
            "grid": {"chunks": [2048], "engine": {"preset": "cpu", "vllm": {"cpu_kvcache_gib": 2}}},
            "arms": {"vllm": {}, "sg": {"kind": "sglang", "mixed_chunk": True}},
        }
    )
    vllm, sg = config.spec("vllm", 2048), config.spec("sg", 2048)
    assert (vllm.kind, vllm.cpu_kvcache_gib, vllm.mixed_chunk) == ("vllm", 2, False)
    # the grid's preset cpu is read as SGLang's counterpart; vLLM's own block does not follow the arm
    assert (sg.kind, sg.device, sg.mixed_chunk, sg.cpu_kvcache_gib, sg.chunk_size) == (
        "sglang",
        "cpu",
        True,
        None,
        2048,
    )
    assert config.identity_differs() == ["kind: vllm / sglang"]
    same = AblateConfig.model_validate({"grid": {"engine": {"kind": "sim"}}, "arms": {"A": {}, "B": {}}})
    assert same.identity_differs() == []


def test_a_setting_the_arms_kind_does_not_read_is_named() -> None:
    with pytest.raises(AblateConfigError, match="arm sg: kind 'vllm' does not read 'mixed_chunk'"):
        load_ablation(None, {"arms": {"A": {}, "sg": {"mixed_chunk": True}}})


def test_a_round_runs_side_by_side_only_where_every_shard_of_a_group_has_a_device() -> None:
    order = ["B", "A"]  # an odd round: counterbalanced order
    assert round_groups(order, 2, 1) == [[("B", 0)], [("A", 0)], [("B", 1)], [("A", 1)]]  # in turn
    assert round_groups(order, 2, 3) == [[("B", 0), ("A", 0)], [("B", 1), ("A", 1)]]  # a chunk's arms at once
    assert round_groups(order, 2, 4) == [[("B", 0), ("A", 0), ("B", 1), ("A", 1)]]  # the whole round
    assert round_groups(["A", "B", "C"], 1, 2) == [
        [("A", 0)],
        [("B", 0)],
        [("C", 0)],
    ]  # never part of a chunk
