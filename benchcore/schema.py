"""The one strict base model of every settings object and stored record."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

__all__ = ["StrictModel"]


class StrictModel(BaseModel):
    """Unknown keys are an error: a misspelled key would otherwise be dropped without a word."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)
