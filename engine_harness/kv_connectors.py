"""KV-connector presets: how two engines are joined for a prefill → KV → decode hand-off, as data.

A preset is ``engine_harness/connectors/<name>.yaml`` (package data, so an installed suite finds it):
the ``--kv-transfer-config`` of each role, the engine environment (``{free_port}`` and
``{storage_path}`` are filled in at start-up), the ``kv_transfer_params`` a PD proxy adds to the
producer's request, and the metric names that time the transfer. ``role_spec`` puts a preset onto an
``EngineSpec``; ``install_hint`` names the packages a preset needs, built for this platform (NIXL's
wheel follows the CUDA major version of torch: ``nixl-cu12``, ``nixl-cu13``).
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import Field, ValidationError, model_validator

from benchcore.layered_config import shipped_file, shipped_names
from benchcore.schema import StrictModel
from engine_harness.engines import EngineSpec, engine_kind
from engine_harness.launch import free_port

__all__ = [
    "CONNECTORS_DIR",
    "CONNECTOR_DISTRIBUTIONS",
    "ConnectorError",
    "ConnectorPreset",
    "install_hint",
    "list_connectors",
    "load_connector",
    "missing_packages",
    "nixl_package",
    "role_spec",
    "torch_cuda_version",
]

CONNECTORS_DIR = Path(__file__).resolve().parent / "connectors"
Role = Literal["producer", "consumer"]
# the distributions that carry the presets' ``requires`` (import names): their versions go in a manifest
CONNECTOR_DISTRIBUTIONS = ("nixl", "nixl-cu12", "nixl-cu13", "mooncake-transfer-engine")
_PIP_NAMES = {"mooncake": "mooncake-transfer-engine"}


class ConnectorError(ValueError):
    """A connector preset is unknown or invalid; the message says which and why."""


class ConnectorPreset(StrictModel):
    """One vLLM KV connector set-up, as data."""

    name: str
    description: str = ""
    run_here: bool = Field(description="false: shipped as configuration for GPUs, never run on this box")
    requires: list[str] = Field(default_factory=list, description="Python packages the engines import")
    kv_transfer_config: dict[str, Any] | None = Field(None, description="the same for both roles")
    producer: dict[str, Any] | None = Field(None, description="producer's --kv-transfer-config")
    consumer: dict[str, Any] | None = Field(None, description="consumer's --kv-transfer-config")
    env: dict[str, str] = Field(default_factory=dict, description="engine environment, per engine")
    prefill_kv_transfer_params: dict[str, Any] | None = Field(
        None, description="kv_transfer_params of the producer's request (None: none sent)"
    )
    producer_must_not_chunk: bool = Field(
        False, description="the producer's token budget must cover the largest P (ExampleConnector)"
    )
    expects_kv_transfer: bool = Field(True, description="the consumer must report external KV tokens")
    sim_args: list[str] = Field(default_factory=list, description="argv of a sim engine for this connector")
    transfer_time_metric: str | None = Field(None, description="consumer histogram of KV transfer times")
    transfer_post_metric: str | None = None
    transfer_bytes_metric: str | None = None

    @model_validator(mode="after")
    def _roles(self) -> ConnectorPreset:
        both = self.kv_transfer_config is not None
        split = self.producer is not None or self.consumer is not None
        if both and split:
            raise ValueError(
                f"connector {self.name!r}: give kv_transfer_config or producer/consumer, not both"
            )
        if split and (self.producer is None or self.consumer is None):
            raise ValueError(f"connector {self.name!r}: give both producer and consumer configs")
        return self

    def role_config(self, role: Role, values: dict[str, str]) -> dict[str, Any] | None:
        """The role's ``--kv-transfer-config`` with ``{placeholders}`` filled from ``values``."""
        cfg = self.kv_transfer_config if self.kv_transfer_config is not None else getattr(self, role)
        if cfg is None:
            return None
        filled: dict[str, Any] = json.loads(_fill(json.dumps(cfg), values))
        return filled

    def role_env(self, values: dict[str, str]) -> dict[str, str]:
        return {k: _fill(v, values) for k, v in self.env.items()}


def _fill(text: str, values: dict[str, str]) -> str:
    for key, value in values.items():
        text = text.replace("{" + key + "}", value)
    return text


def list_connectors() -> list[str]:
    return shipped_names(CONNECTORS_DIR)


def load_connector(name: str | Path) -> ConnectorPreset:
    """A connector preset by name (``engine_harness/connectors/<name>.yaml``) or by path."""
    path = shipped_file(name, CONNECTORS_DIR)
    if path is None:
        raise ConnectorError(f"unknown connector {str(name)!r}; known: {', '.join(list_connectors())}")
    try:
        return ConnectorPreset.model_validate(yaml.safe_load(path.read_text()))
    except (yaml.YAMLError, ValidationError) as exc:
        raise ConnectorError(f"connector preset {path} is invalid: {exc}") from None


def role_spec(base: EngineSpec, preset: ConnectorPreset, role: Role, storage: str) -> EngineSpec:
    """``base`` with the connector's ``--kv-transfer-config`` and environment for ``role`` (a sim engine
    gets the preset's own ``sim_args`` instead: ``engine_harness/sim/kv_transfer.py``)."""
    values = {"free_port": str(free_port()), "storage_path": storage}
    cfg = preset.role_config(role, values)
    joins = engine_kind(base.kind).kv_connectors
    extra = list(base.extra_args) + (["--kv-transfer-config", json.dumps(cfg)] if cfg and joins else [])
    if not joins:
        extra += preset.sim_args
    return base.model_copy(update={"extra_args": extra, "env": base.env | preset.role_env(values)})


def missing_packages(preset: ConnectorPreset) -> list[str]:
    """The preset's required Python packages that this environment cannot import."""
    return [pkg for pkg in preset.requires if importlib.util.find_spec(pkg) is None]


def torch_cuda_version() -> str | None:
    """The CUDA version torch was built for (``"13.0"``); None for a CPU build or no torch."""
    if importlib.util.find_spec("torch") is None:
        return None
    import torch  # heavy (seconds): only on the path that needs it

    cuda = torch.version.cuda
    return str(cuda) if cuda else None


def nixl_package(cuda_version: str | None) -> str:
    """NIXL's wheel for a torch built against ``cuda_version`` (pure). A CPU build takes ``nixl-cu12``,
    as ``scripts/setup.sh`` installs it: its UCX backend runs on the CPU."""
    major = (cuda_version or "").split(".")[0]
    return f"nixl-cu{major}" if major.isdigit() and int(major) >= 12 else "nixl-cu12"


def install_hint(missing: list[str], cuda_version: str | None) -> str:
    """The commands that install ``missing`` packages here (pure). NIXL: the wheel of this CUDA, then the
    ``nixl`` shim without its dependencies (they would add another CUDA's copy)."""
    steps = []
    for pkg in missing:
        if pkg == "nixl":
            steps.append(f"pip install {nixl_package(cuda_version)} && pip install --no-deps nixl")
        else:
            steps.append(f"pip install {_PIP_NAMES.get(pkg, pkg)}")
    where = f"torch built for CUDA {cuda_version}" if cuda_version else "no CUDA build of torch here: CPU"
    return f"`{' && '.join(steps)}` ({where}; or bash scripts/setup.sh)"
