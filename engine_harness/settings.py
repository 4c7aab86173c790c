"""A definition file's ``engine:`` mapping, typed: a preset plus ``EngineSpec`` fields, checked when read.

The sweep and transfer definitions hold one ``EngineSettings``; a key that is not a setting is an error
naming the key (and the setting it looks like), a value of the wrong type or a combination the engine kind
refuses is an error naming the field, all before a run folder exists. Jobs resolve it to an
``EngineSpec`` once per run (``resolve``), never per point. Stored as given (the manifest keeps what the
user wrote, not the preset's expansion), so a run's definition reads back as it was written.
"""

from __future__ import annotations

import difflib
from typing import Any

from pydantic import RootModel, ValidationError, field_validator

from engine_harness.engines import PRESETS, EngineSpec, spec_from_settings

__all__ = ["EngineSettings", "setting_error"]

KEYS = ("preset", *EngineSpec.model_fields)


def setting_error(key: str) -> str | None:
    """Why ``key`` is not an engine setting (with the one it looks like), or None when it is one."""
    if key in KEYS:
        return None
    like = difflib.get_close_matches(key, KEYS, n=1)
    return f"{key!r} is not an engine setting" + (f" (did you mean {like[0]!r}?)" if like else "")


def _first_error(exc: ValidationError) -> str:
    e = exc.errors()[0]
    where = ".".join(str(x) for x in e["loc"])
    return f"{where}: {e['msg']}" if where else str(e["msg"])


class EngineSettings(RootModel[dict[str, Any]]):
    """``preset`` (one of ``engines.PRESETS``) and ``EngineSpec`` fields that change it."""

    root: dict[str, Any] = {"preset": "cpu"}

    @field_validator("root")
    @classmethod
    def _check(cls, settings: dict[str, Any]) -> dict[str, Any]:
        wrong = [why for key in settings if (why := setting_error(str(key))) is not None]
        if wrong:
            raise ValueError("; ".join(wrong))
        preset = settings.get("preset")
        if preset is not None and preset not in PRESETS:
            raise ValueError(f"unknown preset {preset!r}; known presets: {', '.join(sorted(PRESETS))}")
        try:
            spec_from_settings(settings)
        except ValidationError as exc:
            raise ValueError(_first_error(exc)) from None
        return settings

    def resolve(self, **overrides: Any) -> EngineSpec:
        """Defaults → preset → these settings → ``overrides`` (``None`` ones ignored): one ``EngineSpec``."""
        return spec_from_settings(self.root, **overrides)
