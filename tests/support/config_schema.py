"""Every settings field of the config, found by walking the pydantic schema
(authn_gateway.config.GatewayConfig and each backend's settings class), and a valid
document to set any one of them in. A new field, section or backend type is found
without a list to keep; a new section with required fields needs a line in
:data:`SECTIONS` (the tests that use it say so)."""

from __future__ import annotations

import copy
import types
from dataclasses import dataclass
from typing import Annotated, Any, Literal, Union, get_args, get_origin

from pydantic import BaseModel
from pydantic.fields import FieldInfo

from authn_gateway.config import GatewayConfig
from backends.registry import settings_types
from tests.support.config_helpers import STRONG

#: One valid backend of each type, the fewest keys it takes (parse only: nothing is
#: fetched or read).
BACKENDS: dict[str, dict[str, Any]] = {
    "static": {"type": "static", "name": "demo", "tokens": [{"token": "t", "username": "u"}]},
    "userinfo": {"type": "userinfo", "name": "ui", "url": "http://127.0.0.1:9/userinfo"},
    "keystone": {
        "type": "keystone",
        "name": "ks",
        "auth_url": "http://127.0.0.1:9/v3",
        "service": {"username": "gw", "password": "pw", "system_scope": "all"},
    },
    "ldap": {
        "type": "ldap",
        "name": "dir",
        "url": "ldaps://127.0.0.1:9",
        "user_dn_template": "uid={username},ou=people,dc=example",
    },
    "gitlab": {"type": "gitlab", "name": "gl"},
    "jwt": {
        "type": "jwt",
        "name": "oidc",
        "issuer": {"url": "https://127.0.0.1:9", "audiences": ["gw"]},
        "claimMappings": {"username": {"claim": "sub", "prefix": ""}},
    },
    "introspection": {
        "type": "introspection",
        "name": "opaque",
        "url": "http://127.0.0.1:9/introspect",
        "client_id": "gw",
        "client_secret": "pw",
        "claimMappings": {"username": {"claim": "sub", "prefix": ""}},
        "accept": {"client_ids": ["cli"]},
    },
}

#: The fewest keys of an optional section that has required fields (or a check that
#: asks for one), by class name.
SECTIONS: dict[str, Any] = {
    "TLSSettings": {"cert_file": "/nonexistent/cert.pem", "key_file": "/nonexistent/key.pem"},
    "CallerToken": {"name": "caller", "token": STRONG},
    "OpsListenerSettings": {"port": 0},
    "RedisSettings": {"url": "redis://127.0.0.1:9"},
    "InlineToken": {"token": "t", "username": "u"},
    "ExtraMapping": {"key": "example.com/k", "valueExpression": "claims.sub"},
    "UserValidationRule": {"expression": "true"},
    # The one cluster that needs no credentials: callers in no other cluster.
    "ClusterSettings": {"name": "default"},
    "AuthorizationSettings": {"keystone_policy_file": "/nonexistent/policy.json"},
    "Rule": {"resources": [{"verbs": ["get"]}]},
    "ResourceRule": {"verbs": ["get"]},
    "NonResourceRule": {"verbs": ["get"], "paths": ["/"]},
}

#: Keys a section needs beside it: redis needs a shared secret.
BESIDE: dict[str, dict[str, Any]] = {"redis": {"secret": STRONG}}


@dataclass(frozen=True)
class Spot:
    """One settings field: where it is (keys and list indexes, as the file spells them),
    which backend type it belongs to (None: the gateway's own), and its type."""

    path: tuple[str | int, ...]
    backend: str | None
    annotation: Any
    field: FieldInfo

    @property
    def name(self) -> str:
        """The path as an error line names it: ``backends[0].timeouts.total_seconds``."""
        out = ""
        for part in self.path:
            out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else part)
        return out

    @property
    def kind(self) -> type | None:
        """``int``, ``float``, ``bool``, ``str``..., or None for anything else."""
        inner = _plain(self.annotation)
        return inner if isinstance(inner, type) and not issubclass(inner, BaseModel) else None


