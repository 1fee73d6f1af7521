"""The outcome types and the one interface everything that answers a token implements.

A backend answers a token with exactly one of three outcomes. Every resilience
layer in front of it depends on that split, so it lives in the types:

* :class:`Authenticated` - the IdP vouched for the token (cached positively);
* :class:`Rejected`      - the IdP said the token is invalid (cached negatively,
  and kube-apiserver may cache the refusal too);
* :class:`Unavailable`   - the IdP could not answer (never cached, counted by the
  breaker, answered with ``status.error`` so kube-apiserver does not cache it).

Only the IdP's own health counts against its breaker: connection failures, timeouts,
5xx, 429 and bodies it cannot have meant. Nothing a client controls may count. So a
token the protocol cannot carry (not ASCII for an HTTP header, a password SASLprep
refuses) is a :class:`Rejected` with ``cause="unsendable"``: such a token cannot be
valid. An IdP answer that lacks what the mapping needs (no username claim) is a
:class:`Rejected` with ``cause="unmapped"``. A bug of ours is an
:class:`InternalError`, which the breaker ignores like :class:`HeldBack`.

Backends translate every library exception into one of these at their edge;
nothing further in guesses from exception text.

:class:`Authenticator` is the interface of backends and of every layer wrapped around
them (cache, breaker, budget, deadline, chain, audiences): see docs/architecture.md.
"""

from __future__ import annotations

import abc
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal, Protocol

from backends.context import ReviewContext, WireTime
from backends.values import value

if TYPE_CHECKING:
    from prometheus_client.registry import Collector

    from backends.shared import SharedBlobs

#: Why a backend refused: the IdP's verdict on the token ("idp"), a token the protocol
#: cannot carry ("unsendable"), or an IdP answer that lacks what the identity mapping
#: needs or has more groups than a backend reads ("unmapped"). A metric label, so the
#: set is closed.
RejectionCause = Literal["idp", "unsendable", "unmapped"]


#: kube's ``user.CredentialIDKey``: which credential a request came with, in
#: ``user.extra`` (``JTI=<jti>`` for a JWT). Audit logs and CEL rules key on it, and the
#: gateway's deny list and evictions take it.
CREDENTIAL_ID_KEY = "authentication.kubernetes.io/credential-id"


@dataclass(frozen=True, slots=True)
class UserInfo:
    """The identity kube-apiserver receives. ``username`` is never empty."""

    username: str
    uid: str = ""
    groups: tuple[str, ...] = ()
    extra: Mapping[str, tuple[str, ...]] = field(default_factory=dict)

    @property
    def credential_ids(self) -> tuple[str, ...]:
        return self.extra.get(CREDENTIAL_ID_KEY, ())

    def __post_init__(self) -> None:
        if not self.username:
            # kube-apiserver would accept authenticated:true with user "" as a real login.
            raise ValueError("UserInfo.username must not be empty")


@dataclass(frozen=True, slots=True)
class Authenticated:
    user: UserInfo
    # Unix time at which the IdP says the token expires; caps every cache lifetime.
    expires_at: float | None = None


@dataclass(frozen=True, slots=True)
class Rejected:
    # For logs only; kube-apiserver gets a bare "authenticated: false".
    reason: str
    cause: RejectionCause = "idp"
    # The user refused, when the refusal came after a backend named one (the deny list
    # refusing a user the IdP authenticated): for the review and audit logs only.
    username: str | None = None


@dataclass(frozen=True, slots=True)
class Unavailable:
    # Short, secret-free reason that ends up in status.error (prefixed with the backend).
    reason: str
    # Seconds the IdP asked us to stay away (HTTP 429 Retry-After), if it said so.
    retry_after: float | None = None
    # A configuration problem (Keystone 403, LDAP bind DN refused): logged loudly.
    misconfigured: bool = False
    # No answer in time (set where the timeout is caught, by type): the gateway checks
    # whether the time went to the IdP or to its own starved event loop.
    timed_out: bool = False

    @property
    def blames_idp(self) -> bool:
        """Whether this answer counts against the IdP's breaker."""
        return True


@dataclass(frozen=True, slots=True)
class HeldBack(Unavailable):
    """The gateway held the call back itself (its own call budget, or the adaptive
    concurrency limit, said no).

    The IdP was not asked, so this says nothing about its health: the breaker releases
    its ticket instead of counting a failure. Only a :class:`~backends.budget.CallBudget`
    refusal or the concurrency-limit layer produces it.

    ``cluster``: the cluster whose share of the bucket or line for call slots refused
    it (None: a limit of no one cluster's). Reviews of another cluster that joined the
    call do not take it as theirs: they ask under their own cluster's share.
    """

    cluster: str | None = None

    @property
    def blames_idp(self) -> bool:
        return False


