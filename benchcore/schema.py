"""The one strict base model of every settings object and stored record."""

from __future__ import annotations

from typing import Annotated

from pydantic import AfterValidator, BaseModel, ConfigDict

__all__ = ["FolderName", "StrictModel"]


class StrictModel(BaseModel):
    """Unknown keys are an error: a misspelled key would otherwise be dropped without a word."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)


def _one_path_component(name: str) -> str:
    if not name or name in (".", "..") or name.startswith(".") or any(c in name for c in "/\\\0"):
        raise ValueError(
            f"{name!r} becomes part of a folder name: one name without '/', '\\' or a leading '.' "
            "(it may never lead outside the folder it is meant for)"
        )
    return name


FolderName = Annotated[str, AfterValidator(_one_path_component)]
"""A name from a definition file that becomes part of a path (a run's ``name:``): one path component."""
