"""A definition file's ``engine:`` mapping, typed per engine kind: a preset plus ``EngineSpec`` fields.

Settings every kind reads (model, chunk_size, max_model_len, …) stand at the top; a setting only some
kinds read (``EngineKind.reads``: vLLM's ``cpu_kvcache_gib``, SGLang's ``max_total_tokens``, …) stands at
the top for the kind that runs, or under that kind's name to keep it for that kind alone::

    engine: {preset: cpu, max_model_len: 16384, vllm: {cpu_kvcache_gib: 2}}

so one file serves ``--engine sglang`` as well. A key that is not a setting is an error naming it (and the
setting it looks like), a setting the running kind does not read is an error naming the kinds that do,
a bad value an error naming the field: all when the definition is read, before a run folder exists.
Jobs resolve it to an ``EngineSpec`` once per run (``resolve``), never per point. Stored as written.
"""

from __future__ import annotations

import difflib
from typing import Any

from pydantic import RootModel, ValidationError, field_validator

from engine_harness.engines import ENGINE_KINDS, PRESETS, EngineSpec, engine_kind, spec_from_settings

__all__ = ["EngineSettings", "setting_error"]

KEYS = ("preset", *EngineSpec.model_fields)
KIND_ONLY = frozenset().union(*(k.reads for k in ENGINE_KINDS.values()))  # settings only some kinds read


def setting_error(key: str) -> str | None:
    """Why ``key`` is not an engine setting (with the one it looks like), or None when it is one."""
    if key in KEYS:
        return None
    like = difflib.get_close_matches(key, KEYS, n=1)
    return f"{key!r} is not an engine setting" + (f" (did you mean {like[0]!r}?)" if like else "")


def _kind_of(settings: dict[str, Any]) -> str:
    """The kind that runs: named, else the preset's, else vLLM (the spec's default)."""
    preset = PRESETS.get(str(settings.get("preset")), {})
    return str(settings.get("kind") or preset.get("kind") or "vllm")


def _not_read(key: str, kind: str) -> str:
    readers = sorted(name for name, k in ENGINE_KINDS.items() if key in k.reads)
    return (
        f"kind {kind!r} does not read {key!r} (a setting of {', '.join(readers)}); put it under "
        f"'{readers[0]}:' to keep it for that kind"
    )


def _errors(settings: dict[str, Any]) -> list[str]:
    kind = _kind_of(settings)
    errors: list[str] = []
    for key, value in settings.items():
        if key in ENGINE_KINDS:  # a kind's own block
            if not isinstance(value, dict):
                errors.append(f"{key}: the settings of kind {key!r} are a mapping, not {value!r}")
                continue
            for sub in value:
                why = setting_error(str(sub))
                if why is None and sub not in KIND_ONLY:
                    why = f"{sub!r} is read by every kind: put it at the top level"
                elif why is None and sub not in engine_kind(key).reads:
                    why = f"kind {key!r} does not read {sub!r}"
                if why is not None:
                    errors.append(f"{key}.{sub}: {why}")
        elif (why := setting_error(str(key))) is not None:
            errors.append(why)
        elif key in KIND_ONLY and key not in engine_kind(kind).reads:
            errors.append(_not_read(str(key), kind))
    return errors


def _for_kind(settings: dict[str, Any], kind: str) -> dict[str, Any]:
    """The settings that apply when ``kind`` runs: the top level and that kind's block."""
    own = {k: v for k, v in settings.items() if k not in ENGINE_KINDS}
    return own | settings.get(kind, {})


def _first_error(exc: ValidationError) -> str:
    e = exc.errors()[0]
    where = ".".join(str(x) for x in e["loc"])
    return f"{where}: {e['msg']}" if where else str(e["msg"])


class EngineSettings(RootModel[dict[str, Any]]):
    """``preset`` (one of ``engines.PRESETS``), ``EngineSpec`` fields that change it, and blocks of the
    settings only one kind reads (``vllm: {…}``, ``sglang: {…}``, ``sim: {…}``)."""

    root: dict[str, Any] = {"preset": "cpu"}

    @field_validator("root")
    @classmethod
    def _check(cls, settings: dict[str, Any]) -> dict[str, Any]:
        if errors := _errors(settings):
            raise ValueError("; ".join(errors))
        preset = settings.get("preset")
        if preset is not None and preset not in PRESETS:
            raise ValueError(f"unknown preset {preset!r}; known presets: {', '.join(sorted(PRESETS))}")
        try:
            spec_from_settings(_for_kind(settings, _kind_of(settings)))
        except ValidationError as exc:
            raise ValueError(_first_error(exc)) from None
        return settings

    def resolve(self, **overrides: Any) -> EngineSpec:
        """Defaults → preset → these settings (for the kind that runs) → ``overrides`` (``None`` ones
        ignored): one ``EngineSpec``."""
        return spec_from_settings(_for_kind(self.root, _kind_of(self.root)), **overrides)
