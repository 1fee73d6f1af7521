"""The SubjectAccessReview endpoint (``authorization.path``, /authorize): a raw ASGI
handler behind the same caller check, method, content-type and size bound as the
TokenReview endpoint, over :class:`~authn_gateway.authorization.webhook.AuthorizationWebhook`.

A decision never waits (the policy and its cache are in memory), so a request the edge
received whole is answered by :meth:`AuthorizeEndpoint.answer_at_once` without a task;
a refusal it found there is left in the scope for the ASGI path to send, and counted
once. The answer rules (docs/authorization.md): 200 for every decision, whatever the
policy's state; 400 naming the field for a body that is not a SubjectAccessReview; 413
past ``server.max_body_bytes``; 401 for an unknown caller. Never a 5xx: kube-apiserver
retries those with backoff, and then has no opinion anyway.

Each decision is counted for the caller's cluster (``clusters:``, as the TokenReview
endpoint counts reviews): the caller the edge identified, mapped by the same
:class:`~authn_gateway.review.clusters.ClusterMap`.
"""

from __future__ import annotations

from authn_gateway.authorization.sar import BadAccessReview
from authn_gateway.authorization.webhook import WHERE, AuthorizationWebhook
from authn_gateway.config import ServerSettings
from authn_gateway.edge.callerauth import CallerAuth
from authn_gateway.observe.metrics import Metrics
from authn_gateway.review.clusters import ClusterMap
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

#: Where :meth:`AuthorizeEndpoint.answer_at_once` leaves a refusal for the ASGI path.
REFUSAL_KEY = "authn_gateway.authorize_refusal"


async def send_refusal(refusal: Reply, send: Send) -> None:
    """A refusal :meth:`AuthorizeEndpoint.answer_at_once` left in the scope: sent by the
    app whichever generation is current (a reload may have swapped the endpoint)."""
    await send_json(send, refusal.status, refusal.body, refusal.headers)


class AuthorizeEndpoint:
    """POST <authorization.path>: SubjectAccessReview in, SubjectAccessReview out."""

    def __init__(
        self,
        webhook: AuthorizationWebhook,
        server: ServerSettings,
        callers: CallerAuth,
        metrics: Metrics,
        clusters: ClusterMap,
    ) -> None:
        self.webhook = webhook
        self.callers = callers
        self.cluster_of = clusters.of
        self.max_body = server.max_body_bytes
        self.refusals = Refusals(metrics, WHERE)
        self.gate = RequestGate(callers, self.max_body, self.refusals)

    def answer_at_once(self, scope: Scope, body: bytes) -> bytes | None:
        """The edge's hook for a request that arrived whole: the 200's body, or None
        with the refusal left in the scope for :meth:`__call__`."""
        answer = self._answer(scope, body)
        if isinstance(answer, bytes):
            return answer
        scope[REFUSAL_KEY] = answer
        return None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        answer = await self._read(scope, receive)
        if isinstance(answer, bytes):
            await send_json(send, 200, answer)
        elif answer is not None:  # (None: the client went away)
            await send_refusal(answer, send)

    async def _read(self, scope: Scope, receive: Receive) -> bytes | Reply | None:
        body = await self.gate.read(scope, receive)
        return self._decide(scope, body) if isinstance(body, bytes) else body

    def _answer(self, scope: Scope, body: bytes) -> bytes | Reply:
        refusal = self.gate.whole(scope, body)
        return refusal if refusal is not None else self._decide(scope, body)

    def _decide(self, scope: Scope, body: bytes) -> bytes | Reply:
        try:
            return self.webhook.answer(body, self.cluster_of(caller_identity(scope)))
        except BadAccessReview as exc:
            return self.refusals.refused(400, str(exc))
        except Exception as exc:
            # A bug of ours before a decision: a 400 (no opinion there, no retry).
            return self.refusals.unreadable(exc)
