"""What one review carries down the stack: :class:`ReviewContext`, and the wire clock of
its calls, :class:`WireTime`.

Every layer's needs are in this one typed value, handed from layer to layer as the
argument of ``review`` (like kube-apiserver's ``authenticator.Request``): nothing rides
on context variables, so no layer depends on an order of other layers that the stack
list does not show. A layer that changes what the layers below see (the cache layer's
priority for one call, the deadline layer's wire clock) hands them a copy
(:meth:`ReviewContext.for_call`); the review's own fields (token, audiences, deadline,
the inbound charge) stay the same object for every backend a chain asks.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Protocol

#: The cluster of callers that match no configured cluster (and of every caller when
#: no ``clusters:`` are configured): it shares each IdP like any other.
DEFAULT_CLUSTER = "default"


class InboundLimit(Protocol):
    """The per-caller limit on reviews that need an IdP call (review/inbound.py)."""

    def allow(self, caller: str) -> bool: ...


@dataclass(slots=True)
class ReviewContext:
    """One review, as every layer of a backend's stack sees it."""

    #: The token as the target must see it (a routed prefix already stripped).
    token: str
    #: The audiences the TokenReview asked for (empty: the API server's own).
    audiences: tuple[str, ...] = ()
    #: Event-loop time by which the review is answered, whatever the backends do.
    deadline: float = math.inf
    #: Who asked (a client-certificate identity or a source address), for the inbound
    #: limit and nothing else.
    caller: str = ""
    #: The cluster the caller belongs to (a configured name, or :data:`DEFAULT_CLUSTER`):
    #: the concurrency and budget layers share each IdP between clusters by weight.
    cluster: str = DEFAULT_CLUSTER
    #: The per-caller limit, charged once per review, only by a cache miss (None: off).
    inbound: InboundLimit | None = None
    #: Called once if the caller's charge is refused (a metric).
    on_refused: Callable[[], None] | None = None
    #: Whether the caller's charge was taken (None: not yet asked).
    paid: bool | None = None
    #: For one IdP call (set by the cache layer): a stale entry could answer the review
    #: meanwhile, so the call waits behind those for never-seen tokens.
    has_fallback: bool = False
    #: For one IdP call: False when it takes a free concurrency slot or none (the cache
    #: layer then answers stale and queues the refresh); True when it may queue.
    may_queue: bool = True
    #: For one IdP call (set by the deadline layer): the clock of its time on the wire.
    wire: WireTime | None = None
    #: How the review's target reads ``token`` as one credential (its
    #: ``Authenticator.credential``, set by the pipeline); None: as sent.
    read_credential: Callable[[str], str] | None = None

    def credential(self) -> str:
        """The credential the token carries, as the target reads it: what its token id
        (the review log's, the deny list's, a cache entry's) is of. Computed when asked
        (a cache fill), never on a cache hit."""
        read = self.read_credential
        return self.token if read is None else read(self.token)

    def miss_allowed(self) -> bool:
        """Whether this review may go past the cache: the caller's charge, taken at most
        once however many backends a chain asks (docs/architecture.md)."""
        if self.paid is None:
            inbound = self.inbound
            self.paid = inbound is None or inbound.allow(self.caller)
            if not self.paid and self.on_refused is not None:
                self.on_refused()
        return self.paid

    def for_call(
        self,
        *,
        has_fallback: bool | None = None,
        may_queue: bool | None = None,
        wire: WireTime | None = None,
    ) -> ReviewContext:
        """A copy for one call below: what it changes, the rest as the review's."""
        return replace(
            self,
            has_fallback=self.has_fallback if has_fallback is None else has_fallback,
            may_queue=self.may_queue if may_queue is None else may_queue,
            wire=self.wire if wire is None else wire,
        )


class WireTime:
    """Seconds a review's HTTP calls spent on the wire: from each request's connect (or
    its write on a pooled connection) to the last byte of its answer's body. Leaves out
    the turns the caller's event loop takes around them (pool, close): under a starved
    CPU those are the caller's time, not the IdP's. The body is in: an IdP that sends
    its headers at once and then trickles or stalls its body is slow, not the gateway
    (``tests/unit/test_wire.py``). The deadline layer makes one per call and hands it down in
    :attr:`ReviewContext.wire`; a backend passes it with each request it sends
    (``backends.transports.on_the_wire``)."""

    __slots__ = ("calls", "pending", "requests", "seconds", "unread", "unread_within")

    def __init__(self, unread_within: Callable[[float, float], float] | None = None) -> None:
        #: Requests handed to the transport, and those answered.
        self.requests = 0
        self.calls = 0
        #: When the unanswered request's I/O began (its TCP connect, or its write on a
        #: pooled connection); None when every request so far was answered.
        self.pending: float | None = None
        self.seconds = 0.0
        #: Of ``seconds``, how long answers may have sat unread: ``unread_within(sent,
        #: answered)`` (``time.perf_counter``), asked the moment each answer is read (the
        #: caller knows its own delays). An upper bound: the answer came in at some
        #: point of the caller's delay, not necessarily at its start.
        self.unread = 0.0
        self.unread_within = unread_within

    def add(self, sent: float, answered: float) -> None:
        taken = answered - sent
        self.calls += 1
        self.seconds += taken
        if self.unread_within is not None:
            self.unread += min(taken, self.unread_within(sent, answered))
