"""The innermost layer: each backend call gets its own deadline, a bug in a backend
becomes Unavailable (never a 500 or an "invalid token"), and every call is counted."""

from __future__ import annotations

import asyncio
import logging
import time

from backends.base import Authenticated, Authenticator, Rejected, Unavailable, Verdict

from .layer import Layer
from .metrics import Metrics

log = logging.getLogger(__name__)


def _kind(outcome: object) -> str:
    if isinstance(outcome, Authenticated):
        return "authenticated"
    return "rejected" if isinstance(outcome, Rejected) else "unavailable"


class DeadlineLayer(Layer):
    def __init__(self, inner: Authenticator, seconds: float, metrics: Metrics) -> None:
        super().__init__(inner)
        self.seconds = seconds
        self.metrics = metrics

    async def review(self, token: str, audiences: tuple[str, ...], deadline: float) -> Verdict:
        started = time.perf_counter()
        try:
            async with asyncio.timeout(self.seconds):
                verdict = await self.inner.review(token, audiences, deadline)
        except TimeoutError:
            verdict = Verdict(Unavailable(f"no answer within {self.seconds:g}s"), self.name)
        except Exception:
            log.exception("backend %s raised; answering unavailable", self.name)
            verdict = Verdict(Unavailable("internal error"), self.name)
        outcome = verdict.outcome
        self.metrics.backend_call(self.name, _kind(outcome), time.perf_counter() - started)
        if isinstance(outcome, Unavailable) and outcome.misconfigured:
            self.metrics.misconfigured(self.name)
            log.error("backend %s: configuration problem: %s", self.name, outcome.reason)
        return verdict
