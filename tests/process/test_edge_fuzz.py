"""The HTTP edge fuzzed over a real socket against a real ``authn-gateway serve`` process
(issue 29), on both ports: arbitrary pipelines of requests (reviews with any JSON, refusals of every
kind, chunked bodies, ``Expect: 100-continue``, ``Connection: close``, HTTP/1.0,
oversized heads and bodies, other paths), split into arbitrary reads, sometimes
followed by garbage, the client half-closing or not. Every request gets exactly one
well-formed answer, in order, up to the first that ends the connection; the server
then closes it; nothing is ever a 5xx; the log never holds a traceback or an internal
error; and the server's memory stays within docs/operations.md's bound per connection.

Example counts follow the hypothesis profile (tests/conftest.py; loadtests/README.md).
"""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.support.flood import rss_kib
from tests.support.fuzz import JSON, REVIEWS, examples
from tests.support.procs import GatewayProcess, review_body, start_gateway

TOKEN = "t" * 16

STATIC = {"name": "demo", "type": "static", "tokens": [{"token": TOKEN, "username": "u"}]}

MAX_BODY = 2048

MAX_HEAD = 2048

# docs/operations.md, "What one connection can cost" (one connection at a time here).
BOUND_KIB = 200


@dataclass(frozen=True)
class Sent:
    raw: bytes
    # Whether its answer ends the connection: True (Connection: close, HTTP/1.0, a
    # refused head), None when it may (a 413 ends it only if the body was still
    # arriving when it was sent; so does any refusal made before reading the body),
    # False when it must not.
    closes: bool | None = False


def post(body: bytes, extra: bytes = b"", version: bytes = b"1.1") -> bytes:
    return (
        b"POST /authenticate?timeout=30s HTTP/%s\r\nhost: gw\r\n"
        b"content-type: application/json\r\ncontent-length: %d\r\n%s\r\n"
        % (version, len(body), extra)
        + body
    )


def chunked(body: bytes, sizes: list[int]) -> bytes:
    out, at = b"", 0
    for size in sizes:
        piece = body[at : at + size]
        if not piece:
            break
        out += b"%x\r\n%s\r\n" % (len(piece), piece)
        at += size
    if at < len(body):
        out += b"%x\r\n%s\r\n" % (len(body) - at, body[at:])
    return (
        b"POST /authenticate HTTP/1.1\r\nhost: gw\r\ncontent-type: application/json\r\n"
        b"transfer-encoding: chunked\r\n\r\n" + out + b"0\r\n\r\n"
    )


def review(token: str) -> bytes:
    return json.dumps(review_body(token)).encode()


SENT = st.one_of(
    st.just(Sent(post(review(TOKEN)))),
    st.text(min_size=1, max_size=30).map(lambda t: Sent(post(review(t)))),
    (REVIEWS | JSON).map(lambda doc: Sent(post(json.dumps(doc).encode()))),
    st.binary(max_size=64).map(lambda b: Sent(post(b))),
    st.builds(
        chunked,
        st.just(review(TOKEN)),
        st.lists(st.integers(min_value=1, max_value=40), min_size=1, max_size=5),
    ).map(Sent),
    st.just(Sent(post(review(TOKEN), b"expect: 100-continue\r\n"))),
    st.just(Sent(post(review(TOKEN), b"connection: close\r\n"), closes=True)),
    st.just(Sent(post(review(TOKEN), version=b"1.0"), closes=True)),
    st.just(Sent(post(review(TOKEN), b"content-encoding: gzip\r\n"), closes=None)),
    st.just(Sent(post(b"x" * (MAX_BODY + 1)), closes=None)),
    st.just(Sent(post(review(TOKEN), b"x-pad: " + b"a" * MAX_HEAD + b"\r\n"), closes=True)),
    st.sampled_from([b"/authenticate", b"/healthz", b"/", b"/%zz", b"/a?b=c"]).map(
        lambda path: Sent(b"GET %s HTTP/1.1\r\nhost: gw\r\n\r\n" % path)
    ),
    st.just(Sent(post(review(TOKEN)).replace(b"application/json", b"text/plain"), closes=None)),
)

GARBAGE = st.one_of(
    st.binary(min_size=1, max_size=100),
    st.just(b"GET / HTTP/1.1\r\nhost: gw\r\nbroken header\r\n\r\n"),
    st.just(b"POST / HTTP/1.1\r\ncontent-length: 5\r\ncontent-length: 6\r\n\r\nabcdef"),
)


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    config = {
        "logging": {"reviews": False},
        "server": {
            "ops": {"port": 0},
            "max_body_bytes": MAX_BODY,
            "max_header_bytes": MAX_HEAD,
            "header_timeout_seconds": 2,
            "body_timeout_seconds": 2,
            "send_timeout_seconds": 2,
        },
        "backends": [STATIC],
    }
    gw = start_gateway(config, tmp_path_factory.mktemp("fuzz"))
    deadline = time.monotonic() + 30
    while "Application startup complete" not in gw.logs():
        assert gw.proc.poll() is None and time.monotonic() < deadline, gw.logs()
        time.sleep(0.05)
    yield gw
    gw.stop()


