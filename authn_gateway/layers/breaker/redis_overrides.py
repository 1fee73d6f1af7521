"""The fleet's operator overrides of the breakers (:mod:`.override`): one expiring Redis
key per backend, published on the breakers' channel and read by the same poll
(:mod:`.redis_sync`), so a ``force-open`` on one replica holds on all of them within the
same bound as an opened breaker."""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from authn_gateway.fleet.redis_link import RedisDown, RedisLink, lua_script
from authn_gateway.layers.breaker.override import Forced, Override, renewed
from authn_gateway.layers.breaker.redis import FleetKeys, decoded

log = logging.getLogger(__name__)

OVERRIDE = lua_script(__package__, "override.lua")


class RedisOverrides:
    """The fleet's operator overrides: one expiring Redis key per backend, and this
    replica's mirror of them (kept up by the published messages and the poll), which
    the review path reads without I/O.

    With Redis unreachable an override is set in the mirror only, and written to Redis
    when it answers again: an operator can still shed a failing IdP during a Redis
    outage, and the fleet gets the override once it can.
    """

    def __init__(
        self,
        link: RedisLink,
        spawn: Callable[[Awaitable[Any]], None],
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._link = link
        self._spawn = spawn
        self._clock = clock
        self.channel = link.key("breaker-events")
        self._mirror: dict[str, Forced] = {}
        # Set while Redis was unreachable, not yet written: the mirror's word wins.
        self._unshared: set[str] = set()
        link.on_resume(self._resumed)

    def current(self, backend: str) -> Forced | None:
        forced = self._mirror.get(backend)
        return forced if forced is not None and forced.active(self._clock()) else None

    def adopt(self, backend: str, forced: Forced | None) -> None:
        """Take the fleet's override (from a message, the poll or a script's answer)."""
        if backend in self._unshared:
            return
        old = self.current(backend)
        if forced is None:
            self._mirror.pop(backend, None)
        else:
            if old is not None and old.override is forced.override and not forced.by:
                forced = Forced(forced.override, forced.since, forced.expires_at, old.by)
            self._mirror[backend] = forced
        new = self.current(backend)
        if (old.override if old else None) != (new.override if new else None):
            log.warning(
                "breaker %s: operator override %s (fleet)",
                backend,
                new.override.value if new is not None else "released",
            )

    async def put(self, backend: str, override: Override, seconds: float, by: str) -> bool:
        key = FleetKeys.of(self._link, backend).override
        try:
            reply = await self._link.script(
                "breaker_override",
                OVERRIDE,
                [key],
                [override.value, seconds, by, self.channel, backend],
            )
        except RedisDown:
            self._set_locally(backend, override, seconds, by)
            return False
        self._unshared.discard(backend)
        self.adopt(backend, forced_from(decoded(reply[0]), reply[1], reply[2], by))
        return True

    def _set_locally(self, backend: str, override: Override, seconds: float, by: str) -> None:
        self._unshared.add(backend)
        if override is Override.NONE:
            self._mirror.pop(backend, None)
        else:
            now = self._clock()
            self._mirror[backend] = renewed(self.current(backend), override, now, seconds, by)
        log.warning(
            "breaker %s: operator override %s on this replica only (Redis unreachable); "
            "it is written for the fleet when Redis answers",
            backend,
            override.value,
        )

    async def read(self, backend: str) -> Forced | None:
        key = FleetKeys.of(self._link, backend).override
        try:
            fields = await self._link.run(
                "breaker_override_read",
                lambda r: r.hmget(key, "override", "since", "expires_at", "by"),
            )
        except RedisDown:
            return self.current(backend)
        forced = forced_fields(fields)
        return forced if forced is not None and forced.active(self._clock()) else None

    def _resumed(self) -> None:
        for backend in list(self._unshared):
            forced = self._mirror.get(backend)
            if forced is None or not forced.active(self._clock()):
                self._spawn(self.put(backend, Override.NONE, 0, ""))
            else:
                remaining = forced.expires_at - self._clock()
                self._spawn(self.put(backend, forced.override, remaining, forced.by))


def forced_from(override: str, since: Any, expires_at: Any, by: str = "") -> Forced | None:
    try:
        kind = Override(override)
        forced = Forced(kind, float(decoded(since)), float(decoded(expires_at)), by)
    except ValueError:
        return None  # not ours, or written by a newer version: no override
    return forced if kind is not Override.NONE else None


def forced_fields(fields: list[Any]) -> Forced | None:
    """An override hash's (override, since, expires_at, by), None when absent."""
    override, since, expires_at, by = fields
    if override is None or since is None or expires_at is None:
        return None
    return forced_from(decoded(override), since, expires_at, decoded(by) if by is not None else "")
