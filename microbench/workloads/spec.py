"""The workload spec (YAML, in the spirit of seed 003): heterogeneous clients, each with its own arrivals.

A ``WorkloadSpec`` has a ``seed`` and one or more ``clients``. A client has a share of the aggregate rate
(``rate_fraction``, normalised over clients), an arrival process (any open-loop scheduler kind with its
parameters), input and output length distributions, an optional prefix group (``count`` distinct prefixes,
used by a ``fraction`` of its requests, picked uniformly or by Zipf popularity), a streaming flag, active
windows, and optional multi-turn sessions (rounds, think time, context growth). ``load_workload_spec``
reads YAML strictly: duplicate keys, unknown keys, NaN/inf and out-of-range values are errors that name the
file and the field path.
"""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import ConfigDict, Field, ValidationError, field_validator, model_validator

from benchcore.registry import format_validation_error
from benchcore.schema import StrictModel
from microbench.workloads.distributions import EmpiricalDist, LengthDistField
from microbench.workloads.schedulers import SCHEDULERS, RateScheduler, Scheduler, parse_scheduler

__all__ = [
    "ArrivalSpec",
    "ClientSpec",
    "MultiTurnSpec",
    "PrefixSpec",
    "WindowSpec",
    "WorkloadSpec",
    "WorkloadSpecError",
    "load_workload_spec",
]


class _Spec(StrictModel):
    model_config = ConfigDict(allow_inf_nan=False, frozen=True)


class WorkloadSpecError(ValueError):
    """A workload spec file could not be read or validated; the message names the file and the fields."""


class ArrivalSpec(_Spec):
    """A client's arrival process: an open-loop scheduler kind and its shape parameters (rate comes later)."""

    process: str = Field(
        default="poisson", description="poisson, gamma, weibull or uniform (any open-loop kind)"
    )
    cv: float | None = Field(
        default=None, gt=0, description="coefficient of variation of the gaps (gamma, weibull)"
    )
    jitter: float | None = Field(
        default=None, ge=0, lt=1, description="relative jitter of the gaps (uniform)"
    )

    def scheduler(self, rate: float, seed: int) -> Scheduler:
        """The scheduler of this process at ``rate`` requests per second."""
        params: dict[str, Any] = {"kind": self.process, "rate": rate, "seed": seed}
        params.update({k: v for k, v in (("cv", self.cv), ("jitter", self.jitter)) if v is not None})
        return parse_scheduler(params)

    @model_validator(mode="after")
    def _check(self) -> ArrivalSpec:
        open_loop = [name for name in SCHEDULERS if issubclass(SCHEDULERS.get(name), RateScheduler)]
        if self.process not in open_loop:
            raise ValueError(f"process {self.process!r} is not one of {', '.join(open_loop)}")
        self.scheduler(1.0, 0)
        return self


class PrefixSpec(_Spec):
    """Shared prefixes: ``count`` distinct ones in ``group``, prepended to a ``fraction`` of requests."""

    group: str = Field(..., min_length=1, description="clients naming the same group share its prefixes")
    count: int = Field(default=1, ge=1, le=100_000, description="distinct prefixes in the group")
    length: LengthDistField = Field(..., description="length of each prefix (drawn once per prefix)")
    fraction: float = Field(
        default=1.0, ge=0, le=1, description="share of this client's requests that carry one"
    )
    zipf_s: float | None = Field(
        default=None, gt=0, description="Zipf exponent of prefix popularity (None: uniform)"
    )


class WindowSpec(_Spec):
    """A period in which a client sends, in seconds from the start of the stage."""

    start_s: float = Field(..., ge=0)
    end_s: float = Field(..., gt=0)

    @model_validator(mode="after")
    def _check(self) -> WindowSpec:
        if self.end_s <= self.start_s:
            raise ValueError(f"window ends ({self.end_s}) before it starts ({self.start_s})")
        return self


class MultiTurnSpec(_Spec):
    """Conversations: each round is sent ``think_time_s`` after the previous answer ended."""

    max_rounds: int = Field(..., ge=1, le=1000, description="rounds per conversation")
    think_time_s: float = Field(
        default=0.0, ge=0, description="client pause between an answer and the next round"
    )
    context_growth: Literal["accumulate", "fixed"] = Field(
        default="accumulate", description="accumulate: the next prompt holds all earlier prompts and answers"
    )


