"""The wire under the backends' httpx clients (aiohttp): each way an IdP connection
fails is classified as what it is, nothing is resent behind the wrappers' backs, and
the trace events the wrappers time and resend by arrive as httpcore sent them.

Real sockets on loopback; each server counts the connections it was sent.
"""

from __future__ import annotations

import asyncio
import socket
import ssl
import struct
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import httpx
import pytest

from backends.base import Unavailable
from backends.context import WireTime
from backends.http import PoolSettings, TLSClientSettings, make_client, transport_failure
from backends.settings import TimeoutSettings
from backends.transports import on_the_wire
from backends.wire import ANSWERED, BODY_READ, CONNECTING, MAX_HEADER_LINE, SENDING
from tests.support.fakes.raw import Behaviour, RawIdP
from tests.support.pki import issue, make_ca
from tests.support.wire_helpers import Serve

OK = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"


def client(url: str, pool: PoolSettings | None = None) -> httpx.AsyncClient:
    timeouts = TimeoutSettings(connect_seconds=0.5, read_seconds=0.5, total_seconds=0.5)
    return make_client(url, timeouts, TLSClientSettings(), pool)


async def failure(url: str) -> Unavailable:
    """What the backends make of one GET to ``url`` that must fail."""
    async with client(url) as c:
        with pytest.raises(httpx.HTTPError) as failed:
            await c.get("/", headers={"Authorization": "Bearer good-alice"})
    return transport_failure(failed.value)


