"""Backend types register themselves here; the config's ``backends:`` union is built
from this registry, so a new backend type touches nothing else.

    @register
    class JWTSettings(BackendSettings):
        type: Literal["jwt"]
        def build(self, budget: CallBudget = UNLIMITED) -> Backend: ...

and add its module to :data:`backends.BUILTIN`.
"""

from __future__ import annotations

from typing import Any, TypeVar, cast, get_args

from backends.settings import BackendSettings

S = TypeVar("S", bound=type[BackendSettings])

_TYPES: dict[str, type[BackendSettings]] = {}


def register(cls: S) -> S:
    """Class decorator for a backend's settings; its ``type`` literal is its name."""
    fields: dict[str, Any] = cast(Any, cls).model_fields
    (name,) = get_args(fields["type"].annotation)
    existing = _TYPES.get(name)
    if existing is not None and existing is not cls:
        raise ValueError(f"backend type {name!r} is registered twice")
    _TYPES[name] = cls
    return cls


def settings_types() -> tuple[type[BackendSettings], ...]:
    """Every registered settings class, in registration order."""
    return tuple(_TYPES.values())


def type_names() -> tuple[str, ...]:
    return tuple(_TYPES)