@dataclass(frozen=True, slots=True)
class InternalError(Unavailable):
    """A bug of ours (an exception nobody expected): the IdP did nothing wrong, so the
    breaker releases its ticket, as for :class:`HeldBack`."""

    @property
    def blames_idp(self) -> bool:
        return False


Outcome = Authenticated | Rejected | Unavailable


@value
class Verdict:
    """An outcome and where it came from."""

    outcome: Outcome
    # The backend that decided ("gateway" when no backend was asked).
    backend: str
    # Served from the cache past its TTL because the backend could not answer.
    stale: bool = False
    cached: bool = False
    audiences: tuple[str, ...] = ()
    # Seconds the backend call took, less what it waited for the gateway's own event
    # loop (set by the deadline layer; None: no call was made). The benefit of the
    # doubt goes to the IdP: ``unread_seconds`` more may have been the IdP's (its answer
    # came in at some point of the loop's last delay), which the concurrency limit adds
    # back (an IdP's queue must not hide behind our delays) and the breaker does not.
    call_seconds: float | None = None
    unread_seconds: float = 0.0


class BackendConfigError(ValueError):
    """A backend cannot be built from its settings (an unreadable file, a bad CA bundle).

    The message names the field or file, never a secret; the gateway prefixes it with
    the backend's place in the config and refuses to start (or to reload).
    """


class Authenticator(Protocol):
    """Anything that answers a token: a backend, or a layer wrapped around one."""

    name: str

    def could_accept(self, token: str) -> bool:
        """Cheap local check: False when the token can never be accepted here."""
        ...

    def credential(self, token: str) -> str:
        """The credential ``token`` carries here, in one spelling: every token this
        authenticator takes for the same credential gives the same string. The
        gateway's token ids (review log, deny list, cache entries) are of it."""
        ...

    async def review(self, review: ReviewContext) -> Verdict:
        """Answer ``review.token`` by ``review.deadline`` (event-loop time).

        A review that can be answered without waiting (a fresh cached entry) must be
        answered without suspending: the HTTP edge runs the review eagerly and writes
        such answers at once (authn_gateway/eager.py)."""
        ...


class Backend(abc.ABC):
    """An identity provider adapter; an :class:`Authenticator` through :meth:`review`.

    Implementations must be safe to call concurrently from one event loop and must
    never block it. They never log, store or return the raw token. A backend that makes
    more than one IdP call per review is handed a :class:`~backends.budget.CallBudget`
    at construction (see :meth:`backends.settings.BackendSettings.build`).
    """

    #: Backend kind, e.g. "keystone"; used in metrics together with :attr:`name`.
    kind: str = "abstract"
    #: Whether answering calls a remote IdP. A backend that does not (static tokens)
    #: gets no cache, breaker or bucket: they would protect nothing, and anyone could
    #: empty its bucket or keep a removed token alive in its cache.
    remote: bool = True
    #: False for backends that answer locally (jwt): the pipeline's per-review breaker
    #: and outbound bucket then do not apply; such a backend protects its own IdP calls.
    calls_idp_per_review: bool = True

    def __init__(self, name: str) -> None:
        self.name = name

    async def start(self) -> None:  # noqa: B027 - optional hook
        """Open connections, load files, obtain service credentials."""

    async def close(self) -> None:  # noqa: B027 - optional hook
        """Release connections and background tasks."""

    def share_with_fleet(self, blobs: SharedBlobs) -> None:  # noqa: B027 - optional hook
        """Fleet mode: signed values this backend may share with the other replicas."""

    def collector(self) -> Collector | None:
        """The backend's own Prometheus metrics, registered with the gateway's."""
        return None

    def could_accept(self, token: str) -> bool:
        """Cheap local check: False when the token can never belong to this IdP.

        Used for pre-rejection, so it must be conservative: only say False when the
        IdP would certainly reject the token.
        """
        return True

    def credential(self, token: str) -> str:
        """The token itself: most IdPs compare the string as sent. A backend whose IdP
        takes several spellings of one credential returns the one it stands for (a
        JWT's spelling is canonicalised for every backend: ``backends.jws``)."""
        return token

    @abc.abstractmethod
    async def authenticate(self, token: str, wire: WireTime | None = None) -> Outcome:
        """Validate ``token`` against the IdP and return exactly one outcome. An HTTP
        backend sends ``wire`` with each request it makes for this review
        (``backends.transports.on_the_wire``): the clock of the IdP's part of the call."""

    async def review(self, review: ReviewContext) -> Verdict:
        # Deadlines and exception guards are layers of their own, around this.
        return Verdict(await self.authenticate(review.token, review.wire), self.name)
