"""The serving edge end to end: TLS, who may call, rotation, reloads, shutdown, workers.

Every test runs real ``authn-gateway serve`` processes on loopback, with
certificates minted here by ``cryptography``.
"""

from __future__ import annotations

import json
import signal
import socket
import ssl
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from cryptography import x509

from tests.support.backend_configs import userinfo_backend
from tests.support.fakes.idp import FakeIdP
from tests.support.pki import Issued, issue, make_ca
from tests.support.procs import (
    GatewayProcess,
    free_port,
    metric_value,
    review_body,
    start_gateway,
    wait_for_port,
)
from tests.support.tls_helpers import STATIC

GOOD_CALLER_TOKEN = "caller-test-only-Wq2Zp9Xk4Lm7Vt1Nc8Bh3Dy6Fs5Gj0RuE"

# Caller tokens are generated secrets: at least 256 bits (authn_gateway/secret_strength.py).
FIRST_TOKEN = "first-test-only-Aq2Zp9Xk4Lm7Vt1Nc8Bh3Dy6Fs5Gj0RuE"

SECOND_TOKEN = "second-test-only-Bq2Zp9Xk4Lm7Vt1Nc8Bh3Dy6Fs5Gj0RuE"


@dataclass
class PKI:
    directory: Path
    server_ca: Issued
    client_ca: Issued
    other_ca: Issued
    server_ca_file: Path
    client_ca_file: Path
    server_cert: Path
    server_key: Path

    def client(self, cn: str, ca: Issued | None = None) -> tuple[Path, Path]:
        return issue(ca or self.client_ca, cn, server=False).write(self.directory, f"client-{cn}")

    def rotate_server(self, serial: int) -> None:
        """What cert-manager does: new files replace the old ones."""
        fresh = issue(self.server_ca, "authn-gateway", server=True, serial=serial)
        tmp_cert, tmp_key = fresh.write(self.directory, "rotating")
        tmp_key.replace(self.server_key)
        tmp_cert.replace(self.server_cert)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> PKI:
    d = tmp_path_factory.mktemp("pki")
    server_ca, client_ca, other_ca = make_ca("server-ca"), make_ca("client-ca"), make_ca("evil-ca")
    server_ca_file = d / "server-ca.crt"
    server_ca_file.write_bytes(server_ca.cert_pem())
    client_ca_file = d / "client-ca.crt"
    client_ca_file.write_bytes(client_ca.cert_pem())
    cert, key = issue(server_ca, "authn-gateway", server=True).write(d, "server")
    return PKI(d, server_ca, client_ca, other_ca, server_ca_file, client_ca_file, cert, key)


def client_context(pki: PKI, client: tuple[Path, Path] | None = None) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(pki.server_ca_file))
    if client is not None:
        ctx.load_cert_chain(str(client[0]), str(client[1]))
    return ctx


def tls_config(pki: PKI, tmp_path: Path, **server: Any) -> dict[str, Any]:
    # Each test gets its own copy of the server pair, since rotation rewrites it.
    cert, key = tmp_path / "tls.crt", tmp_path / "tls.key"
    cert.write_bytes(pki.server_cert.read_bytes())
    key.write_bytes(pki.server_key.read_bytes())
    tls = {"cert_file": str(cert), "key_file": str(key), "reload_interval_seconds": 0.2}
    tls.update(server.pop("tls", {}))
    return {
        "server": {"tls": tls, "ops": {"port": 0}, **server},
        "logging": {"reviews": False},
        "backends": [STATIC],
    }


def https_review(
    gw: GatewayProcess, ctx: ssl.SSLContext, token: str = "demo-admin-token", **headers: str
) -> httpx.Response:
    return httpx.post(
        f"https://127.0.0.1:{gw.port}/authenticate?timeout=30s",
        json=review_body(token),
        headers=headers,
        verify=ctx,
        timeout=10,
    )


def served_serial(port: int, ctx: ssl.SSLContext) -> int:
    """Serial number of the certificate a *new* connection is shown."""
    with (
        socket.create_connection(("127.0.0.1", port), timeout=5) as raw,
        ctx.wrap_socket(raw, server_hostname="127.0.0.1") as tls,
    ):
        der = tls.getpeercert(binary_form=True)
    assert der is not None
    return x509.load_der_x509_certificate(der).serial_number


