"""Writes held to the end of the loop's turn (edge/batching.py): nothing is sent while
the turn's reads run, then each connection's answers go out in order, in one send();
a close, half-close or abort sends what is held first (or drops it), and a peer gone
before the flush is sent nothing. In process, over the real protocol and parser, with a
transport that records what it is asked to do."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

import pytest
from uvicorn.server import ServerState

from authn_gateway.edge import EdgeLimits, GatewayHttpProtocol
from authn_gateway.edge.batching import BatchedTransport, WriteBatch
from authn_gateway.edge.intake import MAX_PIPELINED, WRITE_HIGH_WATER
from authn_gateway.serve.server import _UvicornConfig
from tests.support.inprocess import LOOPS, RecordingTransport, post, run, turns

ANSWER = b'{"answer":"at once"}'


async def asgi_app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    body = json.dumps({"path": scope["path"]}).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body))]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": body})


BIG = b'{"answer":"' + b"x" * 4000 + b'"}'


def answer_at_once(scope: dict[str, Any], body: bytes) -> bytes | None:
    # A review "in the cache" is answered by the protocol; anything else goes to the app.
    return {b"hit": ANSWER, b"big": BIG}.get(body)


def connection() -> tuple[GatewayHttpProtocol, RecordingTransport]:
    edge = EdgeLimits()
    edge.answer_at_once = answer_at_once
    config = _UvicornConfig(
        asgi_app, edge=edge, http=GatewayHttpProtocol, lifespan="off", log_config=None
    )
    config.load()
    conn = GatewayHttpProtocol(config=config, server_state=ServerState(), app_state={})
    transport = RecordingTransport()
    conn.connection_made(transport)  # type: ignore[arg-type]
    return conn, transport


@pytest.mark.parametrize("loop_factory", LOOPS)
def test_answers_of_one_turn_go_out_after_it_in_order_in_one_send(
    loop_factory: Callable[[], asyncio.AbstractEventLoop],
) -> None:
    async def main() -> None:
        first, first_t = connection()
        second, second_t = connection()
        # Two pipelined hits on one connection, one on another, all in one turn.
        first.data_received(post(b"hit") + post(b"hit"))
        second.data_received(post(b"hit"))
        assert first_t.calls == [] and second_t.calls == []  # held while reads run
        await turns()
        [sent] = first_t.writes()
        assert sent.count(ANSWER) == 2 and sent.startswith(b"HTTP/1.1 200 OK\r\n")
        assert sent.endswith(ANSWER) and sent.count(b"HTTP/1.1 200 OK") == 2
        assert [w.count(ANSWER) for w in second_t.writes()] == [1]

    run(loop_factory, main())


@pytest.mark.parametrize("loop_factory", LOOPS)
def test_a_read_of_many_answers_is_parsed_only_while_what_waits_to_be_sent_is_under_the_mark(
    loop_factory: Callable[[], asyncio.AbstractEventLoop],
) -> None:
    # A client pipelining cached reviews: a read is parsed while its answers held for the
    # flush stay under the write mark (intake.py), and the rest of it once they are sent,
    # so what waits to be sent never grows past the mark and a piece's answers.
    async def main() -> None:
        conn, transport = connection()
        answer = len(BIG) + 200
        conn.data_received(post(b"big") * 40)
        assert transport.writes() == []  # held for the flush
        held = conn.transport.get_write_buffer_size()
        assert WRITE_HIGH_WATER <= held < WRITE_HIGH_WATER + MAX_PIPELINED * answer, held
        await turns(40)
        writes = transport.writes()
        assert all(len(w) < WRITE_HIGH_WATER + MAX_PIPELINED * answer for w in writes)
        sent = b"".join(writes)
        assert sent.count(BIG) == 40 and sent.count(b"HTTP/1.1 200 OK") == 40, len(writes)

    run(loop_factory, main())


@pytest.mark.parametrize("loop_factory", LOOPS)
def test_an_answer_at_once_then_an_asgi_answer_keep_their_order(
    loop_factory: Callable[[], asyncio.AbstractEventLoop],
) -> None:
    async def main() -> None:
        conn, transport = connection()
        conn.data_received(post(b"hit") + post(b"miss"))
        await turns(20)
        sent = b"".join(transport.writes())
        assert sent.index(ANSWER) < sent.index(b'"/authenticate"}')
        assert sent.count(b"HTTP/1.1 200 OK") == 2

    run(loop_factory, main())


@pytest.mark.parametrize("loop_factory", LOOPS)
def test_a_last_answer_is_sent_before_the_half_close(
    loop_factory: Callable[[], asyncio.AbstractEventLoop],
) -> None:
    async def main() -> None:
        conn, transport = connection()
        conn.data_received(post(b"hit", b"connection: close"))
        # The lingering close half-closes at once: what was held goes first.
        assert [call for call, _ in transport.calls] == ["write", "write_eof"]
        assert transport.calls[0][1].endswith(ANSWER)
        assert b"connection: close" in transport.calls[0][1].lower()
        await turns()
        assert [call for call, _ in transport.calls] == ["write", "write_eof"]

    run(loop_factory, main())


@pytest.mark.parametrize("loop_factory", LOOPS)
def test_a_refusal_after_held_answers_comes_after_them(
    loop_factory: Callable[[], asyncio.AbstractEventLoop],
) -> None:
    async def main() -> None:
        conn, transport = connection()
        conn.data_received(post(b"hit") + b"NOT HTTP AT ALL\r\n\r\n")
        await turns()
        calls = [call for call, _ in transport.calls]
        assert calls[-1] == "write_eof"
        sent = b"".join(transport.writes())
        assert sent.index(ANSWER) < sent.index(b"HTTP/1.1 400")

    run(loop_factory, main())


def test_a_peer_gone_before_the_flush_is_sent_nothing_and_abort_drops_what_is_held() -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        batch = WriteBatch(loop)
        gone, aborted, kept = RecordingTransport(), RecordingTransport(), RecordingTransport()
        views = [BatchedTransport(t, batch) for t in (gone, aborted, kept)]  # type: ignore[arg-type]
        buffer = bytearray(b"first")
        for view in views:
            view.write(buffer)
        buffer[:] = b"XXXXX"  # the writer reuses its buffer: what was written stays
        views[2].write(b"")  # nothing to send is not a write
        views[2].write(b" second")
        gone.closing = True
        views[1].abort()
        assert views[2].get_write_buffer_size() == len(b"first second")
        await turns()
        assert gone.calls == []
        assert aborted.calls == [("abort", b"")]
        assert kept.calls == [("write", b"first second")]
        assert views[2].get_write_buffer_size() == 0

    asyncio.run(main())


def test_close_sends_what_is_held_then_closes() -> None:
    async def main() -> None:
        transport = RecordingTransport()
        view = BatchedTransport(transport, WriteBatch(asyncio.get_running_loop()))  # type: ignore[arg-type]
        view.write(b"answer")
        view.close()
        assert transport.calls == [("write", b"answer"), ("close", b"")]
        await turns()  # the batch's flush finds nothing left
        assert transport.calls == [("write", b"answer"), ("close", b"")]

    asyncio.run(main())


def test_a_transport_failing_at_the_flush_is_aborted_and_the_others_still_get_theirs() -> None:
    class Broken(RecordingTransport):
        def write(self, data: bytes) -> None:
            raise RuntimeError("unable to perform operation: the handler is closed")

    async def main() -> None:
        batch = WriteBatch(asyncio.get_running_loop())
        broken, fine = Broken(), RecordingTransport()
        for transport in (broken, fine):
            BatchedTransport(transport, batch).write(b"answer")  # type: ignore[arg-type]
        await turns()
        assert broken.calls == [("abort", b"")]
        assert fine.calls == [("write", b"answer")]

    asyncio.run(main())