def _plain(annotation: Any) -> Any:
    """The type under Annotated and Optional."""
    while True:
        origin = get_origin(annotation)
        if origin is Annotated:
            annotation = get_args(annotation)[0]
        elif origin in (Union, types.UnionType):
            args = [a for a in get_args(annotation) if a is not type(None)]
            if len(args) != 1:
                return annotation
            annotation = args[0]
        else:
            return annotation


def _submodels(annotation: Any) -> list[tuple[type[BaseModel], bool]]:
    """The models a field holds, each with whether it is in a list."""
    inner = _plain(annotation)
    if get_origin(inner) is list:
        return [(m, True) for m, _ in _submodels(get_args(inner)[0])]
    if isinstance(inner, type) and issubclass(inner, BaseModel):
        return [(inner, False)]
    return []


def _walk(cls: type[BaseModel], path: tuple[str | int, ...], backend: str | None) -> list[Spot]:
    spots = []
    for name, field in cls.model_fields.items():
        key = field.alias or name
        if (path, key) in (((), "backends"), (("backends", 0), "type")):
            continue  # the backends' union is walked type by type; "type" picks one
        here = (*path, key)
        models = _submodels(field.annotation)
        spots.append(Spot(here, backend, field.annotation, field))
        for model, listed in models:
            spots += _walk(model, (*here, 0) if listed else here, backend)
    return spots


def spots() -> list[Spot]:
    """Every field of the file: the gateway's, then each backend type's."""
    found = _walk(GatewayConfig, (), None)
    for cls in settings_types():
        found += _walk(cls, ("backends", 0), _type_of(cls))
    return found


def _type_of(cls: type[BaseModel]) -> str:
    (kind,) = get_args(cls.model_fields["type"].annotation)
    return str(kind)


def _section(cls_name: str) -> Any:
    return copy.deepcopy(SECTIONS.get(cls_name, {}))


def document(spot: Spot, value: Any) -> dict[str, Any]:
    """A valid config (but for ``value``) with ``value`` at ``spot``: the spot's backend
    type, and every section on the way filled with the fewest keys it takes."""
    doc: dict[str, Any] = {"backends": [copy.deepcopy(BACKENDS[spot.backend or "static"])]}
    place(doc, spot, value)
    return doc


def place(doc: dict[str, Any], spot: Spot, value: Any, backend: int = 0) -> None:
    """Set ``value`` at ``spot`` in ``doc`` (a backend spot in ``doc["backends"][backend]``,
    which must be of the spot's type), filling each section on the way that is missing."""
    for name, beside in BESIDE.get(str(spot.path[0]), {}).items():
        doc.setdefault(name, copy.deepcopy(beside))
    node: Any = doc
    cls: type[BaseModel] = GatewayConfig
    path = spot.path
    if spot.backend is not None:
        node, path = doc["backends"][backend], path[2:]
        cls = next(c for c in settings_types() if _type_of(c) == spot.backend)
    for i, key in enumerate(path):
        last = i == len(path) - 1
        if isinstance(key, int):
            continue
        field = next(f for n, f in cls.model_fields.items() if (f.alias or n) == key)
        if last:
            node[key] = value
            break
        model, listed = _submodels(field.annotation)[0]
        if listed:
            items = node.get(key)
            if not isinstance(items, list) or not items or not isinstance(items[0], dict):
                items = [_section(model.__name__)]
            node[key] = items
            node = items[0]
        else:
            if not isinstance(node.get(key), dict):
                node[key] = _section(model.__name__)
            node = node[key]
        cls = model


def literal_values(annotation: Any) -> tuple[Any, ...]:
    inner = _plain(annotation)
    return get_args(inner) if get_origin(inner) is Literal else ()
