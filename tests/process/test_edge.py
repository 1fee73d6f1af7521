"""The HTTP edge against hostile and careless clients, over raw sockets to a real
``authn-gateway serve`` process: time and number bounds, head limits per pipelined
request, lingering close, trailers, upgrades, ops paths, error reasons, drain."""

from __future__ import annotations

import contextlib
import json
import signal
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.procs import GatewayProcess, metric_value, review_body, start_gateway
from tests.support.rawhttp import Reader, request

STATIC = {
    "name": "demo",
    "type": "static",
    "tokens": [{"token": "demo-admin-token", "username": "demo-admin", "uid": "1000"}],
}

CALLER_TOKEN = "caller-test-only-Wq2Zp9Xk4Lm7Vt1Nc8Bh3Dy6Fs5Gj0RuE"

REVIEW = json.dumps(review_body("demo-admin-token")).encode()


@pytest.fixture
def gateways(tmp_path: Path) -> Iterator[Any]:
    started: list[GatewayProcess] = []

    def start(config: dict[str, Any], **kwargs: Any) -> GatewayProcess:
        config = {"logging": {"reviews": False}, **config}
        gw = start_gateway(config, tmp_path, **kwargs)
        started.append(gw)
        deadline = time.monotonic() + 30
        while "Application startup complete" not in gw.logs():
            assert gw.proc.poll() is None and time.monotonic() < deadline, gw.logs()
            time.sleep(0.05)
        return gw

    yield start
    for gw in started:
        gw.stop()


def connect(gw: GatewayProcess, timeout: float = 10.0) -> socket.socket:
    return socket.create_connection(("127.0.0.1", gw.port), timeout=timeout)


def ops_metrics(gw: GatewayProcess) -> str:
    for line in gw.logs().splitlines():
        if "ops listener" in line:
            port = int(line.rsplit(":", 1)[1])
            return httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
    raise AssertionError(f"no ops listener in the log:\n{gw.logs()}")


def test_a_connection_that_sends_nothing_is_closed_after_the_header_timeout(
    gateways: Any,
) -> None:
    gw = gateways(
        {"server": {"header_timeout_seconds": 1, "ops": {"port": 0}}, "backends": [STATIC]}
    )
    with connect(gw) as silent, connect(gw) as half:
        half.sendall(b"POST /authenticate HTTP/1.1\r\nhost: gw\r\nx-slow: ")
        started = time.monotonic()
        assert Reader(silent).at_eof()
        assert time.monotonic() - started < 5
        answer = Reader(half).response()
        assert answer is not None and answer[0] == 408
        assert json.loads(answer[2])["reason"] == "Timeout"
    assert metric_value(ops_metrics(gw), "authn_gateway_request_timeouts_total", phase="head") == 2


def test_a_body_that_stops_arriving_is_cut_off_with_408(gateways: Any) -> None:
    gw = gateways({"server": {"body_timeout_seconds": 1}, "backends": [STATIC]})
    with connect(gw) as s:
        s.sendall(request()[:-10])
        reader = Reader(s)
        answer = reader.response()
        assert answer is not None and answer[0] == 408
        assert answer[1]["connection"] == "close"
        assert reader.at_eof()


def test_a_kept_alive_connection_may_idle_between_requests_longer_than_the_header_timeout(
    gateways: Any,
) -> None:
    gw = gateways({"server": {"header_timeout_seconds": 1}, "backends": [STATIC]})
    with connect(gw) as s:
        reader = Reader(s)
        s.sendall(request())
        assert reader.response() is not None
        time.sleep(1.5)
        s.sendall(request())
        answer = reader.response()
        assert answer is not None and answer[0] == 200


def test_connections_beyond_max_are_closed_at_once_while_established_ones_keep_working(
    gateways: Any,
) -> None:
    gw = gateways({"server": {"max_connections": 5, "ops": {"port": 0}}, "backends": [STATIC]})
    held = [connect(gw) for _ in range(5)]
    try:
        # The five are established (answered) before the sixth comes.
        for s in held:
            s.sendall(request())
            assert Reader(s).response() is not None
        with connect(gw) as extra:
            extra.settimeout(5)
            with contextlib.suppress(ConnectionResetError):  # closed at once, either way
                assert extra.recv(100) == b""
        for s in held:
            s.sendall(request())
            answer = Reader(s).response()
            assert answer is not None and answer[0] == 200
        text = ops_metrics(gw)
        assert metric_value(text, "authn_gateway_connections_refused_total") == 1
        assert metric_value(text, "authn_gateway_connections_open", listener="review") == 5
    finally:
        for s in held:
            s.close()


