"""The base of every resilience layer: it wraps one authenticator and is one."""

from __future__ import annotations

from collections.abc import Callable

from backends.base import Authenticator, Verdict
from backends.context import ReviewContext


class Layer:
    """A layer answers :meth:`review` (forwarding it by default) and passes
    ``could_accept`` and ``credential`` through; what it needs of the review comes in the
    :class:`~backends.context.ReviewContext`, never from outside the call."""

    name: str
    could_accept: Callable[[str], bool]
    credential: Callable[[str], str]

    def __init__(self, inner: Authenticator) -> None:
        self.inner = inner
        self.name = inner.name
        # The cheap pre-check passes straight through: one lookup, not a call per layer.
        self.could_accept = inner.could_accept
        self.credential = inner.credential

    async def review(self, review: ReviewContext) -> Verdict:
        return await self.inner.review(review)
