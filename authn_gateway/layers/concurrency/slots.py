"""Slots for calls to one IdP under an adaptive limit, handed out by priority.

:class:`ConcurrencyLimiter` lets at most ``limit`` calls be in flight (the limit comes
from :class:`authn_gateway.vegas.VegasLimit`, fed by every finished call). When all
slots are taken, a call may wait, but never long and never in vain:

* a call would wait at most about the IdP's recent latency: if the line ahead of it
  already holds a full round of calls (``limit`` of them), its wait would be longer,
  and it is refused at once ("unavailable", with stale serving as usual);
* a call whose deadline would pass before it could be answered is refused at once; a
  waiter gives up when a slot could no longer let its call finish by its deadline,
  and a waiter whose review has given up is dropped, never sent;
* nobody waits while the limit has no latency measured yet or the IdP's last calls
  failed or timed out (waiting for a hung IdP only adds a call timeout);
* the line is fair between clusters (:mod:`.fair`): each cluster's waiters get slots
  in proportion to its weight, so one cluster's storm waits behind its own share; the
  cluster with the longest line for its weight is refused after one round ahead,
  another after two;
* within a cluster, calls with no fallback (a token never seen, nothing to serve
  stale) go first; calls that could be answered stale (refreshes) get a slot only when
  no call of the first kind of the same cluster waits.

Pure asyncio logic over an injected clock (event-loop time by default); no I/O.
"""

from __future__ import annotations

import asyncio
import enum
import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from authn_gateway.layers.concurrency.fair import FairLine, Priority
from authn_gateway.layers.concurrency.vegas import VegasLimit
from backends.context import DEFAULT_CLUSTER

__all__ = ["ConcurrencyLimiter", "Priority", "Refusal", "Slot"]


class Refusal(enum.Enum):
    FAILING = "failing"  # no latency measured yet, or recent calls failed: nobody waits
    QUEUE_FULL = "queue_full"  # a full round of calls already waits ahead
    DEADLINE = "deadline"  # the call could not be answered before its deadline
    WAITED = "waited"  # waited the IdP's recent latency and got no slot


@dataclass(slots=True)
class Slot:
    """One call's permission to go out. Give it back with :meth:`ConcurrencyLimiter.release`."""

    started: float
    in_flight: int  # calls in flight when this one was sent, itself included
    waited: float  # seconds spent waiting for the slot
    done: bool = False


@dataclass(slots=True)
class _Waiter:
    future: asyncio.Future[Slot | None]
    queued_at: float
    deadline: float


