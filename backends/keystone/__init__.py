"""Keystone v3: settings, the service token's lifecycle, group lookup, identity
mapping, and the backend (see :mod:`backends.keystone.backend`)."""

from __future__ import annotations

from backends.keystone.backend import KeystoneBackend
from backends.keystone.identity import map_identity, parse_keystone_time, token_scope
from backends.keystone.service_token import ServiceToken, ServiceTokenAuth
from backends.keystone.settings import (
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
