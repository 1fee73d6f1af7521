"""The TokenReview endpoint: a raw ASGI handler, whose review the edge runs eagerly.

It is the hot path, and starlette's Request/Response objects would cost more than a
cached review. Health, metrics and admin routes are an ordinary starlette app
(:mod:`.ops`). Each step of a request (caller check, size, parse, the pipeline, render,
count, log) exists once. The edge hands a request that arrived whole to
:meth:`ReviewEndpoint.answer_at_once`, which runs the steps that never wait and the
backend's stack eagerly (authn_gateway/eager.py): a cache hit is answered without a
task or a coroutine of its own; a review whose stack must wait carries on from where
it stopped, in the ASGI task (:meth:`ReviewEndpoint.__call__`).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

from authn_gateway.eager import Suspended, run_eagerly
from authn_gateway.edge.callerauth import CallerAuth
from authn_gateway.observe.audit import AuditLog
from authn_gateway.observe.internal_errors import internal_error
from authn_gateway.observe.reviewlog import ReviewLog
from authn_gateway.review.metrics import ReviewMetrics
from authn_gateway.review.pipeline import GATEWAY
from authn_gateway.review.tokenreview import (
    Answer,
    BadReview,
    ReviewRequest,
    parse_review,
    render_verdict,
)
from authn_gateway.serve.gateway import Gateway
from authn_gateway.serve.webhook_http import (
    Receive,
    Refusals,
    Reply,
    RequestGate,
    Scope,
    Send,
    caller_identity,
    send_json,
)
from backends.base import Authenticated, Verdict
from backends.context import ReviewContext

log = logging.getLogger(__name__)

# Cached answers kept rendered (a few hundred bytes each).
RENDERED_ANSWERS = 10_000


@dataclass(slots=True)
class Waiting:
    """A review whose backend stack had to wait: what the steps before it computed, and
    the stack's run, to carry on in a task (:meth:`ReviewEndpoint._carry_on`)."""

    review: ReviewRequest
    caller: str
    started: float
    run: Suspended[Verdict]
    #: What the pipeline started it with: its cluster, and how its target reads it.
    context: ReviewContext


#: What a request's steps give: a 200's body, a refusal, or a review still waiting.
Step = bytes | Reply | Waiting

#: Where :meth:`ReviewEndpoint.answer_at_once` leaves what it began for the ASGI path.
BEGUN_KEY = "authn_gateway.begun"


@dataclass(frozen=True, slots=True)
class Begun:
    """A review the edge began eagerly: a refusal to send, or the review to carry on.
    It is finished by the endpoint that began it (a reload may swap in another)."""

    endpoint: ReviewEndpoint
    step: Reply | Waiting


