"""Helpers shared by the tiers of test_tls."""

from __future__ import annotations

STATIC = {
    "name": "demo",
    "type": "static",
    "tokens": [{"token": "demo-admin-token", "username": "demo-admin", "uid": "1000"}],
}
