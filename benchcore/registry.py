"""Name → implementation registries: schedulers, length distributions and workloads register themselves.

Adding a scheduler (or a distribution, or a reference workload) is adding a class or function with a
``@REGISTRY.register("name")`` decorator; nothing else in the code lists them. ``validate_by_name`` turns a
plain mapping such as ``{"kind": "poisson", "rate": 10}`` into the registered pydantic model, with an error
that names the known kinds when the name is wrong and the offending fields when a value is.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any, Generic, TypeVar, cast

from pydantic import BaseModel, ValidationError

__all__ = ["Registry", "format_validation_error", "validate_by_name"]

T = TypeVar("T")
M = TypeVar("M", bound=BaseModel)


class Registry(Generic[T]):
    """A mapping from a name to one implementation, filled by a decorator at import time."""

    def __init__(self, what: str) -> None:
        self.what = what
        self._items: dict[str, T] = {}

    def register(self, name: str) -> Callable[[T], T]:
        def add(item: T) -> T:
            if name in self._items:
                raise ValueError(f"{self.what} {name!r} is registered twice")
            self._items[name] = item
            return item

        return add

    def get(self, name: str) -> T:
        try:
            return self._items[name]
        except KeyError:
            known = ", ".join(sorted(self._items))
            raise KeyError(f"unknown {self.what} {name!r}; known: {known}") from None

    def names(self) -> list[str]:
        return sorted(self._items)

    def __contains__(self, name: object) -> bool:
        return name in self._items

    def __iter__(self) -> Iterator[str]:
        return iter(sorted(self._items))


def format_validation_error(exc: ValidationError, prefix: str = "") -> str:
    """One line per problem: ``path.to.field: message`` (the input value is left out: it may be long)."""
    lines = []
    for err in exc.errors():
        loc = ".".join(str(part) for part in (prefix, *err["loc"]) if part != "")
        message = err["msg"].removeprefix("Value error, ")
        lines.append(f"{loc}: {message}" if loc else message)
    return "; ".join(lines)


def validate_by_name(registry: Registry[type[M]], data: Any, key: str) -> M:
    """``data`` (a model instance or a mapping with ``key`` naming the kind) → the registered model."""
    if isinstance(data, BaseModel):
        return cast(M, data)
    if not isinstance(data, Mapping):
        raise ValueError(f"a {registry.what} is a mapping with a {key!r} key, got {type(data).__name__}")
    name = data.get(key)
    if name is None:
        raise ValueError(f"a {registry.what} needs {key!r}: one of {', '.join(registry.names())}")
    try:
        cls = registry.get(str(name))
    except KeyError as exc:
        raise ValueError(exc.args[0]) from None
    try:
        return cls.model_validate(dict(data))
    except ValidationError as exc:
        raise ValueError(f"{registry.what} {name!r}: {format_validation_error(exc)}") from None