def test_a_thousand_pipelined_reviews_in_one_write_are_all_answered(gateways: Any) -> None:
    gw = gateways({"backends": [STATIC]})
    one = request()
    with connect(gw, timeout=30) as s:
        s.sendall(one * 1000)
        reader = Reader(s)
        statuses = [reader.response() for _ in range(1000)]
    assert all(a is not None and a[0] == 200 for a in statuses)
    assert len(one) * 1000 > 16 * 1024 + 64 * 1024


def test_an_oversized_head_among_pipelined_requests_still_gets_431(gateways: Any) -> None:
    gw = gateways({"server": {"max_header_bytes": 4096}, "backends": [STATIC]})
    big = request(extra="x-pad: " + "a" * 5000 + "\r\n")
    with connect(gw) as s:
        s.sendall(request() * 3 + big)
        reader = Reader(s)
        answers = [reader.response() for _ in range(4)]
        assert [a[0] for a in answers if a] == [200, 200, 200, 431]
        assert reader.at_eof()


@pytest.mark.parametrize("chunked", [False, True], ids=["content-length", "chunked"])
def test_413_is_delivered_to_a_client_still_sending_a_large_body(
    gateways: Any, chunked: bool
) -> None:
    gw = gateways({"backends": [STATIC]})
    payload = b'{"a": "' + b"x" * 200_000 + b'"}'
    if chunked:
        # httpx streams a generator body with Transfer-Encoding: chunked.
        content: Any = iter([payload[i : i + 8192] for i in range(0, len(payload), 8192)])
    else:
        content = payload
    response = httpx.post(
        f"{gw.url}/authenticate",
        content=content,
        headers={"content-type": "application/json"},
        timeout=10,
    )
    assert response.status_code == 413
    assert response.json()["reason"] == "RequestEntityTooLarge"
    assert response.headers["connection"] == "close"


def test_401_is_delivered_before_a_large_body_is_read(gateways: Any) -> None:
    gw = gateways(
        {
            "server": {"caller_tokens": [{"name": "apiserver", "token": CALLER_TOKEN}]},
            "backends": [STATIC],
        }
    )
    # More than the socket buffers hold, less than the lingering close discards.
    payload = b"x" * 600_000
    with connect(gw) as s:
        s.sendall(request(payload, extra="authorization: Bearer wrong\r\n"))
        reader = Reader(s)
        answer = reader.response()
        assert answer is not None and answer[0] == 401
        assert json.loads(answer[2])["reason"] == "Unauthorized"
        assert reader.at_eof()


def test_a_chunked_trailer_never_becomes_a_header(gateways: Any) -> None:
    gw = gateways(
        {
            "server": {"caller_tokens": [{"name": "apiserver", "token": CALLER_TOKEN}]},
            "backends": [STATIC],
        }
    )
    body = REVIEW
    raw = (
        b"POST /authenticate HTTP/1.1\r\nhost: gw\r\ncontent-type: application/json\r\n"
        b"transfer-encoding: chunked\r\nauthorization: Bearer wrong\r\n"
        b"trailer: authorization\r\n\r\n"
        + b"%x\r\n" % len(body)
        + body
        + b"\r\n0\r\nauthorization: Bearer "
        + CALLER_TOKEN.encode()
        + b"\r\n\r\n"
    )
    with connect(gw) as s:
        s.sendall(raw)  # one write: head, body and trailer arrive in one read
        answer = Reader(s).response()
    assert answer is not None and answer[0] == 401


@pytest.mark.parametrize(
    "upgrade",
    [
        "connection: Upgrade, HTTP2-Settings\r\nupgrade: h2c\r\n"
        "http2-settings: AAMAAABkAARAAAAAAAIAAAAA\r\n",
        "connection: Upgrade\r\nupgrade: websocket\r\nsec-websocket-version: 13\r\n"
        "sec-websocket-key: dGhlIHNhbXBsZSBub25jZQ==\r\n",
    ],
    ids=["h2c", "websocket"],
)
def test_an_upgrade_header_is_ignored_and_the_body_reviewed(gateways: Any, upgrade: str) -> None:
    gw = gateways({"backends": [STATIC]})
    with connect(gw) as s:
        # Two in a row: the second proves the connection is still HTTP/1.1.
        s.sendall(request(extra=upgrade) + request())
        reader = Reader(s)
        answers = [reader.response(), reader.response()]
    for answer in answers:
        assert answer is not None and answer[0] == 200
        assert json.loads(answer[2])["status"]["authenticated"] is True
    assert "upgrade" not in gw.logs().lower()