def ops_port(gw: GatewayProcess) -> int:
    for line in gw.logs().splitlines():
        if "ops listener" in line:
            return int(line.rsplit(":", 1)[1])
    raise AssertionError(f"no ops listener in the log:\n{gw.logs()}")


def scrape(gw: GatewayProcess, port: int | None = None) -> str:
    return httpx.get(f"http://127.0.0.1:{port or ops_port(gw)}/metrics", timeout=5).text


def wait_until(predicate: Any, timeout: float = 10.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.fixture
def gateways(tmp_path: Path) -> Iterator[Any]:
    started: list[GatewayProcess] = []

    def start(config: dict[str, Any], **kwargs: Any) -> GatewayProcess:
        gw = start_gateway(config, tmp_path, **kwargs)
        started.append(gw)
        # The listening socket is bound before start-up completes; wait until ready.
        wait_until(
            lambda: "Application startup complete" in gw.logs() or gw.proc.poll() is not None,
            timeout=30,
            what="start-up",
        )
        return gw

    yield start
    for gw in started:
        gw.stop()


@pytest.fixture
def mtls_gateway(pki: PKI, tmp_path: Path, gateways: Any) -> GatewayProcess:
    config = tls_config(
        pki,
        tmp_path,
        tls={"client_ca_file": str(pki.client_ca_file)},
        allowed_subjects=["kube-apiserver"],
    )
    gw: GatewayProcess = gateways(config)
    return gw


def test_mtls_caller_with_allowed_certificate_is_answered(
    pki: PKI, mtls_gateway: GatewayProcess
) -> None:
    ctx = client_context(pki, pki.client("kube-apiserver"))
    response = https_review(mtls_gateway, ctx)
    assert response.status_code == 200
    assert response.json()["status"]["user"]["username"] == "demo-admin"


def test_caller_without_client_certificate_is_refused_at_handshake(
    pki: PKI, mtls_gateway: GatewayProcess
) -> None:
    with pytest.raises(httpx.TransportError):
        https_review(mtls_gateway, client_context(pki))
    assert metric_value(scrape(mtls_gateway), "authn_gateway_reviews_total") == 0


def test_client_certificate_from_another_ca_is_refused(
    pki: PKI, mtls_gateway: GatewayProcess
) -> None:
    forged = pki.client("kube-apiserver", ca=pki.other_ca)
    with pytest.raises(httpx.TransportError):
        https_review(mtls_gateway, client_context(pki, forged))
    assert metric_value(scrape(mtls_gateway), "authn_gateway_reviews_total") == 0


def test_certificate_subject_outside_allow_list_gets_401_without_review(
    pki: PKI, mtls_gateway: GatewayProcess
) -> None:
    ctx = client_context(pki, pki.client("some-pod"))
    response = https_review(mtls_gateway, ctx)
    assert response.status_code == 401
    assert response.json()["message"] == "caller not authenticated"
    text = scrape(mtls_gateway)
    assert metric_value(text, "authn_gateway_reviews_total") == 0
    assert metric_value(text, "authn_gateway_bad_requests_total", status="401") == 1


def test_plain_http_to_the_tls_port_gets_no_review(pki: PKI, mtls_gateway: GatewayProcess) -> None:
    with pytest.raises(httpx.TransportError):
        httpx.post(
            f"http://127.0.0.1:{mtls_gateway.port}/authenticate",
            json=review_body("demo-admin-token"),
            timeout=5,
        )


def test_tls_below_the_minimum_version_is_refused(pki: PKI, tmp_path: Path, gateways: Any) -> None:
    gw = gateways(tls_config(pki, tmp_path, tls={"min_version": "1.3"}))
    old = client_context(pki)
    old.maximum_version = ssl.TLSVersion.TLSv1_2
    with pytest.raises(httpx.ConnectError):
        https_review(gw, old)
    assert https_review(gw, client_context(pki)).status_code == 200


@pytest.fixture
def token_gateway(
    pki: PKI, tmp_path: Path, gateways: Any, fake_idp: FakeIdP
) -> tuple[GatewayProcess, FakeIdP]:
    config = tls_config(
        pki,
        tmp_path,
        caller_tokens=[{"name": "kube-apiserver", "token": "env:CALLER_TOKEN"}],
        audit_log=str(tmp_path / "audit.jsonl"),
    )
    config["backends"] = [userinfo_backend(fake_idp)]
    gw: GatewayProcess = gateways(config, env={"CALLER_TOKEN": GOOD_CALLER_TOKEN})
    return gw, fake_idp


def test_good_bearer_caller_token_is_accepted(
    pki: PKI, token_gateway: tuple[GatewayProcess, FakeIdP]
) -> None:
    gw, _ = token_gateway
    response = https_review(
        gw, client_context(pki), "good-alice", authorization=f"Bearer {GOOD_CALLER_TOKEN}"
    )
    assert response.status_code == 200
    assert response.json()["status"]["user"]["username"] == "alice"


@pytest.mark.parametrize(
    "authorization",
    [
        None,
        "Bearer wrong-token",
        f"Bearer {GOOD_CALLER_TOKEN[:-1]}",
        f"Basic {GOOD_CALLER_TOKEN}",
        f"Bearer {GOOD_CALLER_TOKEN}x",
    ],
    ids=["missing", "wrong", "prefix", "wrong-scheme", "longer"],
)
def test_bad_or_missing_caller_token_gets_401_and_never_reaches_the_idp(
    pki: PKI, token_gateway: tuple[GatewayProcess, FakeIdP], authorization: str | None
) -> None:
    gw, idp = token_gateway
    headers = {"authorization": authorization} if authorization else {}
    response = https_review(gw, client_context(pki), "good-alice", **headers)
    assert response.status_code == 401
    assert response.headers["www-authenticate"] == "Bearer"
    assert GOOD_CALLER_TOKEN not in response.text
    assert idp.calls == 0


def test_audit_log_records_caller_and_decision_without_the_token(
    pki: PKI, token_gateway: tuple[GatewayProcess, FakeIdP], tmp_path: Path
) -> None:
    gw, _ = token_gateway
    auth = {"authorization": f"Bearer {GOOD_CALLER_TOKEN}"}
    assert https_review(gw, client_context(pki), "good-alice", **auth).status_code == 200
    assert https_review(gw, client_context(pki), "bad-token", **auth).status_code == 200
    audit = tmp_path / "audit.jsonl"
    wait_until(lambda: audit.exists() and len(audit.read_text().splitlines()) == 2, what="audit")
    first, second = (json.loads(line) for line in audit.read_text().splitlines())
    assert first["msg"] == "audit"
    assert first["caller"] == "token:kube-apiserver"
    assert (first["backend"], first["outcome"], first["username"]) == (
        "idp",
        "authenticated",
        "alice",
    )
    assert first["groups"] == ["fake-users"]
    assert first["stale"] is False
    assert len(first["token"]) == 12
    assert (second["outcome"], second["username"]) == ("rejected", None)
    text = audit.read_text() + gw.logs()
    for secret in ("good-alice", "bad-token", GOOD_CALLER_TOKEN):
        assert secret not in text


def test_mtls_and_token_together_accept_either(pki: PKI, tmp_path: Path, gateways: Any) -> None:
    config = tls_config(
        pki,
        tmp_path,
        tls={"client_ca_file": str(pki.client_ca_file)},
        caller_tokens=[{"name": "apiserver", "token": GOOD_CALLER_TOKEN}],
    )
    gw = gateways(config)
    with_cert = client_context(pki, pki.client("kube-apiserver"))
    assert https_review(gw, with_cert).status_code == 200
    auth = {"authorization": f"Bearer {GOOD_CALLER_TOKEN}"}
    assert https_review(gw, client_context(pki), **auth).status_code == 200
    assert https_review(gw, client_context(pki)).status_code == 401


def test_rotated_certificate_is_served_to_new_connections(
    pki: PKI, tmp_path: Path, gateways: Any
) -> None:
    config = tls_config(pki, tmp_path)
    gw = gateways(config)
    ctx = client_context(pki)
    before = served_serial(gw.port, ctx)
    fresh = issue(pki.server_ca, "authn-gateway", server=True, serial=424242)
    tmp_cert, tmp_key = fresh.write(tmp_path, "rotating")
    tmp_key.replace(config["server"]["tls"]["key_file"])
    tmp_cert.replace(config["server"]["tls"]["cert_file"])
    wait_until(lambda: served_serial(gw.port, ctx) == 424242, what="the new certificate")
    assert before != 424242
    assert https_review(gw, ctx).status_code == 200
    assert "TLS certificate reloaded" in gw.logs()


def test_mismatched_rotation_keeps_serving_the_previous_certificate(
    pki: PKI, tmp_path: Path, gateways: Any
) -> None:
    config = tls_config(pki, tmp_path)
    gw = gateways(config)
    ctx = client_context(pki)
    before = served_serial(gw.port, ctx)
    # A new certificate whose key has not arrived yet.
    fresh = issue(pki.server_ca, "authn-gateway", server=True, serial=777)
    Path(config["server"]["tls"]["cert_file"]).write_bytes(fresh.cert_pem())
    wait_until(lambda: "TLS reload failed" in gw.logs(), what="the failed reload")
    assert served_serial(gw.port, ctx) == before
    assert https_review(gw, ctx).status_code == 200
    # The key arrives: the pair is complete and is picked up.
    Path(config["server"]["tls"]["key_file"]).write_bytes(fresh.key_pem())
    wait_until(lambda: served_serial(gw.port, ctx) == 777, what="the completed rotation")


def _rewrite(gw: GatewayProcess, change: Any) -> None:
    config = yaml.safe_load(gw.config_path.read_text())
    change(config)
    gw.config_path.write_text(yaml.safe_dump(config))


def test_sighup_with_invalid_config_keeps_serving_the_old_one(
    pki: PKI, tmp_path: Path, gateways: Any
) -> None:
    gw = gateways(tls_config(pki, tmp_path))
    ctx = client_context(pki)
    gw.config_path.write_text(gw.config_path.read_text() + "review_deadline_seconds: -1\n")
    gw.proc.send_signal(signal.SIGHUP)
    wait_until(lambda: "config reload refused" in gw.logs(), what="the refusal")
    assert "review_deadline_seconds" in gw.logs()
    assert gw.proc.poll() is None
    response = https_review(gw, ctx)
    assert response.status_code == 200
    assert response.json()["status"]["authenticated"] is True


def test_sighup_with_valid_config_swaps_backends_without_dropping_the_listener(
    pki: PKI, tmp_path: Path, gateways: Any
) -> None:
    gw = gateways(tls_config(pki, tmp_path))
    ctx = client_context(pki)
    assert https_review(gw, ctx, "new-token").json()["status"]["authenticated"] is False

    def add_token(config: dict[str, Any]) -> None:
        config["backends"][0]["tokens"] = [{"token": "new-token", "username": "newcomer"}]

    _rewrite(gw, add_token)
    gw.proc.send_signal(signal.SIGHUP)
    wait_until(lambda: "config reloaded" in gw.logs(), what="the reload")
    assert https_review(gw, ctx, "new-token").json()["status"]["user"]["username"] == "newcomer"
    assert https_review(gw, ctx).json()["status"]["authenticated"] is False


def test_sighup_applies_new_caller_tokens(pki: PKI, tmp_path: Path, gateways: Any) -> None:
    config = tls_config(pki, tmp_path, caller_tokens=[{"name": "a", "token": FIRST_TOKEN}])
    gw = gateways(config)
    ctx = client_context(pki)
    assert https_review(gw, ctx, authorization=f"Bearer {FIRST_TOKEN}").status_code == 200

    def rotate(c: dict[str, Any]) -> None:
        c["server"]["caller_tokens"] = [{"name": "a", "token": SECOND_TOKEN}]

    _rewrite(gw, rotate)
    gw.proc.send_signal(signal.SIGHUP)
    wait_until(lambda: "config reloaded" in gw.logs(), what="the reload")
    assert https_review(gw, ctx, authorization=f"Bearer {FIRST_TOKEN}").status_code == 401
    assert https_review(gw, ctx, authorization=f"Bearer {SECOND_TOKEN}").status_code == 200


def test_sighup_drains_reviews_running_on_the_old_gateway(
    tmp_path: Path, gateways: Any, fake_idp: FakeIdP
) -> None:
    fake_idp.configure(latency=1.0)
    config = {
        "server": {"ops": {"port": 0}},
        "backends": [
            userinfo_backend(fake_idp, timeouts={"total_seconds": 3.0, "read_seconds": 3.0})
        ],
    }
    gw = gateways(config)
    results: list[httpx.Response] = []
    slow = threading.Thread(target=lambda: results.append(gw.review("good-slow")))
    slow.start()
    wait_until(lambda: fake_idp.stats().in_flight == 1, what="the slow review to reach the IdP")
    gw.proc.send_signal(signal.SIGHUP)
    wait_until(lambda: "config reloaded" in gw.logs(), what="the reload")
    slow.join(10)
    assert results[0].status_code == 200
    assert results[0].json()["status"]["user"]["username"] == "slow"


def test_sigterm_drains_in_flight_reviews_before_exiting(
    tmp_path: Path, gateways: Any, fake_idp: FakeIdP
) -> None:
    fake_idp.configure(latency=1.0)
    config = {
        "backends": [
            userinfo_backend(fake_idp, timeouts={"total_seconds": 3.0, "read_seconds": 3.0})
        ]
    }
    gw = gateways(config)
    results: list[httpx.Response] = []
    slow = threading.Thread(target=lambda: results.append(gw.review("good-slow")))
    slow.start()
    wait_until(lambda: fake_idp.stats().in_flight == 1, what="the slow review to reach the IdP")
    gw.proc.send_signal(signal.SIGTERM)
    slow.join(10)
    assert results[0].status_code == 200
    assert results[0].json()["status"]["user"]["username"] == "slow"
    assert gw.proc.wait(10) == 0


def test_ops_port_serves_metrics_and_review_port_serves_only_reviews(
    tmp_path: Path, gateways: Any
) -> None:
    gw = gateways({"server": {"ops": {"port": 0}}, "backends": [STATIC]})
    assert httpx.get(f"{gw.url}/metrics", timeout=5).status_code == 404
    assert httpx.get(f"{gw.url}/healthz", timeout=5).status_code == 404
    port = ops_port(gw)
    assert httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=5).text == "ready"
    assert "authn_gateway_reviews" in scrape(gw, port)
    assert httpx.post(f"http://127.0.0.1:{port}/authenticate", timeout=5).status_code == 404
    assert gw.review("demo-admin-token").json()["status"]["authenticated"] is True


