"""Helpers shared by the tiers of test_gitlab."""

from __future__ import annotations

from typing import Any

from tests.support.fakes.gitlab import FakeGitLab

ALICE, BOB, CAROL, DAVE, ERIN, FRANK = 1, 2, 3, 4, 5, 6

MANY = 250  # carol's groups: three pages of 100


def oauth(n: int) -> str:
    """An OAuth access token shaped like GitLab's (64 hex digits, no prefix)."""
    return f"{n:064x}"


def seed() -> dict[str, Any]:
    users = [
        {"id": ALICE, "username": "alice"},
        {"id": BOB, "username": "bob", "state": "blocked"},
        {"id": CAROL, "username": "carol"},
        {"id": DAVE, "username": "dave", "state": "deactivated"},
        {"id": ERIN, "username": "erin", "is_admin": True},
        {"id": FRANK, "username": "frank"},
    ]
    groups: list[dict[str, Any]] = [
        {"id": 10, "path": "platform", "name": "Platform", "members": {ALICE: 30, FRANK: 10}},
        {"id": 11, "path": "sre", "name": "SRE", "parent_id": 10},
        {"id": 12, "path": "payments", "members": {ALICE: 20, ERIN: 50}},
        {"id": 13, "path": "guests", "members": {FRANK: 10, ALICE: 10}},
    ]
    groups += [
        {"id": 1000 + i, "path": f"many-{i:03d}", "members": {CAROL: 30}} for i in range(MANY)
    ]
    return {"users": users, "tokens": [], "groups": groups}


def add_token(fake: FakeGitLab, token: str, user: int, **fields: Any) -> str:
    kind = "personal" if token.startswith("glpat-") else "oauth"
    fake.load_seed({"tokens": [{"token": token, "user_id": user, "kind": kind, **fields}]}, False)
    return token


def gitlab_backend(base_url: str, **overrides: Any) -> dict[str, Any]:
    backend: dict[str, Any] = {
        "name": "gitlab",
        "type": "gitlab",
        "base_url": base_url,
        "timeouts": {"connect_seconds": 0.5, "read_seconds": 1.0, "total_seconds": 1.5},
        "breaker": {"fail_max": 3, "reset_timeout_seconds": 1.0},
        "bucket": {"rate": 1000, "burst": 1000},
    }
    backend.update(overrides)
    return backend