def ops_port(gw: GatewayProcess) -> int:
    for line in gw.logs().splitlines():
        if "ops listener" in line:
            return int(line.rsplit(":", 1)[1])
    raise AssertionError(f"no ops listener in the log:\n{gw.logs()}")


class Answers:
    """The answers on a socket, parsed strictly: a status line, headers, a body of its
    content-length; 100 Continue skipped."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buf = b""
        self.eof = False

    def _fill(self) -> None:
        chunk = self.sock.recv(65536)
        if not chunk:
            self.eof = True
        self.buf += chunk

    def next(self) -> tuple[int, dict[str, str], bytes] | None:
        while True:
            while b"\r\n\r\n" not in self.buf:
                if self.eof:
                    assert not self.buf, f"the stream ended inside an answer: {self.buf!r}"
                    return None
                self._fill()
            head, rest = self.buf.split(b"\r\n\r\n", 1)
            lines = head.decode("latin-1").split("\r\n")
            version, status, *_ = lines[0].split(" ", 2)
            assert version == "HTTP/1.1", lines[0]
            headers = dict(line.lower().split(": ", 1) for line in lines[1:])
            if status == "100":
                self.buf = rest
                continue
            assert "content-length" in headers, head
            length = int(headers["content-length"])
            while len(rest) < length:
                assert not self.eof, "the stream ended inside a body"
                self._fill()
                rest = self.buf.split(b"\r\n\r\n", 1)[1]
            self.buf = rest[length:]
            return int(status), headers, rest[:length]


def exchange(
    port: int,
    sent: list[Sent],
    garbage: bytes,
    cuts: list[int],
    half_close: bool,
    early: bool = False,
) -> None:
    """``early``: any request may be answered before its body is read (the ops port
    answers every review 404 or 405), which ends the connection."""
    stream = b"".join(s.raw for s in sent) + garbage
    # An unfinished head at the end would wait for the head timeout: the client says
    # it is done instead.
    half_close = half_close or bool(garbage)
    with socket.create_connection(("127.0.0.1", port), timeout=15) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        at = 0
        for cut in [*sorted({c % (len(stream) + 1) for c in cuts}), len(stream)]:
            if cut > at:
                try:
                    sock.sendall(stream[at:cut])
                except (BrokenPipeError, ConnectionResetError):
                    break  # it closed the connection: its answers are still to be read
                at = cut
                time.sleep(0.002)  # a read of its own
        if half_close:
            sock.shutdown(socket.SHUT_WR)
        answers = Answers(sock)
        got = []
        closed = False
        for i, request in enumerate(sent):
            if early and request.closes is False:
                request = Sent(request.raw, closes=None)
            if half_close and i == len(sent) - 1 and request.closes is False:
                # Answered after the client's FIN, it says Connection: close.
                request = Sent(request.raw, closes=None)
            # Exactly one answer per request, in order, until one ends the connection.
            answer = answers.next()
            assert answer is not None, f"no answer to {request.raw[:80]!r} after {got}"
            got.append(answer)
            closed = answer[1].get("connection") == "close"
            assert closed or request.closes is not True, (request.raw[:80], answer)
            if closed:
                assert request.closes is not False, (request.raw[:80], answer)
                break
        if garbage and not closed:
            extra = answers.next()  # a refused head, or nothing for an unfinished one
            if extra is not None:
                assert extra[0] in (400, 431), extra
                got.append(extra)
                closed = True
        if half_close or closed:
            # Nothing more, and the server closes: no answer without a request.
            assert answers.next() is None and answers.eof, "an answer without a request"
    for status, headers, body in got:
        assert status < 500, (status, body)
        if headers.get("content-type") == "application/json":
            json.loads(body)


@settings(max_examples=examples(40))
@given(
    sent=st.lists(SENT, min_size=1, max_size=6),
    garbage=st.one_of(st.just(b""), GARBAGE),
    cuts=st.lists(st.integers(min_value=0, max_value=5000), max_size=6),
    half_close=st.booleans(),
    ops=st.booleans(),
)
def test_every_request_gets_one_well_formed_answer_or_the_connection_closes(
    gateway: GatewayProcess,
    sent: list[Sent],
    garbage: bytes,
    cuts: list[int],
    half_close: bool,
    ops: bool,
) -> None:
    port = ops_port(gateway) if ops else gateway.port
    exchange(port, sent, garbage, cuts, half_close, early=ops)


def test_the_fuzzing_left_no_traceback_and_memory_within_the_bound(
    gateway: GatewayProcess,
) -> None:
    # Runs after the property above (file order): the same server, every example's log.
    logs = gateway.logs()
    for bad in ("Traceback", "Exception in ASGI", "internal error"):
        assert bad not in logs, logs[-3000:]
    before = rss_kib(gateway.proc.pid)
    for _ in range(examples(20)):
        exchange(gateway.port, [Sent(post(review(TOKEN)))] * 4, b"\x00junk", [7, 300], True)
    assert rss_kib(gateway.proc.pid) - before <= BOUND_KIB