def test_oversized_request_head_gets_431(tmp_path: Path, gateways: Any) -> None:
    gw = gateways({"server": {"max_header_bytes": 4096}, "backends": [STATIC]})
    big = {"x-padding": "a" * 5000}
    response = httpx.post(
        f"{gw.url}/authenticate", json=review_body("demo-admin-token"), headers=big, timeout=5
    )
    assert response.status_code == 431
    many = {f"x-h{i}": "1" for i in range(80)}
    response = httpx.post(
        f"{gw.url}/authenticate", json=review_body("demo-admin-token"), headers=many, timeout=5
    )
    assert response.status_code == 431
    assert gw.review("demo-admin-token").status_code == 200


def test_endless_header_line_is_cut_off(tmp_path: Path, gateways: Any) -> None:
    gw = gateways({"server": {"max_header_bytes": 4096}, "backends": [STATIC]})
    with socket.create_connection(("127.0.0.1", gw.port), timeout=5) as s:
        s.sendall(b"POST /authenticate HTTP/1.1\r\nhost: x\r\nx-endless: ")
        answer = b""
        try:
            for _ in range(64):
                s.sendall(b"a" * 8192)
        except OSError:
            pass  # the gateway closed the connection: what we want
        s.settimeout(5)
        try:
            while chunk := s.recv(65536):
                answer += chunk
        except OSError:
            pass
    assert answer.startswith(b"HTTP/1.1 431")