class ReviewEndpoint:
    """POST <review_path>: TokenReview in, TokenReview out (see the answer rules in README)."""

    def __init__(self, gateway: Gateway, review_log: ReviewLog | None) -> None:
        self.gateway = gateway
        self.pipeline = gateway.pipeline
        self.markers = gateway.markers
        self.metrics = gateway.metrics
        self.refusals = Refusals(gateway.metrics, GATEWAY)
        # Bound once: this counts every review.
        self.count_review = gateway.metrics.group(ReviewMetrics).review
        self.max_body = gateway.config.server.max_body_bytes
        self.review_log = review_log
        self.callers = CallerAuth(gateway.config.server, prefer=gateway.clusters.subjects)
        self.gate = RequestGate(self.callers, self.max_body, self.refusals)
        self.clusters = gateway.clusters
        audit_to = gateway.config.server.audit_log
        queue_lines = gateway.config.logging.audit_queue_lines
        self.audit_log = AuditLog(audit_to, queue_lines) if audit_to else None
        # Reviews running now; a config reload closes the old gateway once this is 0.
        self.in_flight = 0
        # Answers to cached outcomes, rendered once: (api_version, backend, stale,
        # audiences, id(outcome)) -> (outcome, answer). The outcome is kept and compared
        # by identity, so an id is never mistaken for a later object's.
        self._rendered: dict[tuple[str, str, bool, tuple[str, ...], int], tuple[Any, Answer]] = {}

    def answer_at_once(self, scope: Scope, body: bytes) -> bytes | None:
        """The edge's hook for a request that arrived whole. A 200 that needed no waiting
        (a cache hit, a local refusal) is returned for the edge to write at once;
        anything else (a refusal, a review that must wait) is left in the scope for
        :meth:`__call__`, which the edge then runs as ASGI, to send or to carry on: no
        step runs twice."""
        step = self._begin(scope, body)
        if isinstance(step, bytes):
            return step
        scope[BEGUN_KEY] = Begun(self, step)
        return None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        begun: Begun | None = scope.pop(BEGUN_KEY, None)
        step: Step | None = begun.step if begun is not None else await self._read(scope, receive)
        if isinstance(step, Waiting):
            step = await self._carry_on(step)
        if isinstance(step, bytes):
            await send_json(send, 200, step)
        elif step is not None:
            await send_json(send, step.status, step.body, step.headers)

    def _begin(self, scope: Scope, body: bytes) -> Step:
        """A request that arrived whole: the head's checks, then the body's."""
        refusal = self.gate.whole(scope, body)
        return refusal if refusal is not None else self._review_body(scope, body)

    async def _read(self, scope: Scope, receive: Receive) -> Step | None:
        """A request that did not arrive whole: refused before its body is read, or read
        and begun (None: the client went away)."""
        body = await self.gate.read(scope, receive)
        return self._review_body(scope, body) if isinstance(body, bytes) else body

    def _review_body(self, scope: Scope, body: bytes) -> Step:
        """The review in ``body``, by the answer rules in README: a 400 for what cannot be
        read, else a 200 whatever happens below (never a 500), or :class:`Waiting` if
        the backend's stack must wait. Everything up to the stack's first wait runs
        here, once."""
        try:
            review = parse_review(body)
        except BadReview as exc:
            return self._refused(400, str(exc))
        except Exception as exc:
            return self._unreadable(exc)
        started = time.perf_counter()
        caller = caller_identity(scope)
        context: ReviewContext | None = None
        try:
            step = self.pipeline.start(review.token, review.audiences, caller)
            if not isinstance(step, Verdict):
                target, context = step
                run = run_eagerly(target.review(context))
                if isinstance(run, Suspended):
                    self.in_flight += 1  # a reload closes this generation once it is 0
                    return Waiting(review, caller, started, run, context)
                step = self.pipeline.finish(run)
        except Exception as exc:
            # Last line of defence: the answer rules never allow a 500.
            step = Verdict(internal_error(GATEWAY, exc, self.metrics), GATEWAY)
        return self._answer(review, step, caller, started, context)

    async def _carry_on(self, waiting: Waiting) -> bytes:
        """A :class:`Waiting` review, carried on from its stack's first wait, in a task."""
        try:
            try:
                verdict = self.pipeline.finish(await waiting.run.resume())
            except Exception as exc:
                verdict = Verdict(internal_error(GATEWAY, exc, self.metrics), GATEWAY)
            return self._answer(
                waiting.review, verdict, waiting.caller, waiting.started, waiting.context
            )
        finally:
            self.in_flight -= 1

    def _unreadable(self, exc: Exception) -> Reply:
        return self.refusals.unreadable(exc)

    def _refused(
        self, status: int, message: str, headers: list[tuple[bytes, bytes]] | None = None
    ) -> Reply:
        return self.refusals.refused(status, message, headers)

    def _answer(
        self,
        review: ReviewRequest,
        verdict: Verdict,
        caller: str,
        started: float,
        context: ReviewContext | None = None,
    ) -> bytes:
        """The 200's body; counts and logs the review. ``context``: what the pipeline
        started it with (None: refused before a target was chosen)."""
        try:
            return self._render_count_log(review, verdict, caller, started, context)
        except Exception as exc:
            # Rendering, counting or logging failed: the error answer, rendered alone.
            verdict = Verdict(internal_error(GATEWAY, exc, self.metrics), GATEWAY)
            return render_verdict(review.api_version, verdict).body

    def _render_count_log(
        self,
        review: ReviewRequest,
        verdict: Verdict,
        caller: str,
        started: float,
        context: ReviewContext | None,
    ) -> bytes:
        outcome = verdict.outcome
        body, answer = self._render(review.api_version, verdict)
        elapsed = time.perf_counter() - started
        # (No clusters configured: every caller is default, and nothing is counted by it.)
        cluster = None
        if self.clusters.configured:
            cluster = context.cluster if context is not None else self.clusters.of(caller)
        self.count_review(review.api_version, verdict.backend, answer, elapsed, cluster)
        if self.review_log is None and self.audit_log is None:
            return body
        # Of the credential the backend reads, however it was sent (a routed prefix):
        # as the backend that answered read it, else routed again (a local refusal).
        if context is not None:
            credential = self.pipeline.credential_read_by(verdict.backend, context)
            token_id = self.gateway.hasher.token_id(credential)
        else:
            token_id = self.pipeline.token_id(review.token, cluster)
        if self.review_log is not None:
            user = (
                outcome.user.username
                if isinstance(outcome, Authenticated)
                else getattr(outcome, "username", None)  # a denied user
            )
            self.review_log.write(
                token=token_id,
                answer=answer,
                backend=verdict.backend,
                ms=round(elapsed * 1000, 2),
                cached=verdict.cached,
                stale=verdict.stale,
                user=user,
                reason=None if isinstance(outcome, Authenticated) else outcome.reason,
                caller=caller,
                cluster=cluster,
            )
        if self.audit_log is not None:
            self.audit_log.write(
                caller=caller,
                backend=verdict.backend,
                answer=answer,
                outcome=outcome,
                token_id=token_id,
                stale=verdict.stale,
                cluster=cluster,
            )
        return body

    def _render(self, api_version: str, verdict: Verdict) -> Answer:
        if not verdict.cached:
            return render_verdict(api_version, verdict, self.markers)
        outcome = verdict.outcome
        key = (api_version, verdict.backend, verdict.stale, verdict.audiences, id(outcome))
        known = self._rendered.get(key)
        if known is not None and known[0] is outcome:
            return known[1]
        answer = render_verdict(api_version, verdict, self.markers)
        if len(self._rendered) >= RENDERED_ANSWERS:
            self._rendered.clear()  # bounded; the hot set renders itself again at once
        self._rendered[key] = (outcome, answer)
        return answer

    def close_logs(self) -> None:
        if self.review_log is not None:
            self.review_log.flush()
        if self.audit_log is not None:
            self.audit_log.close()
