"""A raw HTTP/1.1 server for the IdP answers no real IdP sends on purpose: each
connection reads a request head, then runs a behaviour that writes whatever bytes it
likes (lying framing, a reset, a stall, nothing), request after request."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

Behaviour = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


class RawIdP:
    """Runs ``behaviour`` after each request head; a behaviour ends the connection by
    raising ``ConnectionError``. Counts connections and requests, keeps the heads."""

    def __init__(self, behaviour: Behaviour) -> None:
        self.behaviour = behaviour
        self.connections = 0
        self.requests = 0
        self.heads: list[bytes] = []
        self.port = 0

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while True:
                self.heads.append(await reader.readuntil(b"\r\n\r\n"))
                self.requests += 1
                await self.behaviour(reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    async def start(self) -> asyncio.Server:
        server = await asyncio.start_server(self.serve, "127.0.0.1", 0)
        self.port = server.sockets[0].getsockname()[1]
        return server

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"
