"""The ASGI application: the review path first, then everything else, and the lifespan.

It serves the current :class:`~.generation.Generation`; the reloader swaps in the next.
"""

from __future__ import annotations

import logging

from authn_gateway.serve.endpoint import BEGUN_KEY, Begun, Receive, Scope, Send
from authn_gateway.serve.gateway import Gateway
from authn_gateway.serve.generation import Generation

log = logging.getLogger(__name__)

__all__ = ["GatewayApp", "Receive", "Scope", "Send"]


class GatewayApp:
    """The ASGI application: review path first, then everything else, and the lifespan."""

    def __init__(self, gateway: Gateway) -> None:
        self._install(Generation(gateway))

    def _install(self, generation: Generation) -> None:
        self.generation = generation
        # Mirrored here: the review path reads them on every request.
        self.gateway = generation.gateway
        self.review_log = generation.review_log
        self.review_path = generation.review_path
        self.review = generation.review
        self.ops = generation.ops

    def swap(self, generation: Generation) -> Generation:
        """Serve new requests with ``generation`` (already started). Returns the old one:
        its reviews may still be running (drain it, then close it)."""
        old = self.generation
        self._install(generation)
        return old

    def answer_at_once(self, scope: Scope, body: bytes) -> bytes | None:
        """The edge's answer-at-once hook (:mod:`.edge`): a review of the current
        generation answered without awaiting, or None."""
        if scope["path"] != self.review_path:
            return None
        return self.review.answer_at_once(scope, body)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        begun: Begun | None = scope.get(BEGUN_KEY)
        if begun is not None:
            # A review the edge began is finished by the generation that began it.
            await begun.endpoint(scope, receive, send)
            return
        if scope["type"] == "http" and scope["path"] == self.review_path:
            await self.review(scope, receive, send)
            return
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
            return
        await self.ops(scope, receive, send)

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                try:
                    await self.generation.start()
                except Exception as exc:
                    log.exception("start-up failed")
                    await send({"type": "lifespan.startup.failed", "message": str(exc)})
                    return
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await self.generation.close()
                await send({"type": "lifespan.shutdown.complete"})
                return