def answer(data: bytes) -> Behaviour:
    async def send(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(data)
        await writer.drain()

    return send


async def close_at_once(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    raise ConnectionError  # ends the connection without a byte of an answer


async def reset(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    sock = writer.get_extra_info("socket")
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()  # RST, not FIN
    raise ConnectionError


async def never_answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    await asyncio.sleep(30)


async def test_a_refused_connection_is_a_connection_failure() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # bound, never listening: refused
        assert await failure(f"http://127.0.0.1:{port}") == Unavailable("connection failed")


async def test_an_idp_that_never_answers_is_a_timeout(serve: Serve) -> None:
    idp = await serve(never_answer)
    assert await failure(idp.url) == Unavailable("timed out", timed_out=True)
    assert idp.requests == 1


async def test_a_body_that_stalls_is_a_timeout(serve: Serve) -> None:
    idp = await serve(answer(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nhalf"))
    assert await failure(idp.url) == Unavailable("timed out", timed_out=True)


@pytest.mark.parametrize(
    ("behaviour", "reason"),
    [
        (close_at_once, "connection dropped"),
        (reset, "transport error (ReadError)"),
    ],
    ids=["closed", "reset"],
)
async def test_a_drop_on_a_fresh_connection_is_never_resent(
    serve: Serve, behaviour: Behaviour, reason: str
) -> None:
    # aiohttp by itself resends an idempotent request once after either; only
    # ResendIfDropped may resend, on a pooled connection, paid from the budget.
    idp = await serve(behaviour)
    assert await failure(idp.url) == Unavailable(reason)
    assert (idp.connections, idp.requests) == (1, 1)


@pytest.mark.parametrize(
    "data",
    [
        b"HTTP/1.1 two hundred OK\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nno colon here\r\n\r\nok",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\ncut short",
        b"HTTP/1.1 200 OK\r\nX-Long: " + b"a" * (MAX_HEADER_LINE + 10) + b"\r\n\r\n",
        # Both framings: which one ends the body is the classic smuggling question.
        b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nTransfer-Encoding: chunked\r\n\r\nok",
        b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\nok!",
        b"HTTP/1.1 200 OK\r\n" + b"".join(b"X-%d: y\r\n" % i for i in range(200)) + b"\r\n",
    ],
    ids=[
        "status-line",
        "header",
        "chunk-size",
        "short-body",
        "header-too-long",
        "two-framings",
        "two-lengths",
        "too-many-headers",
    ],
)
async def test_a_malformed_answer_is_the_connection_dropped(serve: Serve, data: bytes) -> None:
    async def then_close(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(data)
        await writer.drain()
        raise ConnectionError

    idp = await serve(then_close)
    assert await failure(idp.url) == Unavailable("connection dropped")
    assert idp.requests == 1


async def test_a_long_header_line_within_the_bound_is_read(serve: Serve) -> None:
    # Past aiohttp's default of 8,190 bytes, as h11 read it before.
    long = b"X-Subject-Token: " + b"t" * 12_000 + b"\r\n"
    idp = await serve(answer(b"HTTP/1.1 200 OK\r\n" + long + b"Content-Length: 2\r\n\r\nok"))
    async with client(idp.url) as c:
        got = await c.get("/")
    assert got.status_code == 200 and len(got.headers["x-subject-token"]) == 12_000


async def test_the_trace_tells_a_new_connection_from_a_pooled_one(serve: Serve) -> None:
    idp = await serve(answer(OK))
    events: list[list[str]] = []
    async with client(idp.url) as c:
        for _ in range(2):
            seen: list[str] = []

            async def trace(event: str, info: dict[str, object], seen: list[str] = seen) -> None:
                seen.append(event)

            assert (await c.get("/", extensions={"trace": trace})).text == "ok"
            events.append(seen)
    assert events == [[CONNECTING, ANSWERED, BODY_READ], [SENDING, ANSWERED, BODY_READ]]
    assert idp.connections == 1


async def test_wire_time_counts_each_answered_request(serve: Serve) -> None:
    async def slowly(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await asyncio.sleep(0.05)
        writer.write(OK)

    idp = await serve(slowly)
    wire = WireTime()
    async with client(idp.url) as c:
        for _ in range(3):
            await c.get("/", extensions=on_the_wire(wire))
    assert (wire.requests, wire.calls, wire.pending) == (3, 3, None)
    assert 0.15 <= wire.seconds < 1.5


async def test_a_body_still_arriving_is_time_on_the_wire(serve: Serve) -> None:
    # Headers at once, then the body stalls: the request stays pending on the wire
    # clock until the call ends (idp_time adds it), as a request never answered does.
    idp = await serve(answer(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nhalf"))
    wire = WireTime()
    async with client(idp.url) as c:
        with pytest.raises(httpx.ReadTimeout):
            await c.get("/", extensions=on_the_wire(wire))
    assert (wire.requests, wire.calls, wire.seconds) == (1, 0, 0.0)
    assert wire.pending is not None


async def test_no_keepalive_opens_a_connection_per_request(serve: Serve) -> None:
    idp = await serve(answer(OK))
    pool = PoolSettings(max_keepalive_connections=0)
    async with client(idp.url, pool) as c:
        for _ in range(3):
            assert (await c.get("/")).text == "ok"
    assert (idp.connections, idp.requests) == (3, 3)


async def test_the_pool_holds_at_most_max_connections(serve: Serve) -> None:
    async def slowly(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await asyncio.sleep(0.05)
        writer.write(OK)

    idp = await serve(slowly)
    async with client(idp.url, PoolSettings(max_connections=2)) as c:
        answers = await asyncio.gather(*(c.get("/") for _ in range(6)))
    assert [a.text for a in answers] == ["ok"] * 6
    assert idp.connections == 2


async def test_a_request_that_finds_the_pool_full_waits_its_connect_timeout(serve: Serve) -> None:
    # One connection, held by a request the IdP never answers (1 s read timeout): the
    # second waits for a slot as long as httpx's pool and connect timeouts together
    # (0.2 + 0.2 s), then is a ConnectTimeout without sending anything.
    idp = await serve(never_answer)
    timeouts = TimeoutSettings(connect_seconds=0.2, read_seconds=1.0, total_seconds=0.2)
    pool = PoolSettings(max_connections=1)
    async with make_client(idp.url, timeouts, TLSClientSettings(), pool) as c:
        first = asyncio.ensure_future(c.get("/"))
        await asyncio.sleep(0.05)
        with pytest.raises(httpx.ConnectTimeout) as waited:
            await c.get("/")
        assert (idp.connections, idp.requests) == (1, 1)
        with pytest.raises(httpx.ReadTimeout):
            await first
    assert transport_failure(waited.value) == Unavailable("timed out", timed_out=True)


async def test_a_post_body_and_the_request_headers_arrive_as_sent(serve: Serve) -> None:
    bodies: list[bytes] = []

    async def read_the_body(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = idp.heads[-1].lower()
        length = int(head.split(b"content-length: ")[1].split(b"\r\n")[0])
        bodies.append(await reader.readexactly(length))
        writer.write(OK)

    idp = await serve(read_the_body)
    async with client(idp.url) as c:
        got = await c.post("/v3/auth/tokens?nocatalog", json={"a": 1}, headers={"X-A": "b"})
    assert got.text == "ok"
    request = (idp.heads[0] + bodies[0]).lower()
    assert request.startswith(b"post /v3/auth/tokens?nocatalog http/1.1\r\n")
    assert b"\r\nx-a: b\r\n" in request and b"\r\naccept-encoding: identity\r\n" in request
    assert b"\r\ncontent-type: application/json\r\n" in request
    assert request.endswith(b'\r\n\r\n{"a":1}') or request.endswith(b'\r\n\r\n{"a": 1}')


TLSIdP = Callable[[str], Awaitable[tuple[str, Path, RawIdP]]]


@pytest.fixture
async def tls_idp(tmp_path: Path) -> AsyncIterator[TLSIdP]:
    """Starts an https IdP on 127.0.0.1 with a certificate a private CA signed for
    localhost and the address given; yields its URL, the CA's PEM file and the IdP."""
    servers: list[asyncio.Server] = []
    ca = make_ca("wire-test-ca")
    (tmp_path / "ca.pem").write_bytes(ca.cert_pem())

    async def start(cert_ip: str) -> tuple[str, Path, RawIdP]:
        leaf = issue(ca, "idp", server=True, ip=cert_ip)
        (tmp_path / "idp.pem").write_bytes(leaf.cert_pem())
        (tmp_path / "idp.key").write_bytes(leaf.key_pem())
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(tmp_path / "idp.pem", tmp_path / "idp.key")
        idp = RawIdP(answer(OK))
        server = await asyncio.start_server(idp.serve, "127.0.0.1", 0, ssl=context)
        servers.append(server)
        idp.port = server.sockets[0].getsockname()[1]
        return f"https://127.0.0.1:{idp.port}", tmp_path / "ca.pem", idp

    yield start
    for server in servers:
        server.close()
        await server.wait_closed()


async def tls_get(url: str, tls: TLSClientSettings) -> httpx.Response | Unavailable:
    timeouts = TimeoutSettings(connect_seconds=2.0, read_seconds=2.0, total_seconds=2.0)
    async with make_client(url, timeouts, tls) as c:
        try:
            return await c.get("/")
        except httpx.HTTPError as exc:
            return transport_failure(exc)


async def test_an_idp_signed_by_the_configured_ca_is_trusted(tls_idp: TLSIdP) -> None:
    url, ca_file, idp = await tls_idp("127.0.0.1")
    got = await tls_get(url, TLSClientSettings(ca_file=ca_file))
    assert isinstance(got, httpx.Response) and got.text == "ok"
    assert idp.requests == 1


@pytest.mark.parametrize("cert_ip", ["127.0.0.1", "127.0.0.2"], ids=["unknown-ca", "wrong-name"])
async def test_an_idp_certificate_that_does_not_verify_is_a_connection_failure(
    tls_idp: TLSIdP, cert_ip: str
) -> None:
    # The system store does not know the private CA; with the CA, a certificate for
    # 127.0.0.2 does not name 127.0.0.1. Either way no request is sent.
    url, ca_file, idp = await tls_idp(cert_ip)
    tls = TLSClientSettings() if cert_ip == "127.0.0.1" else TLSClientSettings(ca_file=ca_file)
    timeouts = TimeoutSettings(connect_seconds=2.0, read_seconds=2.0, total_seconds=2.0)
    async with make_client(url, timeouts, tls) as c:
        with pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED") as failed:
            await c.get("/")
    assert transport_failure(failed.value) == Unavailable("connection failed")
    assert idp.requests == 0


async def test_verify_false_talks_to_any_certificate(tls_idp: TLSIdP) -> None:
    url, _, _ = await tls_idp("127.0.0.2")
    got = await tls_get(url, TLSClientSettings(verify=False))
    assert isinstance(got, httpx.Response) and got.status_code == 200
