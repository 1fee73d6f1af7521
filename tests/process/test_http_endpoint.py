"""The TokenReview endpoint over real HTTP, against a real ``authn-gateway serve`` process."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.backend_configs import userinfo_backend
from tests.support.fakes.idp import FakeIdP
from tests.support.procs import V1, V1BETA1, GatewayProcess, metric_value, start_gateway

STATIC = {
    "name": "static",
    "type": "static",
    "audiences": ["https://kubernetes.default.svc"],
    "tokens": [
        {"token": "alice-token", "username": "alice", "uid": "1", "groups": ["devs", "ops"]},
        {"token": "bob-token", "username": "bob"},
    ],
}


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Any:
    gw = start_gateway({"backends": [STATIC]}, tmp_path_factory.mktemp("http"))
    yield gw
    gw.stop()


@pytest.mark.parametrize("version", [V1, V1BETA1])
def test_valid_token_is_authenticated_in_the_version_asked(
    gateway: GatewayProcess, version: str
) -> None:
    r = gateway.review("alice-token", api_version=version)
    assert r.status_code == 200
    doc = r.json()
    assert doc["apiVersion"] == version
    assert doc["kind"] == "TokenReview"
    assert doc["status"]["authenticated"] is True
    assert doc["status"]["user"] == {
        "username": "alice",
        "uid": "1",
        "groups": ["devs", "ops"],
        "extra": {"authn-gateway.io/backend": ["static"]},
    }


@pytest.mark.parametrize("version", [V1, V1BETA1])
def test_invalid_token_is_refused_without_error(gateway: GatewayProcess, version: str) -> None:
    r = gateway.review("mallory-token", api_version=version)
    assert r.status_code == 200
    assert r.json() == {
        "apiVersion": version,
        "kind": "TokenReview",
        "status": {"authenticated": False},
    }


def test_reply_never_contains_the_token(gateway: GatewayProcess) -> None:
    for token in ("alice-token", "unknown-secret-value"):
        assert token not in gateway.review(token).text


def test_kube_apiserver_style_call_with_query_and_keepalive(gateway: GatewayProcess) -> None:
    headers = {"Accept-Encoding": "gzip", "Content-Type": "application/json"}
    with httpx.Client(headers=headers) as client:
        answers = [gateway.review("bob-token", client=client).json() for _ in range(5)]
    assert all(a["status"]["user"]["username"] == "bob" for a in answers)


def post_raw(
    gw: GatewayProcess,
    content: bytes,
    content_type: str | None = "application/json",
    path: str = "/authenticate?timeout=30s",
    method: str = "POST",
    headers: dict[str, str] | None = None,
) -> httpx.Response:
    hdrs = dict(headers or {})
    if content_type is not None:
        hdrs["Content-Type"] = content_type
    return httpx.request(method, gw.url + path, content=content, headers=hdrs, timeout=5)


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"{", "body is not valid JSON"),
        (
            b'{"apiVersion":"authentication.k8s.io/v1","kind":"Pod","spec":{"token":"x"}}',
            "kind must be TokenReview",
        ),
        (b'{"apiVersion":"v1","kind":"TokenReview","spec":{"token":"x"}}', "apiVersion must be"),
        (
            b'{"apiVersion":"authentication.k8s.io/v1","kind":"TokenReview","spec":{}}',
            "spec.token must be a string",
        ),
        (
            b'{"apiVersion":"authentication.k8s.io/v1","kind":"TokenReview","spec":{"token":7}}',
            "spec.token must be a string",
        ),
    ],
)
def test_malformed_request_is_400_naming_the_problem(
    gateway: GatewayProcess, content: bytes, message: str
) -> None:
    r = post_raw(gateway, content)
    assert r.status_code == 400
    assert message in r.json()["message"]


def test_wrong_content_type_is_400(gateway: GatewayProcess) -> None:
    body = b'{"apiVersion":"authentication.k8s.io/v1","kind":"TokenReview","spec":{"token":"x"}}'
    r = post_raw(gateway, body, content_type="text/plain")
    assert r.status_code == 400
    assert "Content-Type" in r.json()["message"]
    assert post_raw(gateway, body, content_type=None).status_code == 400


def test_json_with_charset_is_accepted(gateway: GatewayProcess) -> None:
    body = b'{"apiVersion":"authentication.k8s.io/v1","kind":"TokenReview","spec":{"token":"x"}}'
    r = post_raw(gateway, body, content_type="application/json; charset=utf-8")
    assert r.status_code == 200


def test_oversized_body_is_413(gateway: GatewayProcess) -> None:
    token = "x" * (65 * 1024)
    body = (
        '{"apiVersion":"authentication.k8s.io/v1","kind":"TokenReview","spec":{"token":"'
        + token
        + '"}}'
    ).encode()
    r = post_raw(gateway, body)
    assert r.status_code == 413
    assert token not in r.text


def test_oversized_chunked_body_is_413(gateway: GatewayProcess) -> None:
    def chunks() -> Any:
        for _ in range(80):
            yield b"x" * 1024

    r = httpx.post(
        gateway.url + "/authenticate",
        content=chunks(),
        headers={"Content-Type": "application/json"},
        timeout=5,
    )
    assert r.status_code == 413


def test_get_is_405(gateway: GatewayProcess) -> None:
    r = post_raw(gateway, b"", method="GET")
    assert r.status_code == 405
    assert r.headers["allow"] == "POST"


def test_gzip_request_body_is_refused_clearly(gateway: GatewayProcess) -> None:
    r = post_raw(gateway, b"\x1f\x8b", headers={"Content-Encoding": "gzip"})
    assert r.status_code == 400
    assert "Content-Encoding" in r.json()["message"]


def test_matching_audience_is_returned(gateway: GatewayProcess) -> None:
    r = gateway.review("alice-token", audiences=["https://kubernetes.default.svc", "other"])
    status = r.json()["status"]
    assert status["authenticated"] is True
    assert status["audiences"] == ["https://kubernetes.default.svc"]


def test_disjoint_audiences_refuse_without_error(gateway: GatewayProcess) -> None:
    status = gateway.review("alice-token", audiences=["https://elsewhere"]).json()["status"]
    assert status == {"authenticated": False}


def test_health_and_readiness(gateway: GatewayProcess) -> None:
    assert httpx.get(gateway.url + "/healthz").status_code == 200
    assert httpx.get(gateway.url + "/readyz").text == "ready"


def test_metrics_count_reviews_by_answer_and_version(gateway: GatewayProcess) -> None:
    gateway.review("alice-token", api_version=V1BETA1)
    text = httpx.get(gateway.url + "/metrics").text
    assert (
        metric_value(
            text,
            "authn_gateway_reviews_total",
            answer="authenticated",
            api_version=V1BETA1,
            backend="static",
        )
        >= 1
    )
    assert metric_value(text, "authn_gateway_bad_requests_total", status="400") >= 1
    assert "authn_gateway_review_duration_seconds_bucket" in text
    assert "alice-token" not in text
    assert "alice" not in text


def test_review_log_has_hash_prefix_not_token(gateway: GatewayProcess) -> None:
    gateway.review("alice-token")
    gateway.review("not-a-known-secret")
    time.sleep(0.3)  # review lines are flushed every 100 ms
    logs = gateway.logs()
    assert "answer=authenticated" in logs
    assert "alice-token" not in logs
    assert "not-a-known-secret" not in logs


def test_admin_endpoint_is_off_by_default(gateway: GatewayProcess) -> None:
    assert httpx.get(gateway.url + "/admin/breakers").status_code == 404


def test_unreachable_idp_answers_200_with_error_naming_backend(
    fake_idp: FakeIdP, tmp_path: Path
) -> None:
    fake_idp.configure(refuse=True)
    gw = start_gateway({"backends": [userinfo_backend(fake_idp)]}, tmp_path)
    try:
        r = gw.review("good-alice")
        assert r.status_code == 200
        assert "retry-after" not in r.headers
        status = r.json()["status"]
        assert status["authenticated"] is False
        assert status["error"].startswith("idp: ")
    finally:
        gw.stop()
