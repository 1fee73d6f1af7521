"""Eviction: drop every cached answer about a user, a token or a credential, in every tier.

A tier is anything holding cached answers (:class:`EvictableTier`): the in-process
LRU of each replica, and the shared Redis tier. The replica that is asked evicts
from its local tier and the shared one, then tells the others over the bus; each
of them evicts from its local tier (and the shared one again, which is cheap and
catches an entry another replica wrote in between).

A review already asking the IdP when the eviction arrives must not write its
answer back, nor fall back on the entry that was just evicted: :meth:`Evictor.evicted_since`
tells the cache layer so, for ``guard_seconds`` after each eviction.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from authn_gateway.revocation.subject import Subject, subjects_of


class EvictableTier(Protocol):
    async def evict_local(self, subject: Subject) -> int:
        """Drop matching entries held in this process; how many."""
        ...

    async def evict_shared(self, subject: Subject) -> int | None:
        """Drop matching entries in the shared tier; None when there is none or it is down."""
        ...


@dataclass(frozen=True, slots=True)
class Evicted:
    local: int
    # None: no shared tier, or it could not be reached.
    shared: int | None


class Evictor:
    def __init__(self, guard_seconds: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.guard_seconds = guard_seconds
        self._clock = clock
        self._tiers: list[EvictableTier] = []
        # subject key -> when it was evicted here (monotonic), for guard_seconds.
        self._recent: dict[str, float] = {}

    def add_tier(self, tier: EvictableTier) -> None:
        if all(t is not tier for t in self._tiers):
            self._tiers.append(tier)

    async def evict(self, subject: Subject, *, shared: bool = True) -> Evicted:
        now = self._clock()
        self._recent = {k: t for k, t in self._recent.items() if now - t < self.guard_seconds}
        self._recent[subject.key] = now
        local = sum([await tier.evict_local(subject) for tier in self._tiers])
        if not shared:
            return Evicted(local, None)
        counts = [await tier.evict_shared(subject) for tier in self._tiers]
        known = [c for c in counts if c is not None]
        return Evicted(local, sum(known) if known else None)

    def evicted_since(
        self,
        username: str | None,
        token_id: str | None,
        started: float,
        credentials: tuple[str, ...] = (),
    ) -> bool:
        """Whether this user, token or credential was evicted after ``started`` (this
        clock's time)."""
        if not self._recent:
            return False
        for subject in subjects_of(username, token_id, credentials):
            at = self._recent.get(subject.key)
            if at is not None and at >= started:
                return True
        return False

    def now(self) -> float:
        return self._clock()
