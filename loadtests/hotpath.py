"""Where a cache-hit review's CPU goes, layer by layer, in process (no sockets).

The same review as ``loadtests.bench`` (a userinfo backend, default config, review log
and metrics on, its answer in the local cache) is timed three ways: through the HTTP
protocol (the edge's ``GatewayHttpProtocol`` fed the request bytes over a transport
that keeps what is written, so the parser, the event loop's task and the ASGI app are
all in; 16 connections get one request each per turn of the loop, as under wrk a turn
reads many), as an ASGI call, and layer by layer. The raw reference app of
``loadtests.refapps`` is timed through uvicorn's own protocol the same way, so the
first two rows read as "the gateway's cost" against "Python's floor on this stack".
Best of 5 rounds of CPU time, so other work on the machine disturbs it less than
wall-clock benchmarks. Run pinned for steadier figures:

    taskset -c 1 python -m loadtests.hotpath [--profile out.pstats]
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import os
import time
from collections.abc import Awaitable, Callable
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
from uvicorn.server import ServerState

from authn_gateway.config import parse_config
from authn_gateway.edge import EdgeLimits, GatewayHttpProtocol
from authn_gateway.observe.logsink import LogSink
from authn_gateway.review.metrics import ReviewMetrics
from authn_gateway.review.prerejection import prerejection_reason
from authn_gateway.review.tokenreview import parse_review, render_verdict
from authn_gateway.serve.app import GatewayApp
from authn_gateway.serve.gateway import Gateway
from authn_gateway.serve.server import _UvicornConfig
from backends.base import Authenticated, UserInfo
from backends.context import ReviewContext

from .refapps import raw_app

CONFIG = """
inbound_limit: {rate: 1000000000, burst: 1000000000}
backends:
  - name: idp
    type: userinfo
    url: http://127.0.0.1:9/userinfo
