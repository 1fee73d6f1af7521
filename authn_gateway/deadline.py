"""The innermost layer: each backend call gets its own deadline, a bug in a backend
becomes Unavailable (never a 500 or an "invalid token"), and every call is counted."""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import replace

from backends.base import Authenticator, Unavailable, Verdict

from .internal_errors import internal_error
from .layer import Layer
from .metrics import Metrics

log = logging.getLogger(__name__)


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
        except Exception as exc:
            # A bug of ours: not a 500, not an "invalid token", not the IdP's fault.
            verdict = Verdict(internal_error(self.name, exc, self.metrics), self.name)
        outcome = verdict.outcome
        seconds = time.perf_counter() - started
        self.metrics.backend_outcome(self.name, outcome, seconds)
        # The layers above (breaker: slow calls; concurrency limit: latency) read it.
        verdict = replace(verdict, call_seconds=seconds)
        if isinstance(outcome, Unavailable) and outcome.misconfigured:
            self.metrics.misconfigured(self.name)
            log.error("backend %s: configuration problem: %s", self.name, outcome.reason)
        return verdict