def test_two_workers_share_the_review_port(tmp_path: Path, gateways: Any) -> None:
    base = free_port()
    while True:
        # Worker i serves metrics on base + i, so base + 1 must be free as well.
        try:
            with socket.socket() as probe:
                probe.bind(("127.0.0.1", base + 1))
            break
        except OSError:
            base = free_port()
    gw = gateways({"server": {"workers": 2, "ops": {"port": base}}, "backends": [STATIC]})
    for port in (base, base + 1):
        wait_for_port(port, proc=gw.proc)
    for _ in range(20):
        # A fresh connection each time, so the kernel spreads them over the workers.
        with httpx.Client() as client:
            assert gw.review("demo-admin-token", client=client).status_code == 200
    served = [
        metric_value(scrape(gw, port), "authn_gateway_reviews_total") for port in (base, base + 1)
    ]
    assert sum(served) == 20
    assert min(served) > 0
    gw.proc.send_signal(signal.SIGHUP)
    wait_until(lambda: gw.logs().count("config reloaded") == 2, what="both workers to reload")
    assert gw.stop() == 0


def test_unreadable_certificate_stops_start_up_naming_the_file(pki: PKI, tmp_path: Path) -> None:
    config = tls_config(pki, tmp_path)
    missing = tmp_path / "nope.crt"
    config["server"]["tls"]["cert_file"] = str(missing)
    with pytest.raises(RuntimeError, match=r"nope\.crt"):
        start_gateway(config, tmp_path)