"""
TOKEN = "good-bench-user"
BODY = (
    b'{"apiVersion":"authentication.k8s.io/v1","kind":"TokenReview",'
    b'"spec":{"token":"good-bench-user"}}'
)
# What wrk sends (loadtests.bench): three headers.
REQUEST = (
    b"POST /authenticate?timeout=30s HTTP/1.1\r\nHost: 127.0.0.1:8080\r\n"
    b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(BODY) + BODY
)
SCOPE = {
    "type": "http",
    "method": "POST",
    "path": "/authenticate",
    "query_string": b"timeout=30s",
    "client": ("127.0.0.1", 40000),
    "headers": [
        (b"host", b"gw"),
        (b"content-type", b"application/json"),
        (b"content-length", str(len(BODY)).encode()),
    ],
}
ROUNDS, N = 5, 20_000


def best_us(run: Callable[[], Any], calls: int = N) -> float:
    best = float("inf")
    for _ in range(ROUNDS):
        started = time.process_time()
        for _ in range(calls):
            run()
        best = min(best, (time.process_time() - started) / calls * 1e6)
    return best


async def best_us_async(
    run: Callable[[], Awaitable[Any]], rounds: int = ROUNDS, calls: int = N
) -> float:
    """CPU of this process per call, best of ``rounds`` rounds of ``calls`` calls."""
    best = float("inf")
    for _ in range(rounds):
        started = time.process_time()
        for _ in range(calls):
            await run()
        best = min(best, (time.process_time() - started) / calls * 1e6)
    return best


class KeepingTransport:
    """Enough of an asyncio transport for the HTTP protocols; counts what is written."""

    def __init__(self) -> None:
        self.writes = 0
        self.answers = 0

    def write(self, data: bytes) -> None:
        self.writes += 1
        if data.endswith(b"}"):
            self.answers += 1

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"sockname": ("127.0.0.1", 8080), "peername": ("127.0.0.1", 40000)}.get(
            name, default
        )

    def is_closing(self) -> bool:
        return False

    def pause_reading(self) -> None: ...
    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None: ...
    def set_protocol(self, protocol: Any) -> None: ...
    def resume_reading(self) -> None: ...
    def close(self) -> None: ...

    def can_write_eof(self) -> bool:
        return True

    def write_eof(self) -> None: ...


def connection(
    app: Any, protocol: type[HttpToolsProtocol], transport: KeepingTransport | None = None
) -> tuple[Any, KeepingTransport]:
    edge = EdgeLimits()
    # The server's wiring (server.run): cache hits answered by the protocol itself.
    edge.answer_at_once = getattr(app, "answer_at_once", None)
    config = _UvicornConfig(
        app,
        edge=edge,
        http=protocol,
        lifespan="off",
        access_log=False,
        log_config=None,
        proxy_headers=False,
    )
    config.load()
    conn = protocol(config=config, server_state=ServerState(), app_state={})
    transport = transport or KeepingTransport()
    conn.connection_made(transport)
    return conn, transport


# Requests per turn of the loop, one on each of as many connections: under wrk's 64
# connections a turn reads many, and what is done once per turn (the edge's flush of
# held writes, the loop's own pass) is shared among them, as it is here.
PER_TURN = 16


async def http_us(app: Any, protocol: type[HttpToolsProtocol], calls: int = N) -> float:
    """One request through the protocol: parse, task, app, answer written."""
    conns = [connection(app, protocol) for _ in range(PER_TURN)]

    async def turn() -> None:
        wants = [transport.answers + 1 for _, transport in conns]
        for conn, _ in conns:
            conn.data_received(REQUEST)
        for (_, transport), want in zip(conns, wants, strict=True):
            while transport.answers < want:
                await asyncio.sleep(0)

    await turn()
    turns, best = max(1, calls // PER_TURN), float("inf")
    for _ in range(ROUNDS):
        started = time.process_time()
        for _ in range(turns):
            await turn()
        best = min(best, (time.process_time() - started) / (turns * PER_TURN) * 1e6)
    for conn, _ in conns:
        conn.connection_lost(None)
    return best


async def main(profile: str | None, calls: int = N) -> None:
    def timed(run: Callable[[], Any]) -> float:
        return best_us(run, calls)

    async def timed_async(run: Callable[[], Awaitable[Any]]) -> float:
        return await best_us_async(run, ROUNDS, calls)

    app = GatewayApp(Gateway(parse_config(CONFIG, "hotpath")))
    assert app.review_log is not None
    # Lines are queued as in production; the writer thread writes them to /dev/null.
    app.review_log.sink = LogSink(os.devnull)
    gateway = app.gateway
    await gateway.start()
    stack = gateway.pipeline.backends["idp"].top
    user = UserInfo("bench-user", "1000", ("developers", "viewers"))
    key = gateway.hasher.cache_key(stack.namespace, TOKEN, ())  # type: ignore[attr-defined]
    await stack.cache.put(key, Authenticated(user), time.time(), gateway.hasher.token_id(TOKEN))  # type: ignore[attr-defined]

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": BODY, "more_body": False}

    async def send(message: Any) -> None:
        return None

    key_ns = stack.namespace  # type: ignore[attr-defined]
    verdict = await gateway.pipeline.review(TOKEN, (), "c")
    count_review = gateway.metrics.group(ReviewMetrics).review  # as the endpoint keeps it
    assert verdict.cached, verdict
    loop = asyncio.get_running_loop()
    if profile:
        conn, transport = connection(app, GatewayHttpProtocol)
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(calls):
            want = transport.answers + 1
            conn.data_received(REQUEST)
            while transport.answers < want:
                await asyncio.sleep(0)
        prof.disable()
        prof.dump_stats(profile)
        print(f"profile of {calls:,} requests through the protocol written to {profile}")
    rows = [
        (
            "raw ASGI + orjson through uvicorn's protocol",
            await http_us(raw_app, HttpToolsProtocol, calls),
        ),
        ("gateway through the edge protocol", await http_us(app, GatewayHttpProtocol, calls)),
        (
            "  whole review (ASGI app, cache hit)",
            await timed_async(lambda: app(SCOPE, receive, send)),
        ),
        (
            "    pipeline.review",
            await timed_async(lambda: gateway.pipeline.review(TOKEN, (), "127.0.0.1")),
        ),
        (
            "      backend stack (key, cache, verdict)",
            await timed_async(lambda: stack.review(ReviewContext(TOKEN, (), loop.time() + 5))),
        ),
        (
            "        HMAC-SHA256 cache key",
            timed(lambda: gateway.hasher.cache_key(key_ns, TOKEN, ())),
        ),
        ("      pre-rejection", timed(lambda: prerejection_reason(TOKEN, True))),
        ("    parse TokenReview", timed(lambda: parse_review(BODY))),
        (
            "    render the answer",
            timed(lambda: render_verdict("authentication.k8s.io/v1", verdict, gateway.markers)),
        ),
        (
            "    metrics (counter + histogram)",
            timed(
                lambda: count_review(
                    "authentication.k8s.io/v1", "idp", "authenticated", 1e-4, "default"
                )
            ),
        ),
        (
            "    token id for the log (keyed BLAKE2b)",
            timed(lambda: gateway.hasher.token_id(TOKEN)),
        ),
        (
            "    review log line",
            timed(
                lambda: app.review_log.write(  # type: ignore[union-attr]
                    token="0123456789ab",
                    answer="authenticated",
                    backend="idp",
                    ms=0.03,
                    cached=True,
                    user="bench-user",
                    caller="127.0.0.1",
                )
            ),
        ),
    ]
    print(f"CPU per call, best of {ROUNDS} x {calls:,} (in process, no sockets):")
    for label, micros in rows:
        print(f"  {label:<48} {micros:6.2f} us")
    raw, gw = rows[0][1], rows[1][1]
    print(f"  gateway / raw through the protocol: {gw / raw:.2f}")
    await gateway.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--profile", help="write a cProfile of the protocol run here")
    parser.add_argument("--calls", type=int, default=N, help=f"calls per round ({N:,})")
    args = parser.parse_args()
    import uvloop

    uvloop.run(main(args.profile, args.calls))
