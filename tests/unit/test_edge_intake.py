"""The read bound (edge/intake.py) and what an exception of ours becomes, in process over
the real protocol and parser: at most MAX_PIPELINED requests parsed and unanswered
whatever a client pipelines, the rest read only once answers make room; a piece of a
read never completes more request heads than there is room for (property-based, with
llhttp itself counting the heads); an exception in the answer-at-once hook or in the
application is logged and counted, never a 500, and the connection goes on."""

from __future__ import annotations

import asyncio
import json
import re
from typing import Any

import httptools
import pytest
from hypothesis import given
from hypothesis import strategies as st
from uvicorn.server import ServerState

from authn_gateway.edge import EdgeLimits, GatewayHttpProtocol
from authn_gateway.edge.intake import MAX_PIPELINED, READ_SLICE, piece_end
from authn_gateway.serve.server import _UvicornConfig
from tests.support.inprocess import LOOPS, RecordingTransport, post, run, turns


class HeadCounter:
    def __init__(self) -> None:
        self.heads = 0

    def on_headers_complete(self) -> None:
        self.heads += 1


REQUESTS = st.sampled_from(
    [
        b"GET / HTTP/1.1\r\n\r\n",
        b"GET /healthz HTTP/1.1\r\nhost: x\r\n\r\n",
        post(b'{"a":"\r\n\r\n"}'),  # a head end inside a body
        post(b"x" * 5000),
        b"POST / HTTP/1.1\r\ntransfer-encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n",
        b"\r\n",  # empty lines between requests, which llhttp skips
    ]
)


@given(
    stream=st.lists(REQUESTS, min_size=1, max_size=30).map(b"".join),
    reads=st.lists(st.integers(min_value=1, max_value=9000), min_size=1, max_size=20),
    budgets=st.lists(st.integers(min_value=1, max_value=3), min_size=1, max_size=10),
)
def test_a_piece_never_completes_more_heads_than_its_budget(
    stream: bytes, reads: list[int], budgets: list[int]
) -> None:
    counter = HeadCounter()
    parser = httptools.HttpRequestParser(counter)
    pos, turn = 0, 0
    while pos < len(stream):
        # The stream as a client's reads split it: each read is fresh, its pieces not.
        read = stream[pos : pos + reads[turn % len(reads)]]
        pos += len(read)
        at = 0
        while at < len(read):
            budget = budgets[turn % len(budgets)]
            turn += 1
            end = piece_end(read, at, budget, fresh=True)
            assert at < end <= min(len(read), at + READ_SLICE)
            before = counter.heads
            parser.feed_data(read[at:end])
            assert counter.heads - before <= budget, (read[at:end], budget)
            at = end


@pytest.mark.parametrize(
    "stream",
    [b"GET / HTTP/1.1\n\n", b"GET / HTTP/1.1\r\nhost: a\n\n", b"GET / HTTP/1.1\r\nhost: a\r\n\n"],
)
def test_llhttp_ends_a_head_only_with_crlf_crlf(stream: bytes) -> None:
    # intake.py counts CRLF CRLF as the only possible end of a head.
    counter = HeadCounter()
    with pytest.raises(httptools.HttpParserError):
        httptools.HttpRequestParser(counter).feed_data(stream)
    assert counter.heads == 0


def connection(app: Any, **edge: Any) -> tuple[GatewayHttpProtocol, RecordingTransport]:
    limits = EdgeLimits(**edge)
    config = _UvicornConfig(
        app, edge=limits, http=GatewayHttpProtocol, lifespan="off", log_config=None
    )
    config.load()
    conn = GatewayHttpProtocol(config=config, server_state=ServerState(), app_state={})
    transport = PausableTransport()
    conn.connection_made(transport)  # type: ignore[arg-type]
    return conn, transport


class PausableTransport(RecordingTransport):
    def __init__(self) -> None:
        super().__init__()
        self.reading = True

    def pause_reading(self) -> None:
        self.reading = False

    def resume_reading(self) -> None:
        self.reading = True


class Held:
    """An application whose answers wait until the test releases them."""

    def __init__(self) -> None:
        self.started: list[str] = []
        self.release = asyncio.Event()

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        self.started.append(scope["path"])
        await self.release.wait()
        body = json.dumps({"path": scope["path"]}).encode()
        headers = [(b"content-length", b"%d" % len(body))]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": body})


