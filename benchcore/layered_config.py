"""Settings in layers — defaults, then a YAML file, then command-line flags — validated into one model.

Shared by the interference sweep and the transfer benchmark: a missing or malformed file, an unknown
key or a bad value is one error naming the file, the field and the problem.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

__all__ = ["load_layered", "read_yaml", "shipped_file", "shipped_names"]

M = TypeVar("M", bound=BaseModel)


def load_layered(
    model: type[M],
    path: Path | None,
    overrides: dict[str, Any],
    *,
    what: str,
    hint: str,
    error: type[ValueError],
) -> M:
    """Defaults, then ``path`` (if any), then the non-None ``overrides`` (``engine`` merged key by key)."""
    data: dict[str, Any] = {}
    source = "command line"
    if path is not None:
        if not path.is_file():
            raise error(f"{what} {path} does not exist ({hint})")
        loaded = read_yaml(path, what, error)
        if not isinstance(loaded, dict):
            raise error(f"{what} {path} must hold a mapping of settings")
        data = loaded
        data.setdefault("name", path.stem)
        source = f"{path} + command line"
    overrides = dict(overrides)
    engine_over = {k: v for k, v in overrides.pop("engine", {}).items() if v is not None}
    if engine_over:
        data["engine"] = {**data.get("engine", {"preset": "cpu"}), **engine_over}
    data.update({k: v for k, v in overrides.items() if v is not None})
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        lines = [f"invalid {what} ({source}):"]
        lines += [
            f"  {'.'.join(str(x) for x in e['loc']) or '(top level)'}: {e['msg']}" for e in exc.errors()
        ]
        raise error("\n".join(lines)) from None
    except ValueError as exc:
        raise error(f"invalid {what} ({source}): {exc}") from None


def read_yaml(path: Path, what: str, error: type[Exception]) -> Any:
    """The YAML document in ``path``; a file that cannot be read, is not UTF-8 text or is not YAML raises
    ``error`` naming the file, the problem and where it is (never a traceback of the decoder)."""
    try:
        return yaml.safe_load(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError as exc:
        raise error(
            f"{what} {path} is not UTF-8 text (byte {exc.start}: {exc.reason}); save it as UTF-8"
        ) from None
    except yaml.YAMLError as exc:
        raise error(f"{what} {path} is not valid YAML: {exc}") from None
    except OSError as exc:
        raise error(f"{what} {path} cannot be read: {exc.strerror or exc}") from None


def shipped_names(folder: Path) -> list[str]:
    """The names of the YAML definitions shipped in ``folder`` (a preset folder of the package)."""
    return sorted(p.stem for p in folder.glob("*.yaml"))


def shipped_file(name: str | Path, folder: Path) -> Path | None:
    """A definition given by path, else by name in ``folder`` (``<name>.yaml``); None when neither exists."""
    for path in (Path(name), folder / f"{name}.yaml"):
        if path.is_file():
            return path
    return None
