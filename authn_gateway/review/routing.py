"""Which backends may see a token, and the wrappers over their stacks.

* A token that starts with a backend's ``prefix`` goes to that backend only
  (longest prefix wins), with the prefix removed when ``strip_prefix`` is set.
* Any other token goes through the *chain*: the backends with no prefix (or with
  ``in_chain: true``), in the order of the config file.
* A cluster that may not use a backend (``clusters[].backends``, ``.prefixes``) has a
  router of its own: that backend is not in its chain, and its prefix routes to
  :class:`NotForCluster`, a refusal without a call.

The chain's answer (:class:`Chain`):

* the first backend that authenticates the token wins;
* if every backend rejected it, it is rejected;
* if any backend was unavailable and none authenticated, the answer is
  *unavailable*, never "invalid": the backend that was down might have accepted it.

:class:`Audiences` then intersects the requested audiences with the deciding
backend's configured ones.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

from authn_gateway.layers.base import Layer
from backends.base import Authenticated, Authenticator, Rejected, Unavailable, Verdict
from backends.context import ReviewContext
from backends.values import value

B = TypeVar("B")

CHAIN = "chain"


@value
class Route(Generic[B]):
    # None when no backend may see this token.
    target: B | None
    # The token as the target must see it (prefix stripped where configured).
    token: str


@dataclass(frozen=True, slots=True)
class PrefixRule(Generic[B]):
    prefix: str
    strip: bool
    backend: B


class Router(Generic[B]):
    def __init__(self, prefixed: Sequence[PrefixRule[B]], chain: B | None) -> None:
        self._prefixed = sorted(prefixed, key=lambda r: len(r.prefix), reverse=True)
        self._chain = chain

    def route(self, token: str) -> Route[B]:
        for rule in self._prefixed:
            if token.startswith(rule.prefix):
                routed = token[len(rule.prefix) :] if rule.strip else token
                return Route(rule.backend, routed)
        return Route(self._chain, token)


class NotForCluster:
    """Where a cluster's token with a prefix it may not use goes: the pipeline refuses
    it at once (counted), and nothing below is asked."""

    def __init__(
        self, cluster: str, backend: str, credential: Callable[[str], str] | None = None
    ) -> None:
        self.name = backend
        self.reason = f"cluster {cluster!r} may not use backend {backend!r}"
        # The backend's own reading: a token has the id it has in any other cluster.
        self.credential: Callable[[str], str] = credential or str

    def could_accept(self, token: str) -> bool:
        return True

    async def review(self, review: ReviewContext) -> Verdict:
        return Verdict(Rejected(self.reason), self.name)


def unavailable_in_chain(unanswered: Sequence[tuple[str, Unavailable]]) -> Unavailable:
    """The chain's answer when none authenticated and some could not answer.

    The verdict names the first backend that could not answer, and the answer renders
    as ``<backend>: <reason>``; so the first reason goes bare and each further one
    carries its backend's name: ``sso: timeout; ldap: server down``."""
    (_, first), rest = unanswered[0], unanswered[1:]
    return Unavailable("; ".join([first.reason, *(f"{name}: {u.reason}" for name, u in rest)]))


class Chain:
    """Several backends' stacks, asked in order (see the module's rules)."""

    name = CHAIN

    def __init__(self, members: Sequence[Authenticator]) -> None:
        self.members = tuple(members)

    def could_accept(self, token: str) -> bool:
        return any(m.could_accept(token) for m in self.members)

    def credential(self, token: str) -> str:
        """The first member's reading that is not the token as sent, of the members that
        could accept it (those the chain asks), else the token. One credential, one
        reading: the token formats that backends re-spell (an LDAP ``user:password``, a
        Keystone fernet token) never overlap, so at most one member that could accept a
        token re-spells it; a member that could not (a fernet token too short for
        Keystone's precheck) never sees it, and its reading is no one's. The pipeline's
        deny check also takes the token as sent, which every other member reads."""
        for member in self.members:
            if not member.could_accept(token):
                continue
            read = member.credential(token)
            if read != token:
                return read
        return token

    async def review(self, review: ReviewContext) -> Verdict:
        token = review.token
        candidates = [m for m in self.members if m.could_accept(token)]
        if len(candidates) == 1:
            return await candidates[0].review(review)
        unanswered: list[tuple[str, Unavailable]] = []
        verdict = Verdict(Rejected("no backend accepts this token's form"), CHAIN)
        for member in candidates:
            verdict = await member.review(review)
            if isinstance(verdict.outcome, Authenticated):
                return verdict
            if isinstance(verdict.outcome, Unavailable):
                unanswered.append((member.name, verdict.outcome))
        if not unanswered:
            return verdict
        return Verdict(unavailable_in_chain(unanswered), unanswered[0][0])


def chain_of(members: Sequence[Authenticator]) -> Authenticator | None:
    """The chain's target: nothing, the one member itself, or a :class:`Chain`."""
    if not members:
        return None
    return members[0] if len(members) == 1 else Chain(members)


class Audiences(Layer):
    """Intersect requested with the deciding backend's audiences; empty refuses."""

    def __init__(self, inner: Authenticator, configured: Mapping[str, tuple[str, ...]]) -> None:
        super().__init__(inner)
        self._configured = configured

    async def review(self, review: ReviewContext) -> Verdict:
        return self._narrow(await self.inner.review(review), review.audiences)

    def _narrow(self, verdict: Verdict, audiences: tuple[str, ...]) -> Verdict:
        if not audiences or not isinstance(verdict.outcome, Authenticated):
            return verdict
        configured = self._configured.get(verdict.backend, ())
        if not configured:
            # kube-apiserver then applies its own --api-audiences.
            return verdict
        matched = tuple(a for a in audiences if a in configured)
        if not matched:
            return Verdict(Rejected("token not valid for the requested audiences"), verdict.backend)
        return Verdict(verdict.outcome, verdict.backend, verdict.stale, verdict.cached, matched)
