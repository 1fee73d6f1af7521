"""The wire under the backends' httpx clients (aiohttp): each way an IdP connection
fails is classified as what it is, nothing is resent behind the wrappers' backs, and
the trace events the wrappers time and resend by arrive as httpcore sent them.

Real sockets on loopback; each server counts the connections it was sent.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from tests.support import loadclient
from tests.support.procs import GatewayProcess
from tests.support.wire_helpers import Serve


async def test_an_idp_trickling_its_answer_is_cut_at_the_backend_deadline(
    serve: Serve, gateway_factory: Callable[..., GatewayProcess]
) -> None:
    # A byte every 0.2 s never trips the 1 s read timeout, which each byte restarts
    # (as httpcore's did): the review's deadline (total_seconds) ends it, and it
    # counts as the IdP failing.
    async def trickle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        body = b'{"preferred_username": "alice", "pad": "' + b"x" * 100 + b'"}'
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(body))
        for byte in body:
            writer.write(bytes([byte]))
            await writer.drain()
            await asyncio.sleep(0.2)

    idp = await serve(trickle)
    backend = {
        "name": "idp",
        "type": "userinfo",
        "url": f"{idp.url}/userinfo",
        "timeouts": {"connect_seconds": 0.5, "read_seconds": 1.0, "total_seconds": 1.0},
        "breaker": {"fail_max": 1000},
    }
    gw = gateway_factory({"backends": [backend]})
    answers = await loadclient.storm(gw.url, ["good-alice", "good-bob"], 2)
    assert [a.status for a in answers] == [200, 200]
    assert all(a.body["status"]["authenticated"] is False for a in answers)
    # The IdP's time, not "the gateway itself was slow" (which the breaker ignores):
    # before the body was on the wire clock, this one was blamed on the gateway.
    assert [a.body["status"]["error"] for a in answers] == ["idp: no answer within 1s"] * 2
    assert max(a.seconds for a in answers) < 2.5  # not the 20 s the whole answer takes
    assert idp.requests == 2