class ClientSpec(_Spec):
    """One kind of client: its share of the load, arrivals, lengths, prefixes and behaviour."""

    id: str = Field(..., min_length=1)
    tenant_id: str = ""
    slo_class: str = ""
    rate_fraction: float = Field(default=1.0, gt=0, description="relative share of the aggregate rate")
    arrival: ArrivalSpec = Field(default_factory=lambda: ArrivalSpec.model_validate({}))
    input_length: LengthDistField = Field(..., description="tokens of the request's own (unshared) input")
    output_length: LengthDistField = Field(..., description="tokens asked for (max_tokens)")
    paired_lengths: bool = Field(
        default=False,
        description="draw input and output together: both empirical ``values`` lists of one length, entry i "
        "of each one observed request (a dataset's pairs, e.g. ShareGPT's question and answer)",
    )
    prefix: PrefixSpec | None = None
    streaming: bool = True
    windows: list[WindowSpec] = Field(default_factory=list, description="active periods (none: always)")
    multi_turn: MultiTurnSpec | None = None
    sampling: dict[str, float | int | str | bool] = Field(
        default_factory=lambda: dict[str, float | int | str | bool](temperature=0.0),
        description="sampling parameters of every request",
    )

    @model_validator(mode="after")
    def _pairs(self) -> ClientSpec:
        if not self.paired_lengths:
            return self
        i, o = self.input_length, self.output_length
        if not (isinstance(i, EmpiricalDist) and isinstance(o, EmpiricalDist) and i.values and o.values):
            raise ValueError(
                "paired_lengths needs input_length and output_length of type empirical with values"
            )
        if len(i.values) != len(o.values) or (o.weights is not None and o.weights != i.weights):
            raise ValueError(
                "paired_lengths: input_length and output_length need values of one length (entry i of each "
                "is one pair), weighted by input_length's weights only"
            )
        return self

    @field_validator("windows")
    @classmethod
    def _ordered(cls, windows: list[WindowSpec]) -> list[WindowSpec]:
        for before, after in itertools.pairwise(windows):
            if after.start_s < before.end_s:
                raise ValueError("windows must be in order and must not overlap")
        return windows


class WorkloadSpec(_Spec):
    """A complete, reproducible workload: seed, clients and (for self-timed runs) the aggregate rate."""

    version: Literal[1] = 1
    name: str = Field(..., min_length=1)
    description: str = ""
    seed: int = Field(..., ge=0, description="seed of every length, prefix choice and arrival draw")
    aggregate_rate: float | None = Field(
        default=None, gt=0, description="requests per second over all clients"
    )
    clients: list[ClientSpec] = Field(..., min_length=1)
    notes: list[str] = Field(default_factory=list, description="provenance and caveats, reported with runs")

    def timing_fields(self) -> list[str]:
        """The fields by which the spec times its own arrivals (a command's single scheduler can't honour).

        ``aggregate_rate``, a client's ``arrival`` other than the default Poisson, and a client's
        ``windows``: a command runs such a spec self-timed (``Workload.plan``) or refuses it, naming these.
        """
        fields = ["aggregate_rate"] if self.aggregate_rate is not None else []
        default = ArrivalSpec.model_validate({})
        for c in self.clients:
            fields += [f"clients[{c.id}].arrival"] if c.arrival != default else []
            fields += [f"clients[{c.id}].windows"] if c.windows else []
        return fields

    @field_validator("clients")
    @classmethod
    def _unique_ids(cls, clients: list[ClientSpec]) -> list[ClientSpec]:
        ids = [c.id for c in clients]
        duplicates = sorted({i for i in ids if ids.count(i) > 1})
        if duplicates:
            raise ValueError(f"client ids must be unique: {', '.join(duplicates)}")
        return clients


class _StrictLoader(yaml.SafeLoader):
    """A YAML loader that rejects duplicate keys (PyYAML keeps the last one without a word)."""


def _mapping_without_duplicates(loader: _StrictLoader, node: yaml.MappingNode) -> dict[Any, Any]:
    seen: dict[Any, Any] = {}
    for key_node, value_node in node.value:
        key = loader.construct_object(key_node, deep=True)
        if key in seen:
            raise yaml.constructor.ConstructorError(None, None, f"duplicate key {key!r}", key_node.start_mark)
        seen[key] = loader.construct_object(value_node, deep=True)
    return seen


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _mapping_without_duplicates)


def load_workload_spec(path: str | Path) -> WorkloadSpec:
    """Read and validate a workload spec YAML file; every problem is reported with its field path."""
    path = Path(path)
    try:
        data = yaml.load(path.read_text(encoding="utf-8"), Loader=_StrictLoader)
    except UnicodeDecodeError as exc:
        raise WorkloadSpecError(
            f"{path} is not UTF-8 text (byte {exc.start}: {exc.reason}); save it as UTF-8"
        ) from None
    except yaml.YAMLError as exc:
        raise WorkloadSpecError(f"{path} is not valid YAML: {exc}") from None
    except OSError as exc:
        raise WorkloadSpecError(f"{path} cannot be read: {exc.strerror or exc}") from None
    if not isinstance(data, dict):
        raise WorkloadSpecError(f"{path}: a workload spec is a mapping, got {type(data).__name__}")
    try:
        return WorkloadSpec.model_validate(data)
    except ValidationError as exc:
        raise WorkloadSpecError(f"{path}: {format_validation_error(exc)}") from None
