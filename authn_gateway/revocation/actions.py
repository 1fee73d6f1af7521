"""Operator actions on identities: evict, deny, lift, list. What the admin API calls.

Each action is applied on this replica first (so it holds even when Redis is
down), then announced to the fleet. Each answer says how far it reached: the
entries dropped here and in the shared tier, where a denial is stored, and whether
the other replicas were told.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from authn_gateway.observe.metrics import Metrics
from authn_gateway.revocation.bus import Bus, Event
from authn_gateway.revocation.denylist import DenyList
from authn_gateway.revocation.eviction import Evicted, Evictor
from authn_gateway.revocation.metrics import RevocationMetrics
from authn_gateway.revocation.subject import Subject
from authn_gateway.tasks import STOP_PATIENCE, cancel_and_wait

log = logging.getLogger(__name__)

#: Called after each action with (action, subject, caller, answer): audit log and metrics.
ActionHook = Callable[[str, Subject, str, dict[str, Any]], None]


class Revocations:
    def __init__(
        self,
        deny_list: DenyList,
        evictor: Evictor,
        bus: Bus,
        origin: str,
        *,
        sync_seconds: float = 1.0,
        on_action: ActionHook | None = None,
        metrics: Metrics | None = None,
    ) -> None:
        self.deny_list = deny_list
        self.evictor = evictor
        self.bus = bus
        self.origin = origin
        self.sync_seconds = sync_seconds
        self._on_action = on_action
        self._metrics = metrics.group(RevocationMetrics) if metrics is not None else None
        self._sync: asyncio.Task[None] | None = None
        bus.subscribe(self._received)

    async def evict(self, subject: Subject, by: str) -> dict[str, Any]:
        evicted = await self.evictor.evict(subject)
        self._count_eviction(subject, "admin", evicted)
        told = await self.bus.publish(Event("evict", subject, self.origin))
        answer = {
            "evicted": subject.to_json(),
            "local_entries": evicted.local,
            "shared_entries": evicted.shared,
            "fleet": told,
        }
        self._done("evict", subject, by, answer)
        return answer

    async def deny(self, subject: Subject, seconds: float, by: str) -> dict[str, Any]:
        entry, stored = await self.deny_list.add(subject, seconds, by)
        told = await self.bus.publish(Event("deny", subject, self.origin))
        answer = {
            "denied": subject.to_json(),
            "seconds": seconds,
            "until": round(entry.until, 3),
            "stored_in": self.deny_list.store.where if stored else "memory",
            "fleet": told,
        }
        self._done("deny", subject, by, answer)
        return answer

    async def lift(self, subject: Subject, by: str) -> dict[str, Any]:
        was_denied, stored = await self.deny_list.lift(subject)
        told = await self.bus.publish(Event("lift", subject, self.origin))
        answer = {
            "lifted": subject.to_json(),
            "was_denied": was_denied,
            "stored_in": self.deny_list.store.where if stored else "memory",
            "fleet": told,
        }
        self._done("lift", subject, by, answer)
        return answer

    def listing(self, now: float) -> dict[str, Any]:
        return {
            "entries": [e.public(now) for e in self.deny_list.entries()],
            "stored_in": self.deny_list.store.where,
        }

    async def start(self) -> None:
        await self.deny_list.refresh()
        await self.bus.start()
        self._sync = asyncio.get_running_loop().create_task(self._sync_forever())

    async def close(self) -> None:
        if self._sync is not None and not await cancel_and_wait(self._sync, STOP_PATIENCE):
            log.warning("deny list: the refresh loop did not stop; left behind")
        await self.bus.close()

    async def _received(self, event: Event) -> None:
        if event.op == "evict":
            evicted = await self.evictor.evict(event.subject)
            self._count_eviction(event.subject, "fleet", evicted)
        else:
            await self.deny_list.refresh()

    async def _sync_forever(self) -> None:
        while True:
            await asyncio.sleep(self.sync_seconds)
            try:
                await self.deny_list.refresh()
                if self._metrics is not None:
                    self._metrics.deny_entries.set(len(self.deny_list.entries()))
            except Exception:
                log.exception("deny list: refresh failed")

    def _count_eviction(self, subject: Subject, source: str, evicted: Evicted) -> None:
        if self._metrics is None:
            return
        self._metrics.evictions.labels(subject.kind, source).inc()
        self._metrics.evicted_entries.labels("local").inc(evicted.local)
        if evicted.shared:
            self._metrics.evicted_entries.labels("shared").inc(evicted.shared)

    def _done(self, action: str, subject: Subject, by: str, answer: dict[str, Any]) -> None:
        # Whom: "user:mallory" or "token:3f2a9c01b7de" (a token's id, never the token).
        log.warning("admin: %s %s by %s", action, subject.key, by)
        if self._metrics is not None:
            self._metrics.admin_actions.labels(action).inc()
            self._metrics.deny_entries.set(len(self.deny_list.entries()))
        if self._on_action is not None:
            self._on_action(action, subject, by, answer)
