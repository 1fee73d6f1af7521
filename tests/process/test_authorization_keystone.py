"""Authorization from the identity the TokenReview produced: against a real Keystone
(Debian's, tests/support/keystone.py), a TokenReview costs Keystone its calls, and the
SubjectAccessReviews for the same identity, decided by a k8s-keystone-auth policy over
its roles and project, cost Keystone none: counted by Keystone's own request log."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.authorization_helpers import authorize, sar_body
from tests.support.keystone import Keystone, start_keystone
from tests.support.procs import GatewayProcess, start_gateway

PASSWORDS = {"alice": "Alice-pass-1", "bob": "Bob-pass-1", "gw-system": "Gw-system-pass-1"}

# k8s-keystone-auth's documented example: members of project demo read pods in default.
POLICY = [
    {
        "resource": {"verbs": ["get", "list", "watch"], "resources": ["pods"], "version": "*",
                     "namespace": "default"},
        "match": [{"type": "role", "values": ["member"]}, {"type": "project", "values": ["demo"]}],
    }
]  # fmt: skip


@pytest.fixture(scope="module")
def keystone(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Keystone, Path]]:
    workdir = tmp_path_factory.mktemp("keystone-authz")
    ks = start_keystone(workdir / "server")
    try:
        demo = ks.create("project", name="demo", domain_id="default")
        ids = {name: ks.user(name, password) for name, password in PASSWORDS.items()}
        ks.grant_project(ids["alice"], demo, "member")
        ks.grant_project(ids["bob"], demo, "reader")
        ks.grant_system(ids["gw-system"], "reader")
        yield ks, workdir
    finally:
        ks.stop()


@pytest.fixture(scope="module")
def gateway(keystone: tuple[Keystone, Path]) -> Iterator[GatewayProcess]:
    ks, workdir = keystone
    (workdir / "policy.json").write_text(json.dumps(POLICY))
    (workdir / "gw.password").write_text(PASSWORDS["gw-system"] + "\n")
    config: dict[str, Any] = {
        "secret": "authz-keystone-test-only-Hn4Wq8zR2mK6vT1xB9cY3uL7aE5sD0",
        "review_deadline_seconds": 9.0,
        "backends": [{
            "name": "keystone", "type": "keystone", "auth_url": ks.url,
            "service": {"username": "gw-system", "password": f"file:{workdir / 'gw.password'}",
                        "system_scope": "all"},
            "timeouts": {"connect_seconds": 2.0, "read_seconds": 8.0, "total_seconds": 8.0},
        }],
        "authorization": {"keystone_policy_file": str(workdir / "policy.json")},
    }  # fmt: skip
    gw = start_gateway(config, workdir, name="authz-keystone")
    try:
        gw.wait_for_log("logged in to Keystone as the service user", timeout=60)
        yield gw
    finally:
        gw.stop()


def identity(gw: GatewayProcess, token: str) -> dict[str, Any]:
    for _ in range(5):  # a busy machine may need a second try
        status = gw.review(token, timeout=15).json()["status"]
        if status.get("authenticated"):
            return dict(status["user"])
    pytest.fail(f"not authenticated: {status}")


def settled(ks: Keystone) -> int:
    """Keystone's count once it has stopped moving for a second: uWSGI writes a
    request's line after its answer, and the gateway's start-up calls (service login,
    readiness probe) may still be arriving."""
    count, stable_since = ks.requests_served(), time.monotonic()
    deadline = stable_since + 30
    while time.monotonic() - stable_since < 1.0 and time.monotonic() < deadline:
        time.sleep(0.1)
        now = ks.requests_served()
        if now != count:
            count, stable_since = now, time.monotonic()
    return count


def allowed(gw: GatewayProcess, body: dict[str, Any]) -> bool:
    response = authorize(gw.url, body)
    assert response.status_code == 200, response.text
    return bool(response.json()["status"]["allowed"])


def test_authorization_reviews_of_a_known_identity_cost_keystone_nothing(
    keystone: tuple[Keystone, Path], gateway: GatewayProcess
) -> None:
    ks, _ = keystone
    scoped = {"project": {"name": "demo", "domain": {"id": "default"}}}
    tokens = {who: ks.issue(who, PASSWORDS[who], scoped)[0] for who in ("alice", "bob")}
    before_review = settled(ks)
    users = {who: identity(gateway, token) for who, token in tokens.items()}
    after_review = settled(ks)
    assert after_review > before_review, "the TokenReviews must have asked Keystone"
    assert "member" in users["alice"]["extra"]["alpha.kubernetes.io/identity/roles"]

    decisions = {
        (who, verb, namespace): allowed(
            gateway, sar_body(users[who], verb=verb, namespace=namespace)
        )
        for who in ("alice", "bob")
        for verb in ("get", "list", "delete")
        for namespace in ("default", "kube-system")
    }
    again = allowed(gateway, sar_body(users["alice"], verb="get"))  # from the cache
    assert settled(ks) == after_review, "an authorization review called Keystone"
    assert again is True
    assert {key for key, yes in decisions.items() if yes} == {
        ("alice", "get", "default"),
        ("alice", "list", "default"),
    }
    metrics = httpx.get(f"{gateway.url}/metrics", timeout=10).text
    allowed_v1 = '{answer="allowed",api_version="authorization.k8s.io/v1",cluster="default"} 3.0'
    assert f"authn_gateway_authorization_decisions_total{allowed_v1}" in metrics
