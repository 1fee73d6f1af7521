"""Keystone v3: settings, the service token's lifecycle, group lookup, identity
mapping, and the backend (see :mod:`backends.keystone.backend`)."""

from __future__ import annotations

from .backend import KeystoneBackend
from .identity import map_identity, parse_keystone_time, token_scope
from .service_token import ServiceToken, ServiceTokenAuth
from .settings import (
    FERNET_MIN_LENGTH,
    GroupLookupSettings,
    KeystoneSettings,
    ServiceCredentials,
    ServiceTokenSettings,
)

__all__ = [
    "FERNET_MIN_LENGTH",
    "GroupLookupSettings",
    "KeystoneBackend",
    "KeystoneSettings",
    "ServiceCredentials",
    "ServiceToken",
    "ServiceTokenAuth",
    "ServiceTokenSettings",
    "map_identity",
    "parse_keystone_time",
    "token_scope",
]