def test_ops_paths_on_the_review_port_need_caller_authentication(gateways: Any) -> None:
    gw = gateways(
        {
            "server": {"caller_tokens": [{"name": "apiserver", "token": CALLER_TOKEN}]},
            "backends": [STATIC],
        }
    )
    for path in ("/metrics", "/healthz", "/readyz"):
        refused = httpx.get(f"{gw.url}{path}", timeout=5)
        assert refused.status_code == 401, path
        assert refused.json()["reason"] == "Unauthorized"
        allowed = httpx.get(
            f"{gw.url}{path}", headers={"authorization": f"Bearer {CALLER_TOKEN}"}, timeout=5
        )
        assert allowed.status_code == 200, path


def test_error_reasons_match_the_status(gateways: Any) -> None:
    gw = gateways({"server": {"max_body_bytes": 1024, "ops": {"port": 0}}, "backends": [STATIC]})
    cases = {
        405: httpx.get(f"{gw.url}/authenticate", timeout=5),
        404: httpx.post(f"{gw.url}/elsewhere", json={}, timeout=5),
        413: httpx.post(f"{gw.url}/authenticate", json={"x": "y" * 2000}, timeout=5),
        400: httpx.post(f"{gw.url}/authenticate", content=b"{", timeout=5),
    }
    reasons = {405: "MethodNotAllowed", 404: "NotFound", 413: "RequestEntityTooLarge"}
    reasons[400] = "BadRequest"
    for status, response in cases.items():
        assert response.status_code == status
        assert response.json()["reason"] == reasons[status]
        assert response.json()["code"] == status


def test_sigterm_answers_every_busy_and_idle_keep_alive_connection_with_connection_close(
    gateways: Any,
) -> None:
    gw = gateways(
        {"server": {"drain_idle_seconds": 2, "graceful_shutdown_seconds": 8}, "backends": [STATIC]}
    )
    results: dict[str, Any] = {}
    go = threading.Event()

    def busy(name: str) -> None:
        try:
            with connect(gw) as s:
                reader = Reader(s)
                answered = 0
                while True:
                    s.sendall(request())
                    answer = reader.response()
                    assert answer is not None, f"request {answered + 1} got no answer"
                    assert answer[0] == 200
                    answered += 1
                    go.set()
                    if answer[1].get("connection") == "close":
                        assert reader.at_eof(), "data after Connection: close"
                        results[name] = answered
                        return
        except Exception as exc:  # a reset, an unanswered request, a bad answer
            results[name] = exc

    def idle(name: str, wait: float | None) -> None:
        try:
            with connect(gw) as s:
                reader = Reader(s)
                s.sendall(request())
                assert reader.response() is not None
                stop.wait()
                if wait is None:
                    results[name] = "closed" if reader.at_eof() else "open"
                    return
                time.sleep(wait)
                s.sendall(request())
                answer = reader.response()
                assert answer is not None and answer[1].get("connection") == "close"
                assert reader.at_eof()
                results[name] = "answered"
        except Exception as exc:
            results[name] = exc

    stop = threading.Event()
    threads = [threading.Thread(target=busy, args=(f"busy{i}",)) for i in range(8)]
    threads += [threading.Thread(target=idle, args=("idle-sends", 0.5))]
    threads += [threading.Thread(target=idle, args=("idle-silent", None))]
    for t in threads:
        t.start()
    assert go.wait(10)
    time.sleep(0.5)
    gw.proc.send_signal(signal.SIGTERM)
    stop.set()
    for t in threads:
        t.join(20)
    assert gw.proc.wait(20) == 0
    assert results.pop("idle-sends") == "answered"
    assert results.pop("idle-silent") == "closed"
    assert all(isinstance(n, int) and n > 0 for n in results.values()), results
    assert len(results) == 8


def test_a_chain_of_unreachable_backends_names_each_backend_once(gateways: Any) -> None:
    from tests.support.procs import free_port

    def unreachable(name: str) -> dict[str, Any]:
        return {
            "name": name,
            "type": "userinfo",
            "url": f"http://127.0.0.1:{free_port()}/userinfo",
            "timeouts": {"connect_seconds": 0.5, "total_seconds": 1.0},
        }

    gw = gateways({"backends": [unreachable("sso"), unreachable("corp")]})
    error = gw.review("some-token").json()["status"]["error"]
    assert error.startswith("sso: ") and "sso: sso" not in error
    assert "; corp: " in error and "corp: corp" not in error
