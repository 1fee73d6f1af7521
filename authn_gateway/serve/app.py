"""The ASGI application: the review path first, then everything else, and the lifespan.

It serves the current :class:`~.generation.Generation`; the reloader swaps in the next.
"""

from __future__ import annotations

import logging

from authn_gateway.serve.authorize import REFUSAL_KEY, send_refusal
from authn_gateway.serve.endpoint import BEGUN_KEY, Begun
from authn_gateway.serve.gateway import Gateway
from authn_gateway.serve.generation import Generation
from authn_gateway.serve.webhook_http import Receive, Scope, Send

log = logging.getLogger(__name__)

__all__ = ["GatewayApp", "Receive", "Scope", "Send"]


class GatewayApp:
    """The ASGI application: the review path first, then the authorization path (when
    ``authorization:`` is set), then everything else, and the lifespan."""

    def __init__(self, gateway: Gateway) -> None:
        self._install(Generation(gateway))

    def _install(self, generation: Generation) -> None:
        self.generation = generation
        # Mirrored here: the review path reads them on every request.
        self.gateway = generation.gateway
        self.review_log = generation.review_log
        self.review_path = generation.review_path
        self.review = generation.review
        self.authorize_path = generation.authorize_path
        self.authorize = generation.authorize
        self.ops = generation.ops
        #: The paths the webhook endpoints serve (each checks its callers itself).
        self.webhook_paths = frozenset(
            p for p in (self.review_path, self.authorize_path) if p is not None
        )

    def swap(self, generation: Generation) -> Generation:
        """Serve new requests with ``generation`` (already started). Returns the old one:
        its reviews may still be running (drain it, then close it)."""
        old = self.generation
        self._install(generation)
        return old

    def answer_at_once(self, scope: Scope, body: bytes) -> bytes | None:
        """The edge's answer-at-once hook (:mod:`.edge`): a review of the current
        generation answered without awaiting, or None."""
        path = scope["path"]
        if path == self.review_path:
            return self.review.answer_at_once(scope, body)
        if path == self.authorize_path and self.authorize is not None:
            return self.authorize.answer_at_once(scope, body)
        return None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        begun: Begun | None = scope.get(BEGUN_KEY)
        if begun is not None:
            # A review the edge began is finished by the generation that began it.
            await begun.endpoint(scope, receive, send)
            return
        if scope["type"] == "http" and scope["path"] == self.review_path:
            await self.review(scope, receive, send)
            return
        refusal = scope.pop(REFUSAL_KEY, None)
        if refusal is not None:
            await send_refusal(refusal, send)
            return
        if scope["type"] == "http" and scope["path"] == self.authorize_path and self.authorize:
            await self.authorize(scope, receive, send)
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