def _mtls_with_own_ca_file(pki: PKI, tmp_path: Path, gateways: Any) -> tuple[GatewayProcess, Path]:
    ca_file = tmp_path / "client-ca.crt"
    ca_file.write_bytes(pki.client_ca_file.read_bytes())
    gw: GatewayProcess = gateways(tls_config(pki, tmp_path, tls={"client_ca_file": str(ca_file)}))
    return gw, ca_file


def _answered(gw: GatewayProcess, ctx: ssl.SSLContext) -> bool:
    try:
        return https_review(gw, ctx).status_code == 200
    except httpx.TransportError:
        return False


def test_client_ca_rotation_with_an_overlapping_bundle(
    pki: PKI, tmp_path: Path, gateways: Any
) -> None:
    """The procedure in docs/operations.md: old CA, then old + new, then new only."""
    gw, ca_file = _mtls_with_own_ca_file(pki, tmp_path, gateways)
    old_client = client_context(pki, pki.client("apiserver-old"))
    new_client = client_context(pki, pki.client("apiserver-new", ca=pki.other_ca))
    assert _answered(gw, old_client)
    assert not _answered(gw, new_client)
    ca_file.write_bytes(pki.client_ca.cert_pem() + pki.other_ca.cert_pem())
    wait_until(lambda: _answered(gw, new_client), what="the overlapping bundle")
    assert _answered(gw, old_client)
    ca_file.write_bytes(pki.other_ca.cert_pem())
    # A removed CA stops being trusted without a restart.
    wait_until(lambda: not _answered(gw, old_client), what="the old CA to be dropped")
    assert _answered(gw, new_client)
    assert "client CA reloaded" in gw.logs()


