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


# --- an IdP that answers each user with their own identity, and whatever else it is told


def bearer(head: bytes) -> str:
    """The bearer token in a request head, "" when it has none."""
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"authorization":
            return value.strip().removeprefix(b"Bearer ").decode()
    return ""


def userinfo_answer(username: str, chunked: bool = False) -> bytes:
    """A userinfo answer naming ``username``, framed by Content-Length or chunked."""
    body = b'{"preferred_username": "%s", "sub": "uid-%s"}' % (username.encode(), username.encode())
    head = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
    if chunked:
        half = len(body) // 2
        chunks = b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in (body[:half], body[half:]))
        return head + b"Transfer-Encoding: chunked\r\n\r\n" + chunks + b"0\r\n\r\n"
    return head + b"Content-Length: %d\r\n\r\n" % len(body) + body


#: What the IdP does for one request, in order: bytes are written (and drained), a float
#: is a pause in seconds.
Steps = list[bytes | float]


class ScriptedIdP(RawIdP):
    """Answers request ``n`` (1-based, over all connections) for token ``tok-<user>`` as
    ``script(n, user)`` says; :attr:`settled` is set when nothing is left to write, so a
    client can wait until a stray answer is on its side of the socket before its next
    request (else the stray may cross it on the wire, which no client can tell)."""

    def __init__(self, script: Callable[[int, str], Steps]) -> None:
        super().__init__(self._run)
        self.script = script
        self.settled = asyncio.Event()
        self.settled.set()

    async def _run(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.settled.clear()
        try:
            for step in self.script(self.requests, bearer(self.heads[-1]).removeprefix("tok-")):
                if isinstance(step, float):
                    await asyncio.sleep(step)
                else:
                    writer.write(step)
                    await writer.drain()
        finally:
            self.settled.set()

    async def quiet(self) -> None:
        """Returns once the IdP has written all it meant to and the client's loop had
        the time to read it."""
        await self.settled.wait()
        await asyncio.sleep(0.03)
