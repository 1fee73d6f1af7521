"""What a config reload keeps: the state of every backend whose identity did not change.

A backend's *identity-relevant* settings are all of its settings except those in
:data:`NOT_IDENTITY`: its type, name, URL, credentials, mappings, group rules, TLS
trust, token prefix and so on, everything that can change which identity a token
maps to. A reload that leaves them alone keeps that backend's cached answers
(fresh and stale), its breaker state and its outbound bucket; a reload that changes
them starts that backend afresh, and its cached answers are asked again, never
served (they are keyed by the :func:`identity_fingerprint`).

New settings fields are identity-relevant unless listed here: the safe default.
"""

from __future__ import annotations

import hashlib
from typing import Any

import orjson
from pydantic import BaseModel

from backends.settings import BackendSettings

#: Settings that change how a backend is protected, never whom a token belongs to.
NOT_IDENTITY = frozenset(
    {
        "cache",  # TTLs and max_stale: how long an answer is kept, not what it is
        "breaker",
        "bucket",
        "timeouts",
        "token_rules",  # local pre-rejection by length: never changes an identity
        "audiences",  # checked after the cache, on every answer
        "in_chain",  # which tokens reach the backend, not what it answers
    }
)


def _plain(value: Any) -> Any:
    """Settings as JSON-able values, secrets included (hashed, never shown)."""
    if isinstance(value, BaseModel):
        return {k: _plain(getattr(value, k)) for k in type(value).model_fields}
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [_plain(v) for v in value]
    if hasattr(value, "get_secret_value"):
        return value.get_secret_value()
    if isinstance(value, str | int | float | bool) or value is None:
        return value
    return str(value)


def identity_fingerprint(settings: BaseModel) -> str:
    """A short digest of a backend's identity-relevant settings."""
    fields = {
        k: _plain(getattr(settings, k))
        for k in type(settings).model_fields
        if k not in NOT_IDENTITY
    }
    digest = hashlib.sha256(orjson.dumps(fields, option=orjson.OPT_SORT_KEYS)).hexdigest()
    return digest[:16]


def cache_namespace(settings: BackendSettings) -> str:
    """What a backend's cache keys are made under: its name and identity fingerprint
    (``#`` cannot occur in a backend name, so no two namespaces run into each other)."""
    return f"{settings.name}#{identity_fingerprint(settings)}"
