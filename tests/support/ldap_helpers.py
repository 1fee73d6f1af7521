"""Helpers shared by the tiers of test_ldap."""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

from backends.ldap import (
    LDAPBackend,
    LDAPSettings,
)
from tests.support.slapd import (
    PEOPLE,
    SERVICE_DN,
    USERS,
)


def token(username: str, password: str) -> str:
    return base64.b64encode(f"{username}:{password}".encode()).decode()


def pw(uid: str) -> str:
    return USERS[uid].password


def _config(**backend: Any) -> str:
    lines = "".join(f"    {k}: {v}\n" for k, v in backend.items())
    return f"backends:\n  - name: corp\n    type: ldap\n{lines}"


def backend_for(server_url: str, password_file: Path, **overrides: Any) -> LDAPBackend:
    settings = {
        "name": "ldap",
        "type": "ldap",
        "url": server_url,
        "bind_dn": SERVICE_DN,
        "bind_password": f"file:{password_file}",
        "user_base": PEOPLE,
        "timeouts": {"connect_seconds": 0.5, "read_seconds": 0.5, "total_seconds": 2.0},
        **overrides,
    }
    return LDAPBackend(LDAPSettings.model_validate(settings))
