"""The innermost layer: each backend call gets its own deadline, a bug in a backend
becomes Unavailable (never a 500 or an "invalid token"), and every call is counted.

It also tells the IdP's time from the gateway's own (:mod:`.looplag`): the layers above
read the call's time less what it waited for our event loop, and a call that ran out
of time mostly waiting for our loop is :class:`OwnDelay`, not the IdP failing.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, replace

from authn_gateway.eager import in_a_task
from authn_gateway.layers.base import Layer
from authn_gateway.layers.deadline.metrics import CallMetrics
from authn_gateway.observe import looplag
from authn_gateway.observe.internal_errors import internal_error
from authn_gateway.observe.metrics import Metrics
from backends.base import Authenticator, Unavailable, Verdict
from backends.context import ReviewContext, WireTime

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class OwnDelay(Unavailable):
    """The call timed out, but most of its time went waiting for the gateway's own
    event loop (a starved CPU, a backlog of reviews): the IdP may well have answered.
    Not counted against the IdP (breaker, concurrency limit): otherwise a flood of
    cheap reviews that starves the gateway would open the breaker on a healthy IdP."""

    @property
    def blames_idp(self) -> bool:
        return False


class DeadlineLayer(Layer):
    def __init__(self, inner: Authenticator, seconds: float, metrics: Metrics) -> None:
        super().__init__(inner)
        self.seconds = seconds
        self.metrics = metrics
        self.calls = metrics.group(CallMetrics)

    async def review(self, review: ReviewContext) -> Verdict:
        await in_a_task()  # a call is never answered at once (asyncio.timeout needs a task)
        lag = looplag.for_running_loop()
        behind = lag.behind
        wire = WireTime(lag.delay_within)
        started = time.perf_counter()
        try:
            async with asyncio.timeout(self.seconds):
                verdict = await self.inner.review(review.for_call(wire=wire))
        except TimeoutError:
            verdict = Verdict(
                Unavailable(f"no answer within {self.seconds:g}s", timed_out=True), self.name
            )
        except Exception as exc:
            # A bug of ours: not a 500, not an "invalid token", not the IdP's fault.
            verdict = Verdict(internal_error(self.name, exc, self.metrics), self.name)
        ended = time.perf_counter()
        seconds = ended - started
        # The layers above (breaker: slow calls; concurrency limit: latency) read the
        # IdP's part: not the time the call waited for our own loop (looplag.py).
        idp, unread = idp_time(seconds, ended, wire, lag, lag.behind - behind)
        ours = seconds - (idp - unread)
        outcome = verdict.outcome
        if (
            isinstance(outcome, Unavailable)
            and outcome.timed_out
            and outcome.blames_idp
            and ours >= seconds / 2
        ):
            outcome = OwnDelay(f"{outcome.reason} (the gateway itself was slow)", timed_out=True)
            self.calls.own_timeout(self.name)
        self.calls.outcome(self.name, outcome, seconds)
        self.calls.own_delay(self.name, ours)
        verdict = replace(
            verdict, outcome=outcome, call_seconds=idp - unread, unread_seconds=unread
        )
        if isinstance(outcome, Unavailable) and outcome.misconfigured:
            self.calls.misconfigured(self.name)
            log.error("backend %s: configuration problem: %s", self.name, outcome.reason)
        return verdict


def idp_time(
    seconds: float, ended: float, wire: WireTime, lag: looplag.LoopLag, loop_delay: float
) -> tuple[float, float]:
    """Of a call's ``seconds``, the IdP's, and how many of those may have been ours
    after all (answers that sat unread while our loop was behind).

    Over HTTP it is the time on the wire, answered or not: a request still unanswered
    at the end (a timeout) had the IdP from its connect or write on, and one never
    written never reached the IdP. Otherwise (LDAP) the call's time less the loop's
    delays over it.
    """
    if not wire.requests:
        return seconds - min(seconds, loop_delay), 0.0
    idp, unread = wire.seconds, wire.unread
    if wire.pending is not None:
        idp += ended - wire.pending
        unread += lag.delay_within(wire.pending, ended)
    idp = min(idp, seconds)
    return idp, min(unread, idp)
