"""Helpers shared by the tiers of test_secrets."""

from __future__ import annotations

import base64
import os
from typing import Any

STATIC = {"name": "demo", "type": "static", "tokens": [{"token": "t", "username": "u"}]}


def random_secret() -> str:
    return base64.b64encode(os.urandom(32)).decode()


def ldap(password: Any) -> dict[str, Any]:
    return {
        "name": "corp",
        "type": "ldap",
        "url": "ldaps://ldap.invalid",
        "bind_dn": "cn=gw,dc=example,dc=org",
        "bind_password": password,
        "user_base": "ou=people,dc=example,dc=org",
    }


def static(token: Any) -> dict[str, Any]:
    return {**STATIC, "tokens": [{"token": token, "username": "u"}]}
