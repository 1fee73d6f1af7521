"""The call budget a backend is handed at construction.

The gateway pays for each review's first call to the IdP (the stack's budget layer).
A backend that makes further calls for one review (group pages, token info, service
logins) takes one unit from its :class:`CallBudget` for each, so they count against
the same outbound rate. A refusal is :class:`~backends.base.HeldBack`: the IdP was not
asked, and the breaker does not count it.

HTTP backends get this from :class:`BudgetedTransport` (under the client
:func:`backends.http.make_client` builds): every request takes from the budget except
those sent with ``extensions=PAID_BY_REVIEW``.
"""

from __future__ import annotations

from typing import Protocol

import httpx

from backends.base import HeldBack

#: Request extension marking the call the review's budget layer already paid for.
PAID_KEY = "backends.paid_by_review"
PAID_BY_REVIEW: dict[str, object] = {PAID_KEY: True}


class CallBudget(Protocol):
    """The backend's outbound token bucket (the same one its stack's budget layer uses)."""

    async def acquire(self, max_wait: float = 0.0) -> bool: ...


class _Unlimited:
    async def acquire(self, max_wait: float = 0.0) -> bool:
        return True


#: For backends built outside a gateway (tests, tools): every call allowed.
UNLIMITED: CallBudget = _Unlimited()


class CallHeldBack(httpx.TransportError):
    """The budget refused a follow-up call; :func:`backends.http.transport_failure` maps
    it to :class:`HeldBack`."""

    outcome = HeldBack("outbound rate limit reached (follow-up call)")


class BudgetedTransport(httpx.AsyncBaseTransport):
    """Per-call policy: a follow-up request goes out only if the budget allows it."""

    def __init__(self, inner: httpx.AsyncBaseTransport, budget: CallBudget) -> None:
        self._inner = inner
        self._budget = budget

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if not request.extensions.get(PAID_KEY) and not await self._budget.acquire():
            raise CallHeldBack(CallHeldBack.outcome.reason, request=request)
        return await self._inner.handle_async_request(request)

    async def aclose(self) -> None:
        await self._inner.aclose()
