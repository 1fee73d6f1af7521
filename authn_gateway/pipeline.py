"""The review path, top to bottom.

    TokenReview in
      -> inbound limit (per caller)
      -> pre-rejection (control characters, service-account JWTs, per-backend rules)
      -> route (prefix, or the chain) to a target Authenticator
      -> target.review: [audiences] -> [chain] -> each backend's stack
         (token rules, cache, breaker, budget, deadline, backend; see stack.py)
    answer out

Every step below the route answers the same interface (:class:`Authenticator`), so
each can be read and tested alone; docs/architecture.md has the picture.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping

from backends.base import Authenticator, Rejected, Unavailable, Verdict

from .bucket.memory import InboundLimiter
from .metrics import Metrics
from .prerejection import prerejection_reason
from .routing import Router
from .stack import BackendStack

GATEWAY = "gateway"

__all__ = ["GATEWAY", "Pipeline", "Verdict"]


class Pipeline:
    def __init__(
        self,
        router: Router[Authenticator],
        backends: Mapping[str, BackendStack],
        inbound: InboundLimiter | None,
        deadline: float,
        reject_service_accounts: bool,
        metrics: Metrics,
    ) -> None:
        self.router = router
        #: Each backend's stack by name (its breaker is what the admin routes reach).
        self.backends = dict(backends)
        self.inbound = inbound
        self.deadline = deadline
        self.reject_service_accounts = reject_service_accounts
        self.metrics = metrics

    async def review(self, token: str, audiences: tuple[str, ...], caller: str) -> Verdict:
        if self.inbound is not None and not self.inbound.allow(caller):
            self.metrics.limiter_refusal("inbound", GATEWAY)
            return Verdict(Unavailable("caller exceeded its review rate"), GATEWAY)

        reason = prerejection_reason(token, self.reject_service_accounts)
        if reason is not None:
            self.metrics.prerejection(reason)
            return Verdict(Rejected(reason), GATEWAY)

        route = self.router.route(token)
        target = route.target
        if target is None or not target.could_accept(route.token):
            self.metrics.prerejection("no_backend_accepts")
            return Verdict(Rejected("no backend accepts this token's form"), GATEWAY)

        # Every review is answered by this time, whatever the backends do.
        deadline = asyncio.get_running_loop().time() + self.deadline
        return await target.review(route.token, audiences, deadline)
