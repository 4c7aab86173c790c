"""A running engine as a job sees it: a URL, a model, metric names, and whether it can restart.

``LaunchedEngine`` wraps an ``EngineProcess`` (vLLM, SGLang or the subprocess sim: restartable with new
settings); ``ExternalEngine`` is only a URL and cannot be restarted, so a job that needs a restart says so
instead of pretending. (The tests' in-process sim handle lives in ``tests/fixtures/inprocess_sim.py``.)

``EngineOverrides`` are ``EngineSpec`` fields to change from the spec the job launched the engine with
(the battery's 5.10 engine-settings configurations, an A/B arm: ``--arm NAME=engine:KEY=VALUE,...``, see
``parse_arm``); an arm may name another kind or model (``kind=sglang``: the ablation launches each arm
anew), but only a ``LaunchedEngine`` can be ``reconfigure``d with them, and only within its own kind and
model (one engine restarted with other settings). ``served_model`` and
``model_cards`` are the one reading of an engine's ``/v1/models``.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, overload
from urllib.parse import urlsplit

import aiohttp
import yaml
from pydantic import ValidationError

from benchcore.cli import BadInput
from benchcore.flags import arm
from engine_harness.engines import EngineSpec, auth_headers, engine_kind
from engine_harness.launch import EngineProcess
from engine_harness.metric_names import METRIC_TABLES, MetricNames, served_table, table_name
from engine_harness.metrics import MetricsError, scrape

__all__ = [
    "ARM_SYNTAX",
    "ENGINE_IDENTITY",
    "ENGINE_PREFIX",
    "PROBE_TIMEOUT_S",
    "EngineHandle",
    "EngineOverrides",
    "ExternalEngine",
    "LaunchedEngine",
    "NotOpenAIServer",
    "NotRestartable",
    "checked_endpoint",
    "model_cards",
    "parse_arm",
    "parse_engine_arm",
    "served_model",
]


# An override never names an endpoint (an arm that is a URL is ``NAME=URL``, not a setting).
_NOT_SETTINGS = frozenset({"url"})
# Fields that make a configuration another engine or another model, not other settings of this one: an
# ablation launches such an arm on its own; a restart of one running engine (``reconfigure``) refuses them.
ENGINE_IDENTITY = ("kind", "model", "served_model_name")


class NotRestartable(RuntimeError):
    """The engine cannot be restarted with other settings by this run (it did not launch it)."""


@dataclass(frozen=True)
class EngineOverrides:
    """``EngineSpec`` fields to change from the engine as launched (none: exactly as launched)."""

    values: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def parse(cls, text: str, engines: bool = False) -> EngineOverrides:
        """``KEY=VALUE[,KEY=VALUE...]`` with YAML scalar values, checked against ``EngineSpec`` (``of``)."""
        raw: dict[str, Any] = {}
        for item in filter(None, (part.strip() for part in text.split(","))):
            key, sep, value = item.partition("=")
            key = key.strip()
            if not sep or not key:
                raise ValueError(f"{item!r} is not KEY=VALUE")
            try:
                raw[key] = yaml.safe_load(value)
            except yaml.YAMLError:
                raise ValueError(f"{key}: {value!r} is not a YAML scalar") from None
        return cls.of(raw, engines)

    @classmethod
    def of(cls, raw: Mapping[str, Any], engines: bool = False) -> EngineOverrides:
        """``EngineSpec`` fields and values (a definition file's mapping), checked like ``parse``'s; the
        fields of ``ENGINE_IDENTITY`` only with ``engines`` (a job that launches each configuration)."""
        allowed = sorted(
            set(EngineSpec.model_fields) - _NOT_SETTINGS - set(() if engines else ENGINE_IDENTITY)
        )
        for key in raw:
            if key in ENGINE_IDENTITY and not engines:
                raise ValueError(
                    f"unknown engine setting {key!r} for a restart of this engine: another kind or model is "
                    "another engine (compare engines with python -m microbench.ablate)"
                )
            if key not in allowed:
                raise ValueError(f"unknown engine setting {key!r}; allowed: {', '.join(allowed)}")
        try:  # the kind only satisfies the spec's own check; the fields' checks do not depend on it
            spec = EngineSpec.model_validate({"kind": "sim", **raw})
        except ValidationError as exc:
            raise ValueError(
                "; ".join(f"{e['loc'][0]}={e['input']!r}: {e['msg']}" for e in exc.errors())
            ) from None
        return cls({key: getattr(spec, key) for key in raw})

    def identity_changes(self, spec: EngineSpec) -> dict[str, Any]:
        """The fields of ``ENGINE_IDENTITY`` these overrides change in ``spec`` (another kind or model)."""
        return {
            k: self.values[k]
            for k in ENGINE_IDENTITY
            if k in self.values and self.values[k] != getattr(spec, k)
        }

    def apply(self, spec: EngineSpec) -> EngineSpec:
        """``spec`` with these fields changed (validated again as a whole)."""
        return EngineSpec.model_validate(spec.model_dump() | self.values)

    def __str__(self) -> str:
        return "engine: " + (", ".join(f"{k}={v}" for k, v in self.values.items()) or "as launched")


PROBE_TIMEOUT_S = 10.0


class NotOpenAIServer(ValueError):
    """The URL does not lead to an OpenAI-compatible server; the message names what answered instead."""


async def model_cards(
    http: aiohttp.ClientSession, base_url: str, headers: Mapping[str, str] | None = None
) -> list[dict[str, Any]]:
    """The entries of the engine's ``/v1/models``: the one probe of an endpoint, shared by every job. An
    HTTP error raises ``aiohttp.ClientResponseError``; a URL that is not http(s), an answer that is not a
    model list (an HTML page, other JSON) or no answer within ``PROBE_TIMEOUT_S`` (read at each call)
    raise ``NotOpenAIServer``."""
    url = base_url.rstrip("/") + "/v1/models"
    timeout_s = PROBE_TIMEOUT_S
    if urlsplit(base_url).scheme not in ("http", "https") or not urlsplit(base_url).netloc:
        raise NotOpenAIServer(f"{base_url!r} is not an http(s) URL of an OpenAI-compatible server")
    try:
        async with http.get(url, headers=headers, timeout=aiohttp.ClientTimeout(total=timeout_s)) as resp:
            resp.raise_for_status()
            text, ctype = await resp.text(errors="replace"), resp.content_type
    except TimeoutError:
        raise NotOpenAIServer(
            f"{url} sent no answer within {timeout_s:g} s: not an OpenAI-compatible server (or a stalled one)"
        ) from None
    try:
        data = json.loads(text).get("data")
    except (ValueError, AttributeError):
        what = "an HTML page" if "html" in ctype or text.lstrip().startswith("<") else f"{ctype or 'a body'}"
        raise NotOpenAIServer(
            f"{url} answered with {what}, not a model list: not an OpenAI-compatible server"
        ) from None
    if not isinstance(data, list) or not data or not all(isinstance(c, dict) and "id" in c for c in data):
        raise NotOpenAIServer(f"{url} answered JSON without a model list: not an OpenAI-compatible server")
    return data


async def served_model(base_url: str, api_key_env: str | None = None) -> tuple[str, int | None]:
    """The first model of ``/v1/models`` and its ``max_model_len`` (None when not advertised)."""
    async with aiohttp.ClientSession() as http:
        card = (await model_cards(http, base_url, auth_headers(api_key_env)))[0]
    limit = card.get("max_model_len")
    return str(card["id"]), None if limit is None else int(limit)


@overload
async def checked_endpoint(
    base_url: str, api_key_env: str | None = None, *, may_be_starting: Literal[False] = False
) -> tuple[str, int | None]: ...
@overload
async def checked_endpoint(
    base_url: str, api_key_env: str | None = None, *, may_be_starting: bool, model_named: bool = False
) -> tuple[str, int | None] | None: ...
async def checked_endpoint(
    base_url: str, api_key_env: str | None = None, *, may_be_starting: bool = False, model_named: bool = False
) -> tuple[str, int | None] | None:
    """``served_model`` for a URL the user gave: every way it fails is bad input naming what answered and
    the fix (not an OpenAI server, a key refused: ``--api-key-env VAR``, an HTTP error, nothing there).
    The one check of an external endpoint before a job writes anything (sweep, battery, load generator).
    ``may_be_starting``: a refused connection is an engine still starting (None; the job waits for it).
    ``model_named``: the user named the model, so an endpoint without a model list (HTTP 404: a gateway
    that serves only the API) passes too (None); an HTML page, a silent port or a refused key still fail."""
    try:
        return await served_model(base_url, api_key_env)
    except NotOpenAIServer as exc:
        raise BadInput(f"--url: {exc}") from None
    except aiohttp.ClientResponseError as exc:
        if model_named and exc.status == 404:
            return None
        if exc.status not in (401, 403):
            raise BadInput(f"{base_url}/v1/models answered HTTP {exc.status} ({exc.message})") from None
        held = f"the key in ${api_key_env}" if api_key_env else "no API key"
        raise BadInput(
            f"{base_url}/v1/models refused {held} (HTTP {exc.status}); set --api-key-env VAR to the "
            "environment variable holding the engine's key"
        ) from None
    except (aiohttp.ClientError, TimeoutError, KeyError, IndexError, ValueError) as exc:
        if may_be_starting and isinstance(exc, aiohttp.ClientConnectorError):
            return None
        raise BadInput(
            f"no model list at {base_url}/v1/models ({type(exc).__name__}: {exc}); is the engine "
            "running, and is --url right?"
        ) from None


ENGINE_PREFIX = "engine:"
ARM_SYNTAX = f"NAME=URL or NAME={ENGINE_PREFIX}KEY=VALUE,..."


def parse_arm(value: str, engines: bool = False) -> tuple[str, str | EngineOverrides]:
    """``NAME=URL`` (an endpoint) or ``NAME=engine:[KEY=VALUE,...]`` (the launched engine restarted with
    those ``EngineSpec`` fields changed; ``engine:`` alone: as launched): an argparse ``type``. With
    ``engines`` (``parse_engine_arm``) the settings may name another kind or model.

    Shared by every job that compares configurations (battery 5.10, ablate); it lives here, not in
    ``benchcore.flags``, because its values are engine settings checked against ``EngineSpec``.
    """
    try:
        name, target = arm(value)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(f"--arm wants {ARM_SYNTAX}, got {value!r}") from None
    if not target:
        raise argparse.ArgumentTypeError(f"--arm wants {ARM_SYNTAX}, got {value!r}")
    if not target.startswith(ENGINE_PREFIX):
        return name, target
    try:
        return name, EngineOverrides.parse(target.removeprefix(ENGINE_PREFIX), engines)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"{name}: {exc}") from None


def parse_engine_arm(value: str) -> tuple[str, str | EngineOverrides]:
    """``parse_arm`` for a job that launches each arm on its own (ablate): kind and model are settings."""
    return parse_arm(value, engines=True)


class EngineHandle:
    """What every engine offers a job."""

    kind: str = "external"
    metrics: MetricNames = engine_kind("vllm").metrics
    version: str | None = None
    api_key_env: str | None = None  # the variable holding the key its /v1 routes need

    @property
    def base_url(self) -> str:
        raise NotImplementedError

    @property
    def settings(self) -> dict[str, Any]:
        return {}

    @property
    def can_restart(self) -> bool:
        return False

    @property
    def prefix_caching(self) -> bool | None:
        """Whether prefix caching is on (None: not known for an engine this run did not start)."""
        return None

    @property
    def can_reconfigure(self) -> bool:
        """Whether ``reconfigure`` works: this run launched the engine from an ``EngineSpec``."""
        return False

    async def set_prefix_caching(self, enabled: bool) -> None:
        """Restart with prefix caching on or off (raises ``NotRestartable`` where impossible)."""
        raise NotRestartable(f"engine kind {self.kind!r} is not started by this run and cannot be restarted")

    async def reconfigure(self, overrides: EngineOverrides) -> bool:
        """Restart as launched but with ``overrides`` unless it runs so already; True if it restarted."""
        raise NotRestartable(f"engine kind {self.kind!r} was not launched by this run from an engine spec")


class ExternalEngine(EngineHandle):
    """An engine someone else runs; reached at ``url``."""

    def __init__(self, url: str, metrics: MetricNames | None = None, api_key_env: str | None = None) -> None:
        self._url = url.rstrip("/")
        self.metrics = metrics or engine_kind("external").metrics
        self.api_key_env = api_key_env

    @classmethod
    async def reached(cls, url: str, api_key_env: str | None = None) -> ExternalEngine:
        """The engine at ``url``, read with the metric names its ``/metrics`` serves (an SGLang behind a
        URL is read as SGLang), or the external kind's default table where ``/metrics`` does not answer."""
        default = engine_kind("external").metrics
        async with aiohttp.ClientSession(headers=auth_headers(api_key_env)) as http:
            try:
                names = (await scrape(http, url.rstrip("/"))).names()
            except MetricsError:
                return cls(url, default, api_key_env)
        return cls(url, METRIC_TABLES[served_table(names, default=table_name(default))], api_key_env)

    @property
    def base_url(self) -> str:
        return self._url


class LaunchedEngine(EngineHandle):
    """An engine the suite launched through ``EngineProcess`` (restartable)."""

    def __init__(self, process: EngineProcess) -> None:
        self.process = process
        self.kind = process.spec.kind
        self.metrics = process.kind.metrics
        self.version = process.version
        self.api_key_env = process.spec.api_key_env
        self._launched = process.spec

    @property
    def base_url(self) -> str:
        return self.process.base_url

    @property
    def settings(self) -> dict[str, Any]:
        return self.process.spec.model_dump(exclude_defaults=True)

    @property
    def can_restart(self) -> bool:
        return self.process.kind.launched

    @property
    def prefix_caching(self) -> bool | None:
        return self.process.spec.prefix_caching if self.can_restart else None

    async def set_prefix_caching(self, enabled: bool) -> None:
        if not self.can_restart:
            await super().set_prefix_caching(enabled)
        spec: EngineSpec = self.process.spec
        if spec.prefix_caching != enabled:
            await self.process.restart(spec.model_copy(update={"prefix_caching": enabled}))

    @property
    def can_reconfigure(self) -> bool:
        return self.can_restart

    def restart_problem(self, overrides: EngineOverrides) -> str | None:
        """Why ``reconfigure(overrides)`` would refuse: another kind or model than the launched one."""
        if not (changed := overrides.identity_changes(self._launched)):
            return None
        return (
            f"{overrides} changes {', '.join(f'{k} to {v!r}' for k, v in changed.items())}: a restart "
            f"keeps the launched {self.kind} engine and model; compare engines or models with "
            "python -m microbench.ablate, which launches each arm"
        )

    async def reconfigure(self, overrides: EngineOverrides) -> bool:
        if not self.can_reconfigure:
            return await super().reconfigure(overrides)
        if (problem := self.restart_problem(overrides)) is not None:
            raise NotRestartable(problem)
        spec = overrides.apply(self._launched)
        if spec == self.process.spec:
            return False
        await self.process.restart(spec)
        return True