class ConcurrencyLimiter:
    def __init__(
        self,
        limit: VegasLimit,
        clock: Callable[[], float] | None = None,
        weights: Mapping[str, float] | None = None,
    ) -> None:
        self.algorithm = limit
        self._clock = clock
        self.in_flight = 0
        #: Each cluster's weight (``clusters:``); a cluster not named weighs 1.
        self._line: FairLine[_Waiter] = FairLine(weights)
        self.refused: dict[Refusal, int] = {r: 0 for r in Refusal}

    def _now(self) -> float:
        if self._clock is not None:
            return self._clock()
        try:
            return asyncio.get_running_loop().time()
        except RuntimeError:
            return time.monotonic()

    @property
    def limit(self) -> int:
        return self.algorithm.limit

    def waiting(self, priority: Priority | None = None, cluster: str | None = None) -> int:
        return self._line.waiting(priority, cluster)

    def would_wait(self, priority: Priority, cluster: str = DEFAULT_CLUSTER) -> bool:
        """Whether a call of this priority and cluster would not get a slot right now."""
        return self.in_flight >= self.limit or self._line.ahead(cluster, priority) > 0

    def try_acquire(
        self, priority: Priority = Priority.NO_FALLBACK, cluster: str = DEFAULT_CLUSTER
    ) -> Slot | None:
        """A slot now if one is free and nobody the fair order puts first waits."""
        if self.in_flight >= self.limit or self._line.ahead(cluster, priority):
            return None
        self._line.charge(cluster)
        return self._grant(self._now(), waited=0.0)

    async def acquire(
        self, priority: Priority, deadline: float, cluster: str = DEFAULT_CLUSTER
    ) -> Slot | Refusal:
        """A slot, after a short wait if needed; else why not. ``deadline`` is in the
        limiter's clock (event-loop time)."""
        slot = self.try_acquire(priority, cluster)
        if slot is not None:
            return slot
        now = self._now()
        if not self.algorithm.healthy:
            # Waiting is only worth it for an IdP that answers: not one that times out
            # (a hang would hold every waiter for a full call timeout more).
            return self._refuse(Refusal.FAILING)
        rtt = self.algorithm.recent_rtt
        # In the fair order: a storming cluster's line is full long before another's.
        # The cluster with the longest line (for its weight: the one storming, or the
        # only one) waits one round at most; another may wait two, so that a burst of
        # its logins under its share is not refused for the storm's sake.
        ahead = self._line.ahead(cluster, priority)
        rounds = 1 if self._line.longest(cluster) else 2
        if ahead >= rounds * self.limit:
            return self._refuse(Refusal.QUEUE_FULL)
        # Rounds of `limit` calls ahead, each about one recent latency, then its own call.
        if rtt is not None and now + rtt * (math.floor(ahead / self.limit) + 1) > deadline:
            return self._refuse(Refusal.DEADLINE)
        # Past this, a slot would come too late for the call to finish by the deadline.
        give_up = deadline if rtt is None else deadline - rtt
        future: asyncio.Future[Slot | None] = asyncio.get_running_loop().create_future()
        waiter = _Waiter(future, now, deadline)
        self._line.add(cluster, priority, waiter)
        try:
            async with asyncio.timeout_at(give_up) if self._clock is None else _no_timeout():
                granted = await future
        except TimeoutError:
            granted = None
        finally:
            if not future.done():
                future.cancel()
            self._line.remove(cluster, priority, waiter)
        if granted is None:
            # Handed a slot at the very moment we gave up: give it back.
            late = future.result() if future.done() and not future.cancelled() else None
            if late is not None:
                self.release(late, rtt=None)
            return self._refuse(Refusal.WAITED)
        return granted

    def release(self, slot: Slot, rtt: float | None, dropped: bool = False) -> None:
        """The call is over. ``rtt`` None: it was never sent (no sample)."""
        if slot.done:
            return
        slot.done = True
        self.in_flight -= 1
        if rtt is not None:
            # The share of its slot's time the call spent at the IdP (Little's law: of
            # the calls in flight, the IdP held that share).
            held = self._now() - slot.started
            share = min(1.0, rtt / held) if held > 0 else 1.0
            self.algorithm.sample(rtt, slot.in_flight, dropped, slot.in_flight * share, held)
        self._dispatch()

    def expire(self) -> None:
        """Drop waiters whose deadline passed (for injected clocks; the event loop's
        timers do this on their own)."""
        now = self._now()
        rtt = self.algorithm.recent_rtt or 0.0
        for waiter in list(self._line):
            if waiter.deadline - rtt <= now and not waiter.future.done():
                waiter.future.set_result(None)
        self._dispatch()

    def _dispatch(self) -> None:
        now = self._now()
        line = self._line
        while line.count and self.in_flight < self.limit:
            popped = line.pop()
            if popped is None:
                return
            cluster, waiter = popped
            if waiter.future.done():
                continue
            if waiter.deadline <= now:
                # Its review has given up: never send the call (and charge nobody).
                waiter.future.set_result(None)
                continue
            line.charge(cluster)
            waiter.future.set_result(self._grant(now, waited=now - waiter.queued_at))

    def _grant(self, now: float, waited: float) -> Slot:
        self.in_flight += 1
        return Slot(started=now, in_flight=self.in_flight, waited=waited)

    def _refuse(self, why: Refusal) -> Refusal:
        self.refused[why] += 1
        return why


class _no_timeout:
    """With an injected clock, waits end through :meth:`ConcurrencyLimiter.expire`."""

    async def __aenter__(self) -> None:
        return None

    async def __aexit__(self, *exc: object) -> None:
        return None
