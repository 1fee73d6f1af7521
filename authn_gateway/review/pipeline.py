"""The review path, top to bottom.

    TokenReview in
      -> pre-rejection (control characters, service-account JWTs, per-backend rules)
      -> route (prefix, or the chain) to a target Authenticator
      -> deny list (the token id of the credential the target reads; usernames and
         credential ids once a backend has answered)
      -> target.review(ReviewContext): [audiences] -> [chain] -> each backend's stack
         (cache, open breaker, concurrency limit, breaker, budget, deadline, token
         rules, backend: review/stack.py); the inbound limit (per caller) is charged by
         the cache layer on a miss only: a cache hit is never refused
    answer out

Every step below the route answers the same interface (:class:`Authenticator`), and
takes what it needs from the one :class:`~backends.context.ReviewContext` handed down,
so each can be read and tested alone; docs/architecture.md has the picture.

There is one path: :meth:`Pipeline.start`, the target's ``review``, :meth:`Pipeline.finish`.
The endpoint runs the target's review eagerly (authn_gateway/eager.py): a review that
needs no waiting (a fresh local cache entry) finishes without a task; any other
carries on from where it stopped, in one.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping

from authn_gateway.config import ServerSettings
from authn_gateway.keyed_hashes import TokenHasher
from authn_gateway.layers.bucket.metrics import LimiterMetrics
from authn_gateway.observe.metrics import Metrics
from authn_gateway.review.clusters import ClusterMap
from authn_gateway.review.metrics import ReviewMetrics
from authn_gateway.review.prerejection import prerejection_reason
from authn_gateway.review.routing import NotForCluster, Route, Router
from authn_gateway.review.stack import BackendStack
from authn_gateway.revocation.denylist import DenyList
from backends.base import Authenticated, Authenticator, Rejected, UserInfo, Verdict
from backends.context import InboundLimit, ReviewContext

GATEWAY = "gateway"
DENIED = "denied by an operator (deny list)"

__all__ = ["GATEWAY", "Pipeline", "Verdict"]


def _credential_of(route: Route[Authenticator]) -> str:
    """The credential the route's target reads; the token as sent where no backend on
    the route could accept it (it reaches none, so no backend's reading is its)."""
    target = route.target
    if target is None or not target.could_accept(route.token):
        return route.token
    return target.credential(route.token)


class Pipeline:
    def __init__(
        self,
        router: Router[Authenticator],
        backends: Mapping[str, BackendStack],
        inbound: InboundLimit | None,
        deadline: float,
        reject_service_accounts: bool,
        metrics: Metrics,
        deny_list: DenyList | None = None,
        hasher: TokenHasher | None = None,
        clusters: ClusterMap | None = None,
        cluster_routers: Mapping[str, Router[Authenticator]] | None = None,
    ) -> None:
        self.router = router
        #: Which cluster each caller is; a restricted cluster's own router.
        self.clusters = clusters or ClusterMap((), ServerSettings())
        self.cluster_routers = dict(cluster_routers or {})
        #: Each backend's stack by name (its breaker is what the admin routes reach).
        self.backends = dict(backends)
        self.inbound = inbound
        self.deadline = deadline
        self.reject_service_accounts = reject_service_accounts
        self.metrics = metrics.group(ReviewMetrics)
        self.limiters = metrics.group(LimiterMetrics)
        self.deny_list = deny_list
        self.hasher = hasher or TokenHasher(None)

    def start(
        self, token: str, audiences: tuple[str, ...], caller: str, cluster: str | None = None
    ) -> Verdict | tuple[Authenticator, ReviewContext]:
        """The review's first steps, none of which waits: a local refusal (counted), or
        the target and the context to hand it. The caller awaits ``target.review(
        context)`` (the edge runs it eagerly, authn_gateway/eager.py: a cache hit
        finishes without suspending) and passes its verdict to :meth:`finish`. The
        review runs as the caller's cluster, or as ``cluster`` (the CLI's ``--cluster``)."""
        if cluster is None:
            cluster = self.clusters.of(caller)
        route = self._route(token, cluster)
        if isinstance(route, Verdict):
            return route
        target = route.target
        assert target is not None
        context = ReviewContext(
            route.token,
            audiences,
            # Every review is answered by this time, whatever the backends do.
            asyncio.get_running_loop().time() + self.deadline,
            caller,
            cluster,
            self.inbound,
            self._on_inbound_refused,
            read_credential=target.credential,
        )
        return target, context

    def credential(self, token: str, cluster: str | None = None) -> str:
        """The credential ``token`` carries, as the backend it is routed to (for
        ``cluster``) reads it: a routed prefix stripped, a re-spelling undone
        (``Authenticator.credential``). One credential has one token id however it was
        sent: the review and audit logs, the deny list and the cache entries' ids are
        all of this."""
        return _credential_of(self._router_for(cluster).route(token))

    def token_id(self, token: str, cluster: str | None = None) -> str:
        """The id the review and audit logs show for ``token`` (:meth:`credential`)."""
        return self.hasher.token_id(self.credential(token, cluster))

    def credential_read_by(self, backend: str, context: ReviewContext) -> str:
        """The credential the review's token carries as ``backend`` (the one that
        answered it, or the chain's member named in its verdict) reads it; as the
        review's target reads it when no single backend answered. The cache entry that
        backend wrote carries the same (its cache layer reads as its backend does)."""
        stack = self.backends.get(backend)
        if stack is None:
            return context.credential()
        return stack.top.credential(context.token)

    def _router_for(self, cluster: str | None) -> Router[Authenticator]:
        """The router of every cluster, or a restricted cluster's own."""
        routers = self.cluster_routers
        return routers.get(cluster, self.router) if routers and cluster else self.router

    def finish(self, verdict: Verdict) -> Verdict:
        """The target's verdict, as answered: a denied user or credential is refused
        (known only once a backend, or the cache, has answered)."""
        deny = self.deny_list
        if deny is None or not isinstance(verdict.outcome, Authenticated):
            return verdict
        return self._denied_user(deny, verdict.outcome.user, verdict)

    async def review(
        self, token: str, audiences: tuple[str, ...], caller: str, cluster: str | None = None
    ) -> Verdict:
        """:meth:`start`, the target's review, :meth:`finish`: the whole path, for callers
        that simply await it (the CLI's ``review``, load scripts, tests)."""
        started = self.start(token, audiences, caller, cluster)
        if isinstance(started, Verdict):
            return started
        target, context = started
        return self.finish(await target.review(context))

    def _on_inbound_refused(self) -> None:
        self.limiters.refusal("inbound", GATEWAY)

    def _route(self, token: str, cluster: str) -> Route[Authenticator] | Verdict:
        """The route to the token's target, or the local refusal (counted)."""
        reason = prerejection_reason(token, self.reject_service_accounts)
        if reason is not None:
            self.metrics.prerejection(reason)
            return Verdict(Rejected(reason), GATEWAY)

        route = self._router_for(cluster).route(token)
        target = route.target
        deny = self.deny_list
        if deny is not None and deny.denies_token(lambda: self._token_ids(token, route)):
            self.metrics.deny_hit("token")
            return Verdict(Rejected(DENIED), GATEWAY)
        if target is None or not target.could_accept(route.token):
            self.metrics.prerejection("no_backend_accepts")
            return Verdict(Rejected("no backend accepts this token's form"), GATEWAY)
        if isinstance(target, NotForCluster):
            self.metrics.prerejection("not_for_cluster")
            return Verdict(Rejected(target.reason), GATEWAY)
        return route

    def _token_ids(self, token: str, route: Route[Authenticator]) -> tuple[str, ...]:
        """The ids a token denial may have been made with: the review log's (of the
        credential the target reads), under the current secret or a previous one (a
        denial made before a rotation); then, where the token was sent re-spelled or
        with a stripped prefix, the ids of the token as sent, which the log showed
        before issue 36. A denial found under any but the first is carried to it."""
        credential = _credential_of(route)
        ids = self.hasher.token_ids(credential)
        if credential == token:
            return ids
        return ids + self.hasher.token_ids(token)

    def _denied_user(self, deny: DenyList, user: UserInfo, verdict: Verdict) -> Verdict:
        """A denied user, or a denied credential (kube's credential id, ``JTI=...``)."""
        if deny.denies_user(user.username):
            kind = "user"
        elif deny.denies_credential(user):
            kind = "credential"
        else:
            return verdict
        # Whatever the IdP or the cache said. The logs name whom it refused.
        self.metrics.deny_hit(kind)
        return Verdict(Rejected(DENIED, username=user.username), verdict.backend)
