"""The resend: only uWSGI's unannounced close on a pooled connection, once, paid from the budget.

Real sockets: a server that, like uWSGI's http-socket, drops a kept-alive connection
without a word when the next request arrives on it, and the fake IdP resetting every
connection. Counts are the servers' own.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import httpx
import pytest

from backends.budget import PAID_BY_REVIEW
from backends.http import TLSClientSettings, make_client
from backends.settings import TimeoutSettings
from backends.transports import ResendIfDropped
from tests.support.fakes.idp import FakeIdP


class UnannouncedClose:
    """Answers the first request on each connection (keep-alive, no "Connection: close"),
    then closes the connection when a second request arrives, answering nothing."""

    def __init__(self) -> None:
        self.answered = 0
        self.dropped = 0
        self.connections = 0
        self.port = 0
        self._server: asyncio.Server | None = None

    async def start(self) -> UnannouncedClose:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            for n in range(2):
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":")[1])
                await reader.readexactly(length)
                if n == 1:
                    self.dropped += 1
                    return  # the "closed" socket: no byte of an answer
                self.answered += 1
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            return
        finally:
            writer.close()

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()


class Budget:
    def __init__(self, calls: int) -> None:
        self.left = calls
        self.asked = 0

    async def acquire(self, max_wait: float = 0.0) -> bool:
        self.asked += 1
        if self.left <= 0:
            return False
        self.left -= 1
        return True


@pytest.fixture
async def uwsgi_like() -> AsyncIterator[UnannouncedClose]:
    server = await UnannouncedClose().start()
    yield server
    await server.stop()


def client(url: str, budget: Budget | None) -> httpx.AsyncClient:
    timeouts = TimeoutSettings(connect_seconds=0.5, read_seconds=0.5, total_seconds=0.5)
    return make_client(url, timeouts, TLSClientSettings(), budget=budget, resend_if_dropped=True)


def resends(c: httpx.AsyncClient) -> int:
    transport = c._transport
    while not isinstance(transport, ResendIfDropped):
        transport = transport._inner  # under the budget's transport
    return transport.resends


async def test_a_request_dropped_on_a_pooled_connection_is_resent_once(
    uwsgi_like: UnannouncedClose,
) -> None:
    budget = Budget(100)
    async with client(f"http://127.0.0.1:{uwsgi_like.port}", budget) as c:
        # Each call paid by its review (as the budget layer pays the first call): only
        # resends ask the budget.
        answers = [await c.get("/v3/auth/tokens", extensions=PAID_BY_REVIEW) for _ in range(10)]
        assert [a.status_code for a in answers] == [200] * 10
        # Every call after the first met the dropped pooled socket, and was resent once.
        assert uwsgi_like.answered == 10
        assert uwsgi_like.dropped == 9
        assert resends(c) == 9
        assert budget.asked == 9


async def test_a_resend_the_budget_refuses_is_not_made(uwsgi_like: UnannouncedClose) -> None:
    budget = Budget(0)
    async with client(f"http://127.0.0.1:{uwsgi_like.port}", budget) as c:
        assert (await c.get("/", extensions=PAID_BY_REVIEW)).status_code == 200
        with pytest.raises(httpx.RemoteProtocolError):
            await c.get("/", extensions=PAID_BY_REVIEW)
        assert resends(c) == 0
        assert uwsgi_like.answered == 1
        assert uwsgi_like.connections == 1  # no second connection for a resend


async def test_a_reset_on_a_fresh_connection_is_never_resent(fake_idp: FakeIdP) -> None:
    fake_idp.configure(reset=True)
    budget = Budget(100)
    async with client(fake_idp.url, budget) as c:
        for _ in range(8):
            with pytest.raises(httpx.TransportError):
                await c.get("")
        assert resends(c) == 0
    assert fake_idp.calls == 8  # one request per call, as the IdP counts them


async def test_a_timeout_is_never_resent(fake_idp: FakeIdP) -> None:
    budget = Budget(100)
    async with client(fake_idp.url, budget) as c:
        await c.get("", headers={"authorization": "Bearer good-a"})  # pool one connection
        fake_idp.reset_stats()
        fake_idp.configure(hang=True)
        with pytest.raises(httpx.TimeoutException):
            await c.get("", headers={"authorization": "Bearer good-a"})
        assert resends(c) == 0
    assert fake_idp.calls == 1
