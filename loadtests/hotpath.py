"""Where a cache-hit review's CPU goes, layer by layer, in process (no sockets).

The gateway's ASGI app is called in a loop with a prebuilt TokenReview for a cached
token; each layer is also timed alone. Best of 5 rounds of CPU time, so other work on
the machine disturbs it less than wall-clock benchmarks. Run pinned for steadier
figures:

    taskset -c 1 python -m loadtests.hotpath
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Awaitable, Callable
from typing import Any

from authn_gateway.app import GatewayApp
from authn_gateway.config import parse_config
from authn_gateway.gateway import Gateway
from authn_gateway.logsink import LogSink
from authn_gateway.prerejection import prerejection_reason
from authn_gateway.tokenreview import parse_review, render_authenticated

CONFIG = """
inbound_limit: {rate: 1000000000, burst: 1000000000}
backends:
  - name: demo
    type: static
    tokens: [{token: demo-admin-token, username: demo-admin, uid: "1000", groups: [admins]}]
"""
TOKEN = "demo-admin-token"
BODY = (
    b'{"apiVersion":"authentication.k8s.io/v1","kind":"TokenReview",'
    b'"spec":{"token":"demo-admin-token"}}'
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
        (b"accept-encoding", b"gzip"),
        (b"content-length", str(len(BODY)).encode()),
    ],
}
ROUNDS, N = 5, 20_000


def best_us(run: Callable[[], Any]) -> float:
    best = float("inf")
    for _ in range(ROUNDS):
        started = time.process_time()
        for _ in range(N):
            run()
        best = min(best, (time.process_time() - started) / N * 1e6)
    return best


async def best_us_async(run: Callable[[], Awaitable[Any]]) -> float:
    best = float("inf")
    for _ in range(ROUNDS):
        started = time.process_time()
        for _ in range(N):
            await run()
        best = min(best, (time.process_time() - started) / N * 1e6)
    return best


async def main() -> None:
    app = GatewayApp(Gateway(parse_config(CONFIG, "hotpath")))
    assert app.review_log is not None
    # Lines are queued as in production; the writer thread writes them to /dev/null.
    app.review_log.sink = LogSink(os.devnull)
    gateway = app.gateway
    await gateway.start()

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": BODY, "more_body": False}

    async def send(message: Any) -> None:
        return None

    verdict = await gateway.pipeline.review(TOKEN, (), "c")
    loop = asyncio.get_running_loop()
    stack = gateway.pipeline.backends["demo"].top
    rows = [
        (
            "whole review (ASGI app, cache hit)",
            await best_us_async(lambda: app(SCOPE, receive, send)),
        ),
        (
            "  pipeline.review",
            await best_us_async(lambda: gateway.pipeline.review(TOKEN, (), "127.0.0.1")),
        ),
        (
            "    backend layers (key, cache, verdict)",
            await best_us_async(lambda: stack.review(TOKEN, (), loop.time() + 5)),
        ),
        (
            "      HMAC-SHA256 cache key",
            best_us(lambda: gateway.hasher.cache_key("demo", TOKEN, ())),
        ),
        ("    inbound limiter", best_us(lambda: gateway.pipeline.inbound.allow("127.0.0.1"))),  # type: ignore[union-attr]
        ("    pre-rejection", best_us(lambda: prerejection_reason(TOKEN, True))),
        ("  parse TokenReview", best_us(lambda: parse_review(BODY))),
        (
            "  render TokenReview",
            best_us(
                lambda: render_authenticated("authentication.k8s.io/v1", verdict.outcome.user, ())
            ),
        ),  # type: ignore[union-attr]
        (
            "  metrics (counter + histogram)",
            best_us(
                lambda: gateway.metrics.review(
                    "authentication.k8s.io/v1", "demo", "authenticated", 1e-4
                )
            ),
        ),
        ("  token id for the log (keyed BLAKE2b)", best_us(lambda: gateway.hasher.token_id(TOKEN))),
        (
            "  review log line",
            best_us(
                lambda: app.review_log.write(  # type: ignore[union-attr]
                    token="0123456789ab",
                    answer="authenticated",
                    backend="demo",
                    ms=0.03,
                    cached=True,
                    user="demo-admin",
                    caller="127.0.0.1",
                )
            ),
        ),
    ]
    print(f"CPU per call, best of {ROUNDS} x {N:,} (in process, no sockets):")
    for label, micros in rows:
        print(f"  {label:<44} {micros:6.2f} us")
    await gateway.close()


if __name__ == "__main__":
    asyncio.run(main())
