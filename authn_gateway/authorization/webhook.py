"""A SubjectAccessReview's body in, its answer out: the cache, the parse, the policy.

Everything a decision reads is in the review: the user, groups and extra that the
TokenReview produced (the Keystone backend puts the roles and the project there), and
the request's attributes. No rule kind of either format needs more, so a decision
calls no IdP: not Keystone, not any backend's stack (docs/authorization.md).

The answer is always a 200 but for a body that is not a SubjectAccessReview
(:class:`~.sar.BadAccessReview`, a 400 naming the field). When no policy can decide,
or deciding raised (a bug of ours, counted), the answer is ``on_error``: "no opinion"
(allowed and denied false: the next authorizer decides), or a denial.
"""

from __future__ import annotations

from authn_gateway.authorization.cache import DecisionCache
from authn_gateway.authorization.metrics import AuthorizationMetrics
from authn_gateway.authorization.rules import DENIED, NO_OPINION, Answer
from authn_gateway.authorization.sar import parse_access_review
from authn_gateway.authorization.source import PolicySource
from authn_gateway.config.authorization import AuthorizationSettings
from authn_gateway.config.sections import MarkerSettings
from authn_gateway.observe.internal_errors import internal_error
from authn_gateway.observe.metrics import Metrics
from backends.context import DEFAULT_CLUSTER

WHERE = "authorization"

UNAVAILABLE = "unavailable"


#: The key deploy/apiserver/authorization-config.yaml's matchCondition asks for
#: (``'authn-gateway.io/backend' in request.extra``): kube-apiserver asks this webhook
#: about a user only when the TokenReview's answer carried it, which takes
#: ``markers.backend`` on and ``markers.prefix`` as shipped.
SHIPPED_MATCH_KEY = "authn-gateway.io/backend"
SHIPPED_MATCH_CONDITION = f"'{SHIPPED_MATCH_KEY}' in request.extra"


def match_condition_warning(markers: MarkerSettings) -> str | None:
    """One line when the markers the shipped matchCondition relies on are off or
    renamed, so that kube-apiserver wired with the shipped structured config would
    never ask this webhook; None when they are as shipped."""
    key = markers.prefix + "backend"
    if markers.backend and key == SHIPPED_MATCH_KEY:
        return None
    if not markers.backend:
        why, fix = "markers.backend is off", "turn markers.backend on"
    else:
        why = f"markers.prefix is {markers.prefix!r} (the marker is {key!r})"
        fix = f"write \"'{key}' in request.extra\" there"
    return (
        f"authorization: {why}: kube-apiserver wired with the shipped structured config "
        f"(deploy/apiserver/authorization-config.yaml, matchCondition "
        f'"{SHIPPED_MATCH_CONDITION}") never asks this webhook; {fix} '
        "(the --authorization-mode flags have no matchCondition)"
    )


def unavailable_answer(on_error: str, error: str) -> Answer:
    kind = DENIED if on_error == "deny" else NO_OPINION
    return Answer.render(kind, "authn-gateway: no policy could decide", error)


class AuthorizationWebhook:
    def __init__(
        self,
        settings: AuthorizationSettings,
        metrics: Metrics,
        previous: AuthorizationWebhook | None = None,
    ) -> None:
        self.settings = settings
        self._metrics = metrics
        self.metrics = metrics.group(AuthorizationMetrics)
        c = settings.cache
        self.cache = DecisionCache(
            c.max_entries, c.authorized_ttl_seconds, c.unauthorized_ttl_seconds
        )
        self.source: PolicySource = PolicySource(
            settings,
            self.metrics,
            on_change=self.cache.clear,
            report=self._bug,
            previous=previous.source if previous is not None else None,
        )
        self._no_policy = unavailable_answer(settings.on_error, "no policy in force")
        self._failed = unavailable_answer(settings.on_error, "internal error (logged)")
        self._count = self.metrics.decision
        self._hit = self.metrics.cache_hit

    def _bug(self, exc: Exception) -> None:
        internal_error(WHERE, exc, self._metrics)

    def answer(self, body: bytes, cluster: str = DEFAULT_CLUSTER) -> bytes:
        """The 200's body for ``body``, counted for the caller's ``cluster``; raises
        :class:`BadAccessReview` for a malformed one (nothing is counted or kept for it).
        The policy is the gateway's, not a cluster's: one body has one answer whoever
        asks, so the cache is shared too."""
        cache = self.cache
        key = cache.key(body)
        kept = cache.get(key)
        if kept is not None:
            api_version, kind, answer = kept
            self._hit()
            self._count(api_version, kind, cluster)
            return answer
        review = parse_access_review(body)
        policy = self.source.policy
        if policy is None:
            self._count(review.api_version, UNAVAILABLE, cluster)
            return self._no_policy.bodies[review.api_version]
        try:
            decided = policy.decide(review)
        except Exception as exc:
            self._bug(exc)
            self._count(review.api_version, UNAVAILABLE, cluster)
            return self._failed.bodies[review.api_version]
        rendered = decided.bodies[review.api_version]
        cache.put(key, review.api_version, decided.kind, rendered)
        self._count(review.api_version, decided.kind, cluster)
        return rendered

    async def start(self) -> None:
        await self.source.start()

    async def close(self) -> None:
        await self.source.close()
