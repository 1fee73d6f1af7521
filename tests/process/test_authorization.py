"""The SubjectAccessReview endpoint of a real gateway process, over a real socket: the
answers kube-apiserver's webhook authorizer reads (webhook.go: status.allowed, denied,
reason; 200 always, so that it has nothing to retry), the refusals of what is not a
review (a Kubernetes Status naming the field), the body bound, the caller check, and
the policy file read again while serving: a valid change in force, an invalid one
refused in one line with the old policy kept, and no policy at all."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.authorization_helpers import V1, V1BETA1, authorize, sar_body
from tests.support.procs import GatewayProcess, metric_value, start_gateway

ROLES = "alpha.kubernetes.io/identity/roles"
PROJECT = "alpha.kubernetes.io/identity/project/name"
CALLER = base64.b64encode(os.urandom(32)).decode()
# A second kube-apiserver, of the cluster "staging"; CALLER is in no cluster (default).
STAGING = base64.b64encode(os.urandom(32)).decode()

MEMBER = {"username": "alice", "uid": "u-1", "groups": ["developers"],
          "extra": {ROLES: ["member"], PROJECT: ["demo"]}}  # fmt: skip
VIEWER = {"username": "bob", "groups": [], "extra": {ROLES: ["viewer"], PROJECT: ["demo"]}}

POLICY = [
    {
        "users": {"roles": ["member"], "projects": ["demo"]},
        "resource_permissions": {"default/['pods', 'services']": ["get", "list"]},
        "nonresource_permissions": {"/healthz": ["get"]},
    }
]


def write(path: Path, content: Any) -> None:
    staged = path.with_suffix(".new")
    staged.write_text(content if isinstance(content, str) else json.dumps(content))
    os.replace(staged, path)


def config(policy: Path, **authorization: Any) -> dict[str, Any]:
    return {
        "server": {"caller_tokens": [{"name": "kube-apiserver", "token": CALLER},
                                     {"name": "staging-apiserver", "token": STAGING}],
                   "max_body_bytes": 4096},
        "clusters": [{"name": "staging", "caller_tokens": ["staging-apiserver"]}],
        "logging": {"level": "info"},
        "backends": [{"name": "static", "type": "static",
                      "tokens": [{"token": "t-" + CALLER, "username": "alice"}]}],
        "authorization": {"keystone_policy_file": str(policy), "reload_interval_seconds": 0.2,
                          **authorization},
    }  # fmt: skip


@pytest.fixture(scope="module")
def policy_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("authorization") / "policy.json"
    write(path, POLICY)
    return path


@pytest.fixture(scope="module")
def gateway(policy_file: Path) -> Iterator[GatewayProcess]:
    gw = start_gateway(config(policy_file), policy_file.parent, name="authorize")
    try:
        yield gw
    finally:
        gw.stop()


def status(gw: GatewayProcess, body: Any) -> dict[str, Any]:
    response = authorize(gw.url, body, CALLER)
    assert response.status_code == 200, response.text
    doc = response.json()
    assert doc["kind"] == "SubjectAccessReview" and doc["apiVersion"] == body["apiVersion"]
    return dict(doc["status"])


def test_a_member_may_read_pods_in_default_and_nothing_more(gateway: GatewayProcess) -> None:
    allowed = status(gateway, sar_body(MEMBER, verb="list"))
    assert allowed == {"allowed": True, "reason": "allowed by policy.json [0]"}
    assert status(gateway, sar_body(MEMBER, verb="delete"))["allowed"] is False
    assert status(gateway, sar_body(MEMBER, namespace="kube-system"))["allowed"] is False
    assert status(gateway, sar_body(VIEWER))["allowed"] is False
    assert status(gateway, sar_body(MEMBER, path="/healthz"))["allowed"] is True
    # No opinion, never denied: RBAC decides next.
    assert "denied" not in status(gateway, sar_body(VIEWER))


def test_v1beta1_is_answered_in_v1beta1(gateway: GatewayProcess) -> None:
    assert status(gateway, sar_body(MEMBER, api_version=V1BETA1))["allowed"] is True


@pytest.mark.parametrize(
    ("body", "headers", "code", "message"),
    [
        (b"{not json", {}, 400, "body is not valid JSON"),
        ({"apiVersion": V1, "kind": "SubjectAccessReview", "spec": {"user": "a"}}, {}, 400,
         "spec: exactly one of resourceAttributes and nonResourceAttributes must be set"),
        ({**sar_body(MEMBER), "spec": {**sar_body(MEMBER)["spec"], "groups": "devs"}}, {}, 400,
         "spec.groups must be a list of strings"),
        ({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview"}, {}, 400,
         f"apiVersion must be {V1} or {V1BETA1}"),
        (sar_body(MEMBER), {"content-type": "text/plain"}, 400,
         "Content-Type must be application/json"),
        (b"x" * 5000, {}, 413, "body larger than 4096 bytes"),
    ],
)  # fmt: skip
def test_what_is_not_a_review_is_refused_with_a_status_naming_the_problem(
    gateway: GatewayProcess, body: Any, headers: dict[str, str], code: int, message: str
) -> None:
    response = authorize(gateway.url, body, CALLER, headers=headers)
    assert response.status_code == code
    assert response.json() == {
        "apiVersion": "v1",
        "kind": "Status",
        "status": "Failure",
        "message": message,
        "reason": {400: "BadRequest", 413: "RequestEntityTooLarge"}[code],
        "code": code,
    }


def test_a_body_past_the_bound_sent_in_chunks_is_refused_unread(gateway: GatewayProcess) -> None:
    def chunks() -> Iterator[bytes]:
        for _ in range(10):
            yield b"x" * 1000

    response = httpx.post(f"{gateway.url}/authorize", content=chunks(), timeout=10,
                          headers={"content-type": "application/json",
                                   "authorization": f"Bearer {CALLER}"})  # fmt: skip
    assert response.status_code == 413


def test_decisions_are_counted_for_the_callers_cluster(gateway: GatewayProcess) -> None:
    def decisions() -> dict[tuple[str, str], float]:
        text = httpx.get(f"{gateway.url}/metrics", headers={"authorization": f"Bearer {CALLER}"},
                         timeout=10).text  # fmt: skip
        return {
            (cluster, answer): metric_value(text, "authn_gateway_authorization_decisions_total",
                                            cluster=cluster, answer=answer)
            for cluster in ("staging", "default")
            for answer in ("allowed", "no_opinion")
        }  # fmt: skip

    before = decisions()
    for token, body in ((STAGING, sar_body(MEMBER)), (STAGING, sar_body(VIEWER)),
                        (STAGING, sar_body(MEMBER)), (CALLER, sar_body(MEMBER))):  # fmt: skip
        assert authorize(gateway.url, body, token).status_code == 200
    after = decisions()
    assert {k: after[k] - before[k] for k in after} == {
        ("staging", "allowed"): 2, ("staging", "no_opinion"): 1,
        ("default", "allowed"): 1, ("default", "no_opinion"): 0,
    }  # fmt: skip


def test_an_unknown_caller_learns_nothing(gateway: GatewayProcess) -> None:
    for token in (None, "not-the-caller-token"):
        response = authorize(gateway.url, sar_body(MEMBER), token)
        assert response.status_code == 401
        assert "allowed" not in response.text
    assert httpx.get(f"{gateway.url}/authorize", timeout=5).status_code == 401
    get = httpx.get(f"{gateway.url}/authorize", headers={"authorization": f"Bearer {CALLER}"})
    assert get.status_code == 405


def test_a_changed_policy_is_in_force_without_a_restart_and_a_broken_one_refused(
    gateway: GatewayProcess, policy_file: Path
) -> None:
    viewer_reads = sar_body(VIEWER)
    assert status(gateway, viewer_reads)["allowed"] is False
    write(policy_file, [*POLICY, {"users": {"roles": ["viewer"], "projects": ["demo"]},
                                  "resource_permissions": {"*/*": ["get"]}}])  # fmt: skip
    deadline = time.monotonic() + 10
    while status(gateway, viewer_reads)["allowed"] is False and time.monotonic() < deadline:
        time.sleep(0.1)
    assert status(gateway, viewer_reads) == {
        "allowed": True,
        "reason": "allowed by policy.json [1]",
    }
    write(policy_file, [{"match": [{"type": "admin", "values": ["*"]}]}])
    logs = gateway.wait_for_log("policy refused")
    (line,) = [line for line in logs.splitlines() if "policy refused" in line]
    assert line.endswith(
        "authorization: policy refused, keeping the policy in force: "
        f"{policy_file}: [0].match[0].type: unknown match type 'admin' "
        "(role, project, group, user)"
    )
    assert status(gateway, viewer_reads)["allowed"] is True  # the old policy, kept
    metrics = httpx.get(f"{gateway.url}/metrics", headers={"authorization": f"Bearer {CALLER}"})
    assert metric_value(metrics.text, "authn_gateway_authorization_policy_refused") == 1
    assert metric_value(metrics.text, "authn_gateway_authorization_policy_reloads_total",
                        result="refused") == 1  # fmt: skip
    write(policy_file, POLICY)
    deadline = time.monotonic() + 10
    while status(gateway, viewer_reads)["allowed"] is True and time.monotonic() < deadline:
        time.sleep(0.1)
    assert status(gateway, viewer_reads)["allowed"] is False


def test_without_a_policy_every_review_is_no_opinion_and_check_config_says_why(
    tmp_path: Path,
) -> None:
    missing = tmp_path / "absent.json"
    gw = start_gateway(config(missing), tmp_path, name="no-policy")
    try:
        answer = status(gw, sar_body(MEMBER))
        assert answer == {"allowed": False, "reason": "authn-gateway: no policy could decide",
                          "evaluationError": "no policy in force"}  # fmt: skip
        assert f"no policy in force (answering no_opinion): {missing}: cannot read" in gw.logs()
        # TokenReviews are answered all the same.
        token_review = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview",
                        "spec": {"token": "t-" + CALLER}}  # fmt: skip
        review = httpx.post(f"{gw.url}/authenticate", json=token_review, timeout=10,
                            headers={"authorization": f"Bearer {CALLER}"})  # fmt: skip
        assert review.json()["status"]["authenticated"] is True
    finally:
        gw.stop()
    checked = subprocess.run(
        [sys.executable, "-m", "authn_gateway", "check-config", str(gw.config_path)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert checked.returncode == 1
    assert (
        f"authorization.keystone_policy_file: {missing}: cannot read: No such file or directory"
        in checked.stderr
    )
