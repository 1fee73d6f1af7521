"""Backend types register themselves here; the config's ``backends:`` union is built
from this registry, so a new backend type touches nothing else.

    @register
    class JWTSettings(BackendSettings):
        type: Literal["jwt"]
        def build(self, budget: CallBudget = UNLIMITED) -> Backend: ...

and add its module to :data:`backends.BUILTIN`.

A backend kept in a module of its own, apart from its settings (keystone), registers
itself as what its settings build (``@builds(KeystoneSettings)``), and the settings'
``build`` calls :func:`build_registered`: the settings module never imports the backend,
which imports it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar, cast, get_args

from backends.base import Backend
from backends.budget import CallBudget
from backends.settings import BackendSettings

S = TypeVar("S", bound=type[BackendSettings])
B = TypeVar("B", bound=type[Backend])

_TYPES: dict[str, type[BackendSettings]] = {}
# Settings class -> the backend it builds, called as backend(settings, budget=budget).
_BACKENDS: dict[type[BackendSettings], Callable[..., Backend]] = {}


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


def builds(settings_type: type[BackendSettings]) -> Callable[[B], B]:
    """Class decorator for a backend: the one ``settings_type`` builds (see the module's
    docstring), constructed as ``backend(settings, budget=budget)``."""

    def record(backend: B) -> B:
        existing = _BACKENDS.get(settings_type)
        if existing is not None and existing is not backend:
            raise ValueError(f"{settings_type.__name__} builds two backends")
        _BACKENDS[settings_type] = backend
        return backend

    return record


def build_registered(settings: BackendSettings, budget: CallBudget) -> Backend:
    """The backend registered with :func:`builds` for ``settings``' class."""
    backend = _BACKENDS.get(type(settings))
    if backend is None:
        raise NotImplementedError(
            f"backend type {settings.type!r}: no backend is registered to build it (@builds)"
        )
    return backend(settings, budget=budget)
