"""The per-caller inbound limit, charged only for reviews that need a backend call.

kube-apiserver is one caller for all its users, so a limit charged for every review
let a burst of junk fail cached users too. A cache hit costs tens of microseconds and
no IdP call, so it is never refused. The limit guards what is expensive: the path to
the IdPs and the CPU a miss costs (coalescing, breaker, bucket, the call itself). The
cache charges it on a miss, once per review however many backends a chain asks,
before anything below it runs; a caller over its rate still gets stale identities.

The review path hands the charge down through a context variable, so no layer's
interface has to carry the caller.
"""

from __future__ import annotations

from collections.abc import Callable
from contextvars import ContextVar, Token

from authn_gateway.layers.bucket.memory import InboundLimiter


class InboundCharge:
    """One review's charge against its caller's rate: taken at most once."""

    __slots__ = ("_caller", "_limiter", "_on_refusal", "_paid")

    def __init__(
        self, limiter: InboundLimiter, caller: str, on_refusal: Callable[[], None]
    ) -> None:
        self._limiter = limiter
        self._caller = caller
        self._on_refusal = on_refusal
        self._paid: bool | None = None

    def allowed(self) -> bool:
        if self._paid is None:
            self._paid = self._limiter.allow(self._caller)
            if not self._paid:
                self._on_refusal()
        return self._paid


_current: ContextVar[InboundCharge | None] = ContextVar("inbound_charge", default=None)


def begin(charge: InboundCharge | None) -> Token[InboundCharge | None]:
    """Make ``charge`` the current review's; pass the result to :func:`end`."""
    return _current.set(charge)


def end(token: Token[InboundCharge | None]) -> None:
    _current.reset(token)


def miss_allowed() -> bool:
    """Whether the current review may go past the cache (True outside a review)."""
    charge = _current.get()
    return charge is None or charge.allowed()