@pytest.mark.parametrize("loop_factory", LOOPS)
def test_a_pipelining_client_gets_at_most_two_requests_parsed_until_answers_make_room(
    loop_factory: Any,
) -> None:
    async def main() -> None:
        app = Held()
        conn, transport = connection(app)
        requests = b"".join(b"GET /%d HTTP/1.1\r\nhost: x\r\n\r\n" % i for i in range(100))
        conn.data_received(requests[:4000])
        await turns()
        # One running, one parsed behind it; the rest kept, and the transport paused.
        assert app.started == ["/0"] and len(conn.pipeline) == MAX_PIPELINED - 1
        assert not transport.reading
        app.release.set()
        for _ in range(200):
            await asyncio.sleep(0)
        sent = b"".join(transport.writes())
        # Every request in the read was answered, in order, and reading resumed.
        paths = [p.decode() for p in re.findall(rb'"path": "(/\d+)"', sent)]
        assert paths == [f"/{i}" for i in range(len(paths))], paths
        assert len(paths) == requests[:4000].count(b"\r\n\r\n"), paths
        assert transport.reading

    run(loop_factory, main())


@pytest.mark.parametrize("loop_factory", LOOPS)
def test_an_exception_in_the_answer_at_once_hook_is_reported_and_the_asgi_path_answers(
    loop_factory: Any,
) -> None:
    async def main() -> None:
        reported: list[BaseException] = []

        def broken(scope: dict[str, Any], body: bytes) -> bytes | None:
            return [][0]  # type: ignore[no-any-return]

        app = Held()
        app.release.set()
        conn, transport = connection(app, answer_at_once=broken, report_error=reported.append)
        conn.data_received(post(b'{"apiVersion": []}') + post(b"{}"))
        await turns(20)
        sent = b"".join(transport.writes())
        assert sent.count(b"HTTP/1.1 200 OK") == 2, sent
        # The second was queued behind the first (the ASGI path), not offered at once.
        assert [type(e) for e in reported] == [IndexError]

    run(loop_factory, main())


@pytest.mark.parametrize("loop_factory", LOOPS)
@pytest.mark.parametrize("how", ["raises", "returns-without-answer"])
def test_an_application_that_fails_is_answered_503_never_500_and_the_connection_goes_on(
    loop_factory: Any, how: str
) -> None:
    async def main() -> None:
        reported: list[BaseException] = []

        async def failing(scope: dict[str, Any], receive: Any, send: Any) -> None:
            if scope["path"] == "/ok":
                await Held.__call__(ready, scope, receive, send)
            elif how == "raises":
                raise KeyError("a token's worth of secret")

        ready = Held()
        ready.release.set()
        conn, transport = connection(failing, report_error=reported.append)
        conn.data_received(
            b"GET /bad HTTP/1.1\r\nhost: x\r\n\r\nGET /ok HTTP/1.1\r\nhost: x\r\n\r\n"
        )
        await turns(20)
        sent = b"".join(transport.writes())
        assert sent.startswith(b"HTTP/1.1 503 "), sent
        assert b"500" not in sent.split(b"\r\n", 1)[0] and b"secret" not in sent
        assert json.loads(sent.split(b"\r\n\r\n", 1)[1].split(b"HTTP/1.1")[0])["code"] == 503
        assert len(reported) == 1

    run(loop_factory, main())


class UnreadTransport(PausableTransport):
    """A peer that reads nothing: what is written stays in the transport's buffer."""

    def get_write_buffer_size(self) -> int:
        return sum(len(data) for data in self.writes())


@pytest.mark.parametrize("loop_factory", LOOPS)
def test_a_close_waiting_on_answers_nobody_reads_is_cut_off_after_the_send_timeout(
    loop_factory: Any,
) -> None:
    # uvloop's close() waits for the write buffer to drain, however long: a client that
    # never reads would hold its connection (and a max_connections slot) for ever.
    async def main() -> None:
        app = Held()
        app.release.set()
        limits = EdgeLimits(linger_seconds=0.05, send_timeout=0.1)
        config = _UvicornConfig(
            app, edge=limits, http=GatewayHttpProtocol, lifespan="off", log_config=None
        )
        config.load()
        conn = GatewayHttpProtocol(config=config, server_state=ServerState(), app_state={})
        transport = UnreadTransport()
        conn.connection_made(transport)  # type: ignore[arg-type]
        conn.data_received(b"GET /last HTTP/1.1\r\nconnection: close\r\n\r\n")
        await asyncio.sleep(0.1)
        assert [call for call, _ in transport.calls][-2:] == ["write_eof", "close"]
        await asyncio.sleep(0.2)
        assert transport.calls[-1][0] == "abort", transport.calls
        assert limits.stats.timeouts["send"] == 1

    run(loop_factory, main())
