"""PD-transfer cost model and break-even against measured interference (DESIGN.md §5, seed 002 §3).

* ``kv_bytes_per_token`` (one definition: ``engine_harness.model_kv``) from a model config: a Hugging
  Face ``config.json``, a bundled tiny model's name (its ``engine_harness/models/<name>/config.json``),
  or a name in ``model_configs.yaml`` (the target Qwen3-Coder-30B-A3B-Instruct).
* Link profiles are data: ``analysis/links/<name>.yaml`` (``LinkProfile``): a setup latency and a
  bandwidth, or a flat ``fixed_ms`` budget (seed 002's 50 ms layer-wise budget).
* Transfer of P tokens' KV: **bulk** ``setup + bytes / bandwidth`` after the prefill; **layer-wise**
  (pipelined with the prefill, layer l sent while l+1 computes) exposes only the last layer's slice,
  ``setup + max(bytes / (L·bw), bytes / bw − T_prefill·(L−1)/L)`` — the second term is the part not
  hidden when the link is slower than the compute (``T_prefill``: the bare prefill time, D = 0).
* Break-even: offloading wins where the interference cost (measured aggregate decode delay, seed 002's
  ``num_chunks × D × penalty``) exceeds the transfer time.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Literal

import pandas as pd
import yaml
from pydantic import BaseModel, ConfigDict, Field, model_validator

from benchcore.layered_config import shipped_file, shipped_names
from engine_harness.model_kv import ModelKV, read_model_kv
from microbench.results.layout import RunFolder

__all__ = [
    "LINKS_DIR",
    "LinkProfile",
    "TransferMode",
    "breakeven_table",
    "list_links",
    "load_link",
    "load_model_kv",
    "run_model_kv",
]

LINKS_DIR = Path(__file__).resolve().parent / "links"
MODEL_CONFIGS = Path(__file__).resolve().parent / "model_configs.yaml"
# The bundled tiny models' configs, read as data files.
BUNDLED_MODELS = Path(__file__).resolve().parent.parent / "engine_harness" / "models"
TransferMode = Literal["bulk", "layerwise"]


def load_model_kv(model: str | Path, dtype: str | None = None) -> ModelKV:
    """A model's KV shape: a path to ``config.json`` (or its folder), or a name in ``model_configs.yaml``
    (a path-like run model name such as ``engine_harness/models/qwen3-moe-tiny`` matches by its last part)."""
    local = read_model_kv(model, dtype) or read_model_kv(BUNDLED_MODELS / Path(str(model)).name, dtype)
    if local is not None:
        return local
    known: dict[str, dict[str, Any]] = yaml.safe_load(MODEL_CONFIGS.read_text())
    for key in (str(model), Path(str(model)).name):
        if key in known:
            return ModelKV.from_config(key, known[key], dtype)
        lower = {k.lower(): k for k in known}
        if key.lower() in lower:
            return ModelKV.from_config(lower[key.lower()], known[lower[key.lower()]], dtype)
    raise ValueError(f"unknown model {str(model)!r}: give a config.json path or one of {sorted(known)}")


def run_model_kv(run_dir: Path) -> ModelKV:
    """The KV shape of the model a run served, in the dtype its engine really ran (``--dtype`` from the
    manifest's engine spec or argv; the config's own dtype only when the engine was not told one). The
    CPU preset serves the bf16 tiny model as float32: 1024 KV bytes per token, not 512."""
    manifest = RunFolder(Path(run_dir)).read_manifest()
    spec = manifest.engine_spec
    dtype = spec.get("dtype")
    for argv in manifest.engine_argv.values():
        if "--dtype" in argv[:-1]:
            dtype = argv[argv.index("--dtype") + 1]
    model = spec.get("served_model_name") or spec.get("model")
    if not model:
        raise ValueError(f"the manifest of {run_dir} names no model")
    return load_model_kv(str(model), None if dtype in (None, "auto") else str(dtype))


class LinkProfile(BaseModel):
    """A KV transfer link: ``setup_latency_ms`` + bytes / (``bandwidth_gbit_s`` × ``efficiency``), or a
    flat ``fixed_ms`` per transfer. Unknown keys are an error (a misspelled key would be ignored).

    Every profile says what its numbers rest on: ``basis: measured`` with the ``run`` folder they were
    fitted from, or ``basis: assumed`` with the ``assumption`` in words; ``describe()`` is the line the
    analysis prints beside every result that used the link."""

    model_config = ConfigDict(extra="forbid")

    name: str
    description: str = ""
    basis: Literal["measured", "assumed"] = Field(description="fitted from a run, or assumed")
    assumption: str | None = Field(default=None, description="basis assumed: what is assumed, in words")
    run: str | None = Field(default=None, description="basis measured: the run folder, e.g. results/<id>")
    placeholder: bool = Field(default=False, description="true: guessed values awaiting a measurement")
    setup_latency_ms: float = Field(default=0.0, ge=0)
    setup_latency_ci_ms: tuple[float, float] | None = Field(default=None, description="95 % CI, measured")
    bandwidth_gbit_s: float | None = Field(default=None, gt=0, description="nominal, in 10⁹ bit/s")
    bandwidth_ci_gbit_s: tuple[float, float] | None = Field(default=None, description="95 % CI, measured")
    efficiency: float = Field(default=1.0, gt=0, le=1, description="achieved share of the bandwidth")
    fixed_ms: float | None = Field(default=None, ge=0, description="flat transfer time, whatever P")
    source: str = ""

    @model_validator(mode="after")
    def _one_cost(self) -> LinkProfile:
        if (self.bandwidth_gbit_s is None) == (self.fixed_ms is None):
            raise ValueError(f"link {self.name!r}: give exactly one of bandwidth_gbit_s or fixed_ms")
        if self.basis == "assumed" and not self.assumption:
            raise ValueError(f"link {self.name!r}: basis 'assumed' needs the assumption, in words")
        if self.basis == "measured" and (not self.run or self.placeholder):
            raise ValueError(
                f"link {self.name!r}: basis 'measured' needs run: (the run folder), no placeholder"
            )
        if self.basis == "measured" and self.efficiency != 1.0:
            raise ValueError(f"link {self.name!r}: a measured link has no assumed efficiency")
        return self

    def describe(self) -> str:
        """What the numbers rest on, in one line (printed by the analysis wherever the link is used)."""
        if self.basis == "measured":
            return f"{self.name}: measured (run {self.run})"
        return f"{self.name}: assumed ({self.assumption})"

    @property
    def bytes_per_ms(self) -> float:
        if self.bandwidth_gbit_s is None:
            return math.inf
        return self.bandwidth_gbit_s * self.efficiency * 1e9 / 8 / 1e3

    def transfer_ms(
        self,
        nbytes: float,
        layers: int = 1,
        mode: TransferMode = "bulk",
        prefill_compute_ms: float | None = None,
    ) -> float:
        """Exposed transfer time of ``nbytes`` of KV (see the module docstring for the layer-wise case)."""
        if self.fixed_ms is not None:
            return self.fixed_ms
        wire = nbytes / self.bytes_per_ms
        if mode == "bulk":
            return self.setup_latency_ms + wire
        if mode != "layerwise":
            raise ValueError(f"unknown transfer mode {mode!r} (bulk or layerwise)")
        exposed = wire / layers  # only the last layer's slice, when the link keeps pace with the compute
        if prefill_compute_ms is not None:
            exposed = max(exposed, wire - prefill_compute_ms * (layers - 1) / layers)
        return self.setup_latency_ms + exposed

    def breakeven_gbit_s(
        self, nbytes: float, budget_ms: float, layers: int = 1, mode: TransferMode = "bulk",
        prefill_compute_ms: float | None = None,
    ) -> float:  # fmt: skip
        """Nominal bandwidth at which the transfer takes exactly ``budget_ms`` (inf: never fits)."""
        room = budget_ms - self.setup_latency_ms
        if room <= 0 or not math.isfinite(room):
            return math.inf if room <= 0 else 0.0
        if mode == "bulk":
            need = nbytes / room
        else:
            need = nbytes / (layers * room)
            if prefill_compute_ms is not None:
                need = max(need, nbytes / (room + prefill_compute_ms * (layers - 1) / layers))
        return need * 1e3 * 8 / 1e9 / self.efficiency


def list_links() -> list[str]:
    """Names of the link profiles shipped in ``analysis/links/``."""
    return shipped_names(LINKS_DIR)


def load_link(link: str | Path) -> LinkProfile:
    """A link profile by name (``analysis/links/<name>.yaml``) or by path to a YAML file."""
    path = shipped_file(link, LINKS_DIR)
    if path is None:
        raise ValueError(f"unknown link profile {str(link)!r}: give a YAML path or one of {list_links()}")
    data = yaml.safe_load(path.read_text())
    if not isinstance(data, dict):
        raise ValueError(f"{path}: a link profile is a mapping of settings")
    return LinkProfile.model_validate(data)


def breakeven_table(
    table: pd.DataFrame, model: ModelKV, link: LinkProfile, mode: TransferMode = "layerwise"
) -> pd.DataFrame:
    """Per cell of an interference table: interference cost, transfer cost, break-even, decision.

    ``interference_ms`` is the measured median aggregate decode delay (0 for D = 0: no decode to disturb;
    NaN where no valid measurement exists). ``break_even_transfer_ms`` equals it (seed 002 §3): the
    transfer time below which offloading wins. ``offload_wins`` is NA where the cost is unknown. The
    layer-wise mode hides transfer behind the bare prefill time of the same (chunk, P) when the run
    measured D = 0, otherwise it assumes the link keeps pace with the compute.
    """
    cells = table[["chunk_size", "decode_batch_size", "new_prefill_tokens"]].copy()
    cells["interference_ms"] = table["aggregate_decode_delay_ms"].astype(float)
    cells.loc[table["decode_batch_size"] == 0, "interference_ms"] = 0.0
    bare = table[table["decode_batch_size"] == 0].set_index(["chunk_size", "new_prefill_tokens"])[
        "prefill_duration_ms"
    ]
    kv = model.kv_bytes_per_token
    transfer, bandwidth = [], []
    for c, p, cost in zip(
        cells["chunk_size"], cells["new_prefill_tokens"], cells["interference_ms"], strict=True
    ):
        compute = bare.get((c, p)) if mode == "layerwise" else None
        compute = float(compute) if compute is not None and math.isfinite(compute) else None
        transfer.append(link.transfer_ms(p * kv, model.layers, mode, compute))
        bandwidth.append(
            link.breakeven_gbit_s(p * kv, cost, model.layers, mode, compute)
            if math.isfinite(cost)
            else math.nan
        )
    cells["kv_bytes"] = cells["new_prefill_tokens"] * kv
    cells["transfer_ms"] = transfer
    cells["break_even_transfer_ms"] = cells["interference_ms"]
    cells["break_even_gbit_s"] = bandwidth if link.fixed_ms is None else math.nan
    cells["margin_ms"] = cells["interference_ms"] - cells["transfer_ms"]
    wins = cells["margin_ms"] > 0
    cells["offload_wins"] = wins.astype("boolean").mask(cells["interference_ms"].isna())
    return cells
