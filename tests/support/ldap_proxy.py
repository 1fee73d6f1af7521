"""A TCP proxy in front of a real slapd that cuts what slapd sends into LDAP messages and
can send a search's answer where nobody asked for it (tests/process/test_ldap_one_answer.py).

It runs in the test's event loop; the LDAP backend's threads connect to it. Faults:

* ``replay``: once, 50 ms after the first search's answer, that answer again (its
  entries and its done message, with their message ids): a stray on an idle pooled
  service connection;
* ``late_search``: hold the answer to that search (1-based, over all connections) for
  ``late_seconds``, then send it: a late answer after the client's timeout.

Every search's answer is counted (``answers``); ``settled`` is set when nothing is held
or scheduled.
"""

from __future__ import annotations

import asyncio
import contextlib

from ldap3.strategy.base import BaseStrategy

SEARCH_ENTRY, SEARCH_DONE = 0x64, 0x65


def op_tag(message: bytes) -> int:
    """The protocolOp tag of one BER-encoded LDAPMessage (after its messageID)."""
    pos = 2 if message[1] < 0x80 else 2 + (message[1] - 0x80)
    assert message[pos] == 0x02, "messageID is an INTEGER"
    return message[pos + 2 + message[pos + 1]]


class LDAPProxy:
    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self.port = 0
        self.replay = False
        self.late_search: int | None = None
        self.late_seconds = 0.0
        self.answers = 0
        self.replayed = 0
        self.settled = asyncio.Event()
        self.settled.set()
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def url(self) -> str:
        return f"ldap://127.0.0.1:{self.port}"

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    def _spawn(self, coro: object) -> None:
        task = asyncio.ensure_future(coro)  # type: ignore[arg-type]
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _serve(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        server_r, server_w = await asyncio.open_connection("127.0.0.1", self.upstream_port)
        self._spawn(self._pump(client_r, server_w))
        try:
            await self._answers(server_r, client_w)
        finally:
            for w in (client_w, server_w):
                w.close()

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError):
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        writer.close()

    async def _answers(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        pending = b""
        answer: list[bytes] = []
        with contextlib.suppress(ConnectionError):
            while data := await reader.read(65536):
                pending += data
                while (size := BaseStrategy.compute_ldap_message_size(pending)) != -1:
                    if len(pending) < size:
                        break
                    message, pending = pending[:size], pending[size:]
                    if op_tag(message) not in (SEARCH_ENTRY, SEARCH_DONE):
                        writer.write(message)
                        continue
                    answer.append(message)
                    if op_tag(message) == SEARCH_DONE:
                        self.answers += 1
                        whole, answer = b"".join(answer), []
                        await self._send_answer(writer, whole)
                await writer.drain()

    async def _send_answer(self, writer: asyncio.StreamWriter, whole: bytes) -> None:
        if self.answers == self.late_search:
            self.settled.clear()
            self._spawn(self._later(writer, whole, self.late_seconds))
            return
        writer.write(whole)
        if self.replay and self.replayed == 0 and self.answers == 1:
            self.replayed += 1
            self.settled.clear()
            self._spawn(self._later(writer, whole, 0.05))

    async def _later(self, writer: asyncio.StreamWriter, data: bytes, delay: float) -> None:
        try:
            await asyncio.sleep(delay)
            writer.write(data)
            with contextlib.suppress(ConnectionError):
                await writer.drain()
        finally:
            self.settled.set()
