"""Cache hits answered by the HTTP protocol itself (edge/protocol.py ``answer_at_once``), over raw
sockets to a real ``authn-gateway serve`` process: the same bytes as the ASGI path, the
same order among pipelined requests, ``Connection: close`` honoured, the same log lines
and metrics, and the IdP asked once."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.support.backend_configs import userinfo_backend
from tests.support.edge_answer_at_once_helpers import body, connect
from tests.support.fakes.idp import FakeIdP
from tests.support.procs import GatewayProcess, metric_value, start_gateway
from tests.support.rawhttp import request

HOT = "good-hot-user"


@pytest.fixture
def gateway(fake_idp: FakeIdP, tmp_path: Path) -> Iterator[GatewayProcess]:
    gw = start_gateway({"backends": [userinfo_backend(fake_idp)]}, tmp_path)
    yield gw
    gw.stop()


def test_a_hit_answered_at_once_is_the_answer_the_asgi_path_gave(
    gateway: GatewayProcess, fake_idp: FakeIdP
) -> None:
    sock, reader = connect(gateway)
    with sock:
        sock.sendall(request(body(HOT)))  # a miss: the ASGI path, then cached
        miss = reader.response()
        sock.sendall(request(body(HOT)))  # a hit, whole in one read
        hit = reader.response()
    assert miss is not None and hit is not None
    assert hit[0] == miss[0] == 200
    assert hit[2] == miss[2]
    assert json.loads(hit[2])["status"]["user"]["username"] == "hot-user"
    # The same framing: only the date may differ.
    assert {k: v for k, v in hit[1].items() if k != "date"} == {
        k: v for k, v in miss[1].items() if k != "date"
    }
    assert "date" in hit[1]
    assert fake_idp.calls == 1


def test_pipelined_hits_and_misses_in_one_write_are_answered_in_order(
    gateway: GatewayProcess, fake_idp: FakeIdP
) -> None:
    gateway.review(HOT)
    tokens = [HOT, "good-cold-1", HOT, "bad-token", HOT, "good-cold-2", HOT]
    sock, reader = connect(gateway)
    with sock:
        sock.sendall(b"".join(request(body(t)) for t in tokens))
        answers = [reader.response() for _ in tokens]
    names = []
    for answer in answers:
        assert answer is not None and answer[0] == 200
        user = json.loads(answer[2])["status"].get("user")
        names.append(user["username"] if user else None)
    assert names == ["hot-user", "cold-1", "hot-user", None, "hot-user", "cold-2", "hot-user"]
    assert fake_idp.calls == 4  # hot once, the two cold ones, the bad one


def test_a_hit_with_connection_close_is_answered_then_closed_cleanly(
    gateway: GatewayProcess,
) -> None:
    gateway.review(HOT)
    sock, reader = connect(gateway)
    with sock:
        # A second request after the closing one is never answered.
        sock.sendall(request(body(HOT), extra="connection: close\r\n") + request(body(HOT)))
        answer = reader.response()
        assert answer is not None and answer[0] == 200
        assert answer[1]["connection"] == "close"
        assert reader.at_eof()


def test_http_1_0_hit_is_answered_with_connection_close(gateway: GatewayProcess) -> None:
    gateway.review(HOT)
    sock, reader = connect(gateway)
    with sock:
        sock.sendall(request(body(HOT)).replace(b"HTTP/1.1", b"HTTP/1.0", 1))
        answer = reader.response()
        assert answer is not None and answer[0] == 200
        assert answer[1]["connection"] == "close"
        assert reader.at_eof()


def test_a_hit_whose_body_arrives_in_pieces_is_answered(gateway: GatewayProcess) -> None:
    gateway.review(HOT)
    raw = request(body(HOT))
    sock, reader = connect(gateway)
    with sock:
        sock.sendall(raw[:-10])
        sock.sendall(raw[-10:])
        answer = reader.response()
    assert answer is not None and answer[0] == 200
    assert json.loads(answer[2])["status"]["authenticated"] is True


def test_refusals_are_not_answered_at_once_and_keep_their_status(
    gateway: GatewayProcess,
) -> None:
    gateway.review(HOT)
    sock, reader = connect(gateway)
    with sock:
        sock.sendall(
            request(b"{not json")
            + request(body(HOT), path="/authenticate").replace(
                b"content-type: application/json", b"content-type: text/plain"
            )
            + request(body(HOT))
        )
        statuses = [reader.response() for _ in range(3)]
    assert [s[0] for s in statuses if s] == [400, 400, 200]


def test_hits_answered_at_once_are_logged_and_counted(fake_idp: FakeIdP, tmp_path: Path) -> None:
    gw = start_gateway({"backends": [userinfo_backend(fake_idp)]}, tmp_path)
    try:
        gw.review(HOT)
        sock, reader = connect(gw)
        with sock:
            sock.sendall(request(body(HOT)) * 5)
            for _ in range(5):
                answer = reader.response()
                assert answer is not None and answer[0] == 200
        logs = gw.wait_for_log("cached=True")
        hits = [
            line for line in logs.splitlines() if "msg=review " in line and "cached=True" in line
        ]
        assert len(hits) == 5
        assert all("user=hot-user" in line and "answer=authenticated" in line for line in hits)
        assert HOT not in logs
        metrics = httpx.get(f"{gw.url}/metrics", timeout=5).text
        assert metric_value(metrics, "authn_gateway_reviews_total", answer="authenticated") == 6
        assert metric_value(metrics, "authn_gateway_cache_lookups_total", result="hit") == 5
        assert fake_idp.calls == 1
    finally:
        gw.stop()
