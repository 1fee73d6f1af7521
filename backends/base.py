"""The outcome types and the one interface everything that answers a token implements.

A backend answers a token with exactly one of three outcomes. Every resilience
layer in front of it depends on that split, so it lives in the types:

* :class:`Authenticated` - the IdP vouched for the token (cached positively);
* :class:`Rejected`      - the IdP said the token is invalid (cached negatively,
  and kube-apiserver may cache the refusal too);
* :class:`Unavailable`   - the IdP could not answer (never cached, counted by the
  breaker, answered with ``status.error`` so kube-apiserver does not cache it).

Backends translate every library exception into one of these at their edge;
nothing further in guesses from exception text.

:class:`Authenticator` is the interface of backends and of every layer wrapped around
them (cache, breaker, budget, deadline, chain, audiences): see docs/architecture.md.
"""

from __future__ import annotations

import abc
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol


@dataclass(frozen=True, slots=True)
class UserInfo:
    """The identity kube-apiserver receives. ``username`` is never empty."""

    username: str
    uid: str = ""
    groups: tuple[str, ...] = ()
    extra: Mapping[str, tuple[str, ...]] = field(default_factory=dict)

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


@dataclass(frozen=True, slots=True)
class Unavailable:
    # Short, secret-free reason that ends up in status.error (prefixed with the backend).
    reason: str
    # Seconds the IdP asked us to stay away (HTTP 429 Retry-After), if it said so.
    retry_after: float | None = None
    # A configuration problem (Keystone 403, LDAP bind DN refused): logged loudly.
    misconfigured: bool = False


@dataclass(frozen=True, slots=True)
class HeldBack(Unavailable):
    """The gateway held the call back itself (its own call budget said no).

    The IdP was not asked, so this says nothing about its health: the breaker releases
    its ticket instead of counting a failure. Only a :class:`~backends.budget.CallBudget`
    refusal produces it.
    """


Outcome = Authenticated | Rejected | Unavailable


@dataclass(frozen=True, slots=True)
class Verdict:
    """An outcome and where it came from."""

    outcome: Outcome
    # The backend that decided ("gateway" when no backend was asked).
    backend: str
    # Served from the cache past its TTL because the backend could not answer.
    stale: bool = False
    cached: bool = False
    audiences: tuple[str, ...] = ()


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

    async def review(self, token: str, audiences: tuple[str, ...], deadline: float) -> Verdict:
        """Answer ``token`` by ``deadline`` (event-loop time)."""
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

    def __init__(self, name: str) -> None:
        self.name = name

    async def start(self) -> None:  # noqa: B027 - optional hook
        """Open connections, load files, obtain service credentials."""

    async def close(self) -> None:  # noqa: B027 - optional hook
        """Release connections and background tasks."""

    def could_accept(self, token: str) -> bool:
        """Cheap local check: False when the token can never belong to this IdP.

        Used for pre-rejection, so it must be conservative: only say False when the
        IdP would certainly reject the token.
        """
        return True

    @abc.abstractmethod
    async def authenticate(self, token: str) -> Outcome:
        """Validate ``token`` against the IdP and return exactly one outcome."""

    async def review(self, token: str, audiences: tuple[str, ...], deadline: float) -> Verdict:
        # Deadlines and exception guards are layers of their own, around this.
        return Verdict(await self.authenticate(token), self.name)
