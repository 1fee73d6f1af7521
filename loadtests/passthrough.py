"""A webhook without the gateway's protections, for the protection factor.

Every review goes straight to the configured backends, through the same backend
classes the gateway uses (same protocol, same HTTP client, same deadlines), but with
no cache, no coalescing, no breaker, no bucket, no Retry-After hold and no
pre-rejection: what a naive TokenReview webhook does. Whatever protection lives
inside a backend (Keystone's coalesced service-token re-login, the group caches,
which the runner turns down in config) stays.

    python -m loadtests.passthrough --config gateway.yaml
"""

from __future__ import annotations

import argparse
from collections.abc import Awaitable, Callable, MutableMapping
from pathlib import Path
from typing import Any

import uvicorn

from authn_gateway.config import load_config
from authn_gateway.review.tokenreview import (
    BadReview,
    parse_review,
    render_authenticated,
    render_bad_request,
    render_unauthenticated,
)
from backends.base import Authenticated, Backend, Unavailable

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]


class PassThrough:
    def __init__(self, backends: list[Backend]) -> None:
        self.backends = backends

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    for b in self.backends:
                        await b.start()
                    await send({"type": "lifespan.startup.complete"})
                elif message["type"] == "lifespan.shutdown":
                    for b in self.backends:
                        await b.close()
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        if scope["type"] != "http":
            return
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        try:
            review = parse_review(body)
        except BadReview as exc:
            await self._send(send, 400, render_bad_request(str(exc)))
            return
        errors = []
        out = render_unauthenticated(review.api_version)
        for backend in self.backends:
            outcome = await backend.authenticate(review.token)
            if isinstance(outcome, Authenticated):
                out = render_authenticated(review.api_version, outcome.user, ())
                break
            if isinstance(outcome, Unavailable):
                errors.append(f"{backend.name}: {outcome.reason}")
        else:
            if errors:
                out = render_unauthenticated(review.api_version, "; ".join(errors))
        await self._send(send, 200, out)

    @staticmethod
    async def _send(send: Send, status: int, body: bytes) -> None:
        headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body))]
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", type=Path, required=True)
    args = parser.parse_args()
    config = load_config(args.config)
    app = PassThrough([b.build() for b in config.backends])
    uvicorn.run(
        app,
        host=config.server.host,
        port=config.server.port,
        access_log=False,
        log_level="warning",
        http="httptools",
        loop="uvloop",
        timeout_keep_alive=75,
    )


if __name__ == "__main__":
    main()