def test_wrong_ca_handshakes_are_counted_by_reason_and_logged_rate_limited(
    pki: PKI, tmp_path: Path, gateways: Any
) -> None:
    gw, _ = _mtls_with_own_ca_file(pki, tmp_path, gateways)
    forged = client_context(pki, pki.client("kube-apiserver", ca=pki.other_ca))
    for _ in range(20):
        assert not _answered(gw, forged)
    for _ in range(3):
        assert not _answered(gw, client_context(pki))  # no certificate at all
    text = scrape(gw)
    name = "authn_gateway_tls_handshake_failures_total"
    wait_until(
        lambda: metric_value(scrape(gw), name, reason="bad_client_certificate") == 20,
        what="20 counted failures",
    )
    assert metric_value(scrape(gw), name, reason="no_client_certificate") == 3
    assert metric_value(text, "authn_gateway_reviews_total") == 0
    lines = [line for line in gw.logs().splitlines() if "TLS handshake failed" in line]
    # One line per reason per 10 s, naming the reason and the peer.
    assert len(lines) == 2, lines
    assert "bad_client_certificate" in lines[0] and "127.0.0.1" in lines[0]


def test_expiry_of_the_serving_certificate_and_each_client_ca_is_exported(
    pki: PKI, tmp_path: Path, gateways: Any
) -> None:
    gw, ca_file = _mtls_with_own_ca_file(pki, tmp_path, gateways)
    ca_file.write_bytes(pki.client_ca.cert_pem() + pki.other_ca.cert_pem())
    name = "authn_gateway_tls_certificate_expiry_timestamp_seconds"
    wait_until(
        lambda: metric_value(scrape(gw), name, role="client_ca", subject="CN=evil-ca") > 0,
        what="the second CA's gauge",
    )
    text = scrape(gw)
    served = x509.load_pem_x509_certificate(pki.server_cert.read_bytes())
    assert metric_value(text, name, role="serving", subject="CN=authn-gateway") == (
        served.not_valid_after_utc.timestamp()
    )
    assert metric_value(text, name, role="client_ca", subject="CN=client-ca") == (
        pki.client_ca.cert.not_valid_after_utc.timestamp()
    )
