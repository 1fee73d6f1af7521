"""What a gateway config reads from its environment: files and environment variables.

Walks a parsed (not validated) config along the pydantic schema
(authn_gateway.config.GatewayConfig and each backend's settings class), so a new
file or secret option is found without a list to keep: a ``Path`` field names a file;
a secret field (``backends.settings.Secret``) names a file as ``file:PATH`` or a
variable as ``env:NAME``. Two options name files the gateway *writes*: they must be
on a writable mount.
"""

from __future__ import annotations

import types
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Union, get_args, get_origin

from pydantic import BaseModel, SecretStr

from authn_gateway.config import GatewayConfig
from backends.registry import settings_types

#: Options whose file the gateway writes (the audit log: unless "-", stdout).
WRITTEN = {"deny_list.file", "server.audit_log"}


@dataclass(frozen=True)
class Ref:
    field: str
    kind: str  # "file" (read), "written" or "env"
    value: str


def _backend_class(data: Any) -> type[BaseModel] | None:
    if not isinstance(data, dict):
        return None
    for cls in settings_types():
        annotation = cls.model_fields["type"].annotation
        if data.get("type") in get_args(annotation):
            return cls
    return None


def _walk_model(cls: type[BaseModel], data: Any, path: str) -> list[Ref]:
    if not isinstance(data, dict):
        return []
    refs = []
    for name, field in cls.model_fields.items():
        key = field.alias or name
        if key not in data:
            continue
        where = f"{path}.{key}" if path else key
        if where in WRITTEN and isinstance(data[key], str) and data[key] != "-":
            refs.append(Ref(where, "written", data[key]))
            continue
        refs += _walk(field.annotation, tuple(field.metadata), data[key], where)
    return refs


def _walk(annotation: Any, metadata: tuple[Any, ...], value: Any, path: str) -> list[Ref]:
    origin = get_origin(annotation)
    if origin is Annotated:
        inner, *extra = get_args(annotation)
        return _walk(inner, (*metadata, *extra), value, path)
    if origin in (Union, types.UnionType):
        args = [a for a in get_args(annotation) if a is not type(None)]
        if len(args) > 1 and all(isinstance(a, type) and issubclass(a, BaseModel) for a in args):
            cls = _backend_class(value)  # the discriminated union of backend types
            return _walk_model(cls, value, path) if cls else []
        return [ref for a in args for ref in _walk(a, metadata, value, path)]
    if origin is list and isinstance(value, list):
        (item,) = get_args(annotation)
        return [r for i, v in enumerate(value) for r in _walk(item, metadata, v, f"{path}[{i}]")]
    if annotation is Path and isinstance(value, str):
        return [Ref(path, "file", value)]
    if annotation is SecretStr and isinstance(value, str):
        if value.startswith("file:"):
            return [Ref(path, "file", value[5:])]
        if value.startswith("env:"):
            return [Ref(path, "env", value[4:])]
        return []
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return _walk_model(annotation, value, path)
    return []


def references(config: dict[str, Any]) -> list[Ref]:
    """Every file and environment variable ``config`` names, with the option naming it."""
    return _walk_model(GatewayConfig, config, "")
