"""The edge's keep-alive timer (armed once, moved lazily) over a real loopback socket:
an idle kept-alive connection is closed after ``timeout_keep_alive``, one that keeps
sending requests is not, whatever the timer's first deadline was."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
import uvloop
from uvicorn.server import ServerState

from authn_gateway.edge import EdgeLimits, GatewayHttpProtocol
from authn_gateway.serve.server import _UvicornConfig

KEEP_ALIVE = 0.4

BODY = json.dumps({"ok": True}).encode()

REQUEST = b"GET / HTTP/1.1\r\nhost: gw\r\n\r\n"


async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": 200,
            "headers": [(b"content-length", b"%d" % len(BODY))],
        }
    )
    await send({"type": "http.response.body", "body": BODY})


async def serve() -> tuple[asyncio.AbstractServer, int]:
    config = _UvicornConfig(
        app,
        edge=EdgeLimits(),
        http=GatewayHttpProtocol,
        lifespan="off",
        log_config=None,
        proxy_headers=False,
        timeout_keep_alive=KEEP_ALIVE,
    )
    config.load()
    state = ServerState()
    loop = asyncio.get_running_loop()
    server = await loop.create_server(
        lambda: GatewayHttpProtocol(config=config, server_state=state, app_state={}),
        "127.0.0.1",
        0,
    )
    return server, server.sockets[0].getsockname()[1]


async def answered(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
    writer.write(REQUEST)
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
    await asyncio.wait_for(reader.readexactly(len(BODY)), 5)
    return head.startswith(b"HTTP/1.1 200")


async def closed_within(reader: asyncio.StreamReader, seconds: float) -> bool:
    try:
        return await asyncio.wait_for(reader.read(1), seconds) == b""
    except TimeoutError:
        return False


@pytest.mark.parametrize("loop_factory", [asyncio.new_event_loop, uvloop.new_event_loop])
def test_an_idle_kept_alive_connection_is_closed_after_the_keep_alive_timeout(
    loop_factory: Any,
) -> None:
    async def run() -> None:
        server, port = await serve()
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            assert await answered(reader, writer)
            # Not before the timeout...
            assert not await closed_within(reader, KEEP_ALIVE / 2)
            # ...but soon after it.
            assert await closed_within(reader, KEEP_ALIVE * 3)
            writer.close()
        finally:
            server.close()

    with asyncio.Runner(loop_factory=loop_factory) as runner:
        runner.run(run())


def test_a_connection_in_use_outlives_the_first_keep_alive_deadline() -> None:
    async def run() -> None:
        server, port = await serve()
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            # Requests every KEEP_ALIVE / 4 for 2.5 x KEEP_ALIVE: never idle that long.
            for _ in range(10):
                assert await answered(reader, writer)
                await asyncio.sleep(KEEP_ALIVE / 4)
            assert await answered(reader, writer)
            # Then idle: closed within the timeout of the last answer.
            assert await closed_within(reader, KEEP_ALIVE * 3)
            writer.close()
        finally:
            server.close()

    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(run())
