"""Where a cache miss's CPU goes in the gateway, in process, against a real IdP socket.

The miss of ``loadtests.bench`` (a never-seen token, a userinfo backend, the default
config) is timed from the inside out: the IdP call alone by the clients (a bare
asyncio HTTP/1.1 exchange on a kept-alive socket, the floor for one call on this event
loop; a plain ``httpx.AsyncClient`` on httpcore; aiohttp's client alone, the wire
under the backends' httpx; the backend's own client with its transport wrappers),
then the backend stack, the pipeline and a whole request through the edge protocol.
Each row is the CPU this process spent per call (best of the rounds), so the IdP's own
work, in its own process on another core, is not in it; the rows' differences are
what each part adds to a miss. Run pinned:

    taskset -c 1 python -m loadtests.misspath [--calls 2000] [--profile out.pstats]
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import itertools
import os
import subprocess
import sys
import tempfile
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import httpx

from authn_gateway.config import parse_config
from authn_gateway.edge import GatewayHttpProtocol
from authn_gateway.observe.logsink import LogSink
from authn_gateway.serve.app import GatewayApp
from authn_gateway.serve.gateway import Gateway
from backends.base import Authenticated
from backends.context import ReviewContext
from tests.support.procs import free_port, wait_for_port

from .bench import pinned
from .hotpath import KeepingTransport, best_us_async, connection

CONFIG = """
inbound_limit: {{rate: 1000000000, burst: 1000000000}}
backends:
  - name: idp
    type: userinfo
    url: {url}
    bucket: {{rate: 100000.0, burst: 100000}}
"""
BODY = b'{"apiVersion":"authentication.k8s.io/v1","kind":"TokenReview","spec":{"token":"%s"}}'
REQUEST = (
    b"POST /authenticate?timeout=30s HTTP/1.1\r\nHost: 127.0.0.1:8080\r\n"
    b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n"
)
ROUNDS = 5
_serial = itertools.count()


def fresh_token() -> str:
    return f"good-miss-{next(_serial)}"


class AwaitedTransport(KeepingTransport):
    """Resolves ``answered`` when an answer is written: the review waits for the IdP."""

    def __init__(self) -> None:
        super().__init__()
        self.answered: asyncio.Future[None] | None = None

    def write(self, data: bytes) -> None:
        super().write(data)
        if data.endswith(b"}") and self.answered is not None and not self.answered.done():
            self.answered.set_result(None)


class RawClient:
    """One kept-alive HTTP/1.1 connection, written and read by hand: the floor."""

    def __init__(self, host: str, port: int, path: str) -> None:
        self._addr, self._path = (host, port), path
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None

    async def get(self, token: str) -> int:
        if self._reader is None or self._writer is None:
            self._reader, self._writer = await asyncio.open_connection(*self._addr)
        head = f"GET {self._path} HTTP/1.1\r\nHost: idp\r\nAuthorization: Bearer {token}\r\n"
        self._writer.write(head.encode() + b"\r\n")
        answer = await self._reader.readuntil(b"\r\n\r\n")
        length = 0
        for line in answer.split(b"\r\n"):
            name, _, value = line.partition(b":")
            if name.lower() == b"content-length":
                length = int(value)
        await self._reader.readexactly(length)
        return int(answer[9:12])

    async def close(self) -> None:
        if self._writer is not None:
            self._writer.close()


async def measure(url: str, port: int, calls: int, profile: str | None) -> None:
    gateway = Gateway(parse_config(CONFIG.format(url=url), "misspath"))
    app = GatewayApp(gateway)
    assert app.review_log is not None
    app.review_log.sink = LogSink(os.devnull)
    await gateway.start()
    handle = gateway.pipeline.backends["idp"]
    backend, stack = handle.backend, handle.top
    loop = asyncio.get_running_loop()
    raw = RawClient("127.0.0.1", port, "/userinfo")
    plain = httpx.AsyncClient(trust_env=False)
    transport = AwaitedTransport()
    # Made when its row starts: an idle connection is closed after the keep-alive timeout.
    conns: list[Any] = []

    async def backend_call() -> None:
        outcome = await backend.authenticate(fresh_token())
        assert isinstance(outcome, Authenticated), outcome

    async def stack_miss() -> None:
        verdict = await stack.review(ReviewContext(fresh_token(), (), loop.time() + 5))
        assert isinstance(verdict.outcome, Authenticated), verdict

    async def pipeline_miss() -> None:
        verdict = await gateway.pipeline.review(fresh_token(), (), "127.0.0.1")
        assert isinstance(verdict.outcome, Authenticated), verdict

    async def request_miss() -> None:
        if not conns:
            conns.append(connection(app, GatewayHttpProtocol, transport)[0])
        body = BODY % fresh_token().encode()
        transport.answered = loop.create_future()
        conns[0].data_received(REQUEST % len(body) + body)
        await transport.answered

    async def raw_get() -> None:
        assert await raw.get(fresh_token()) == 200

    async def plain_get() -> None:
        r = await plain.get(url, headers={"Authorization": f"Bearer {fresh_token()}"})
        assert r.status_code == 200

    if profile:
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(calls):
            await request_miss()
        prof.disable()
        prof.dump_stats(profile)
        print(f"profile of {calls:,} missed reviews through the protocol written to {profile}")
    parts: list[tuple[str, Callable[[], Awaitable[Any]]]] = [
        ("IdP call, bare asyncio HTTP/1.1 (the floor)", raw_get),
        ("IdP call, plain httpx.AsyncClient", plain_get),
        ("IdP call, the backend (its client and wrappers)", backend_call),
        ("backend stack (cache, coalesce, breaker, bucket, ...)", stack_miss),
        ("pipeline.review (routing, admission)", pipeline_miss),
        ("whole request through the edge protocol", request_miss),
    ]
    session = aiohttp.ClientSession()

    async def aiohttp_get() -> None:
        headers = {"Authorization": f"Bearer {fresh_token()}"}
        async with session.get(url, headers=headers) as r:
            assert r.status == 200
            await r.read()

    parts.insert(2, ("IdP call, aiohttp alone (the backends' wire)", aiohttp_get))
    print(f"CPU of the gateway's process per missed review, best of {ROUNDS} x {calls:,}:")
    floor = 0.0
    for label, one in parts:
        await one()  # connections made, first-call imports done
        micros = await best_us_async(one, ROUNDS, calls)
        floor = floor or micros
        print(f"  {label:<56} {micros:7.1f} us  {micros / floor:5.2f} x floor", flush=True)
    await session.close()
    await raw.close()
    await plain.aclose()
    conns[0].connection_lost(None)
    await gateway.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=2000, help="misses per round (2000)")
    parser.add_argument("--profile", help="write a cProfile of the whole-request run here")
    args = parser.parse_args()
    port, control = free_port(), free_port()
    cmd = [sys.executable, "-m", "tests.support.fakes.idp", "--port", str(port)]
    cmd += ["--control-port", str(control)]
    with tempfile.TemporaryDirectory() as tmp, Path(tmp, "idp.log").open("wb") as log:
        # The IdP on the other core: its CPU is not ours, and it does not share ours.
        idp = subprocess.Popen(pinned(0, cmd), stdout=log, stderr=subprocess.STDOUT)
        try:
            wait_for_port(port, proc=idp, timeout=20)
            import uvloop

            uvloop.run(measure(f"http://127.0.0.1:{port}/userinfo", port, args.calls, args.profile))
        finally:
            idp.terminate()
            idp.wait(timeout=10)
    return 0


if __name__ == "__main__":
    sys.exit(main())
