"""``--decode-prompts`` reaches the sweep (the YAML key ``decode_prompts``), and leaving it out keeps seed
002's shared prefix or what the config file says."""

from __future__ import annotations

from pathlib import Path

from microbench.measure.grid import load_sweep
from microbench.sweep.cli import _overrides, build_parser

CALIBRATION = Path(__file__).resolve().parents[2] / "sweeps" / "calibrate-vllm-cpu.yaml"


def _sweep(*argv: str):  # type: ignore[no-untyped-def]
    args = build_parser().parse_args(list(argv))
    return load_sweep(args.config, _overrides(args))


def test_the_flag_sets_the_decode_prompts() -> None:
    assert _sweep("--decode-prompts", "distinct").decode_prompts == "distinct"
    assert _sweep().decode_prompts == "shared"
    assert _sweep("--config", str(CALIBRATION)).decode_prompts == "distinct"
    assert _sweep("--config", str(CALIBRATION), "--decode-prompts", "shared").decode_prompts == "shared"
