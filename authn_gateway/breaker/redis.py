"""The breaker's fleet state in Redis: shared open/half-open/closed state, fleet-wide
probe permits, and the loop that reads other replicas' transitions.

* pybreaker's storage keeps a local copy, so ``admit()`` never waits on Redis. Local
  transitions are written to a Redis hash (newest wins, by time) and every replica
  reads the hashes every ``breaker_sync_seconds``. Failure counts stay per replica;
  the open/half-open/closed state is the fleet's.
* Half-open probes: a Redis sorted-set semaphore with expiring members, so K probes in
  total, and a dead probe's permit frees itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import pybreaker

from ..redis_link import REPLICA_ID, RedisDown, RedisLink, lua_script
from ..tasks import Background
from .memory import LocalProbePermits

BREAKER_WRITE = lua_script(__package__, "breaker_write.lua")
PROBE_ACQUIRE = lua_script(__package__, "probe_acquire.lua")


class SharedBreakerStorage(pybreaker.CircuitMemoryStorage):  # type: ignore[misc]
    """pybreaker storage: reads are local; state changes are published to Redis."""

    def __init__(self, backend: str, link: RedisLink, background: Background) -> None:
        super().__init__(pybreaker.STATE_CLOSED)
        self.key = link.key("breaker", backend)
        self._link = link
        self._background = background
        self.updated_at = 0.0
        self._write_pending = False

    @property
    def state(self) -> str:
        return str(self._state)

    @state.setter
    def state(self, state: str) -> None:
        self._state = state
        self._changed()

    @property
    def opened_at(self) -> datetime | None:
        return self._opened_at

    @opened_at.setter
    def opened_at(self, value: datetime) -> None:
        self._opened_at = value
        self._changed()

    def _changed(self) -> None:
        self.updated_at = time.time()
        if not self._write_pending:
            # open() sets opened_at then state: one write carries both.
            self._write_pending = True
            self._background.spawn(self.push())

    async def push(self) -> None:
        self._write_pending = False
        opened = self._opened_at.timestamp() if self._opened_at is not None else 0.0
        args = (self._state, repr(opened), repr(self.updated_at))
        with contextlib.suppress(RedisDown):
            await self._link.script("breaker_write", BREAKER_WRITE, [self.key], list(args))

    def apply_remote(self, fields: dict[bytes, bytes]) -> bool:
        """Adopt a newer state written by another replica; True if anything changed."""
        try:
            updated = float(fields[b"updated_at"])
            state = fields[b"state"].decode()
            opened = float(fields[b"opened_at"])
        except (KeyError, ValueError):
            return False
        if updated <= self.updated_at or state not in (
            pybreaker.STATE_CLOSED,
            pybreaker.STATE_OPEN,
            pybreaker.STATE_HALF_OPEN,
        ):
            return False
        self.updated_at = updated
        self._state = state
        self._opened_at = datetime.fromtimestamp(opened, UTC) if opened else None
        return True


class RedisProbePermits:
    def __init__(
        self, backend: str, limit: int, ttl: float, link: RedisLink, background: Background
    ) -> None:
        self._key = link.key("probes", backend)
        self._limit = limit
        self._ttl_ms = int(ttl * 1000)
        self._link = link
        self._background = background
        self._local = LocalProbePermits(limit)

    async def try_acquire(self) -> str | None:
        permit = f"{REPLICA_ID}-{secrets.token_hex(4)}"

        async def remote(r: Any) -> str | None:
            got = await self._link.script_on(
                r, PROBE_ACQUIRE, [self._key], [self._limit, self._ttl_ms, permit]
            )
            return permit if got == 1 else None

        return await self._link.either("probe_acquire", remote, self._local.acquire_now)

    def release(self, permit: str) -> None:
        if permit == "local":
            self._local.release(permit)
            return

        # If Redis is down the member expires on its own.
        self._background.spawn(
            self._link.best_effort("probe_release", lambda r: r.zrem(self._key, permit))
        )

    def spent(self, permit: str) -> None:
        # Keep the member until it expires: another replica may still see "half-open"
        # for up to one sync period after this probe reopened or closed the breaker, and
        # must not take a second probe in the meantime.
        if permit == "local":
            self._local.release(permit)


class BreakerSync:
    """Publishes this replica's breaker states and adopts newer ones from the others."""

    def __init__(self, link: RedisLink, background: Background, period: float) -> None:
        self._link = link
        self._background = background
        self._period = period
        self._breakers: dict[str, SharedBreakerStorage] = {}
        self._on_change: dict[str, Callable[[], object]] = {}
        self._task: asyncio.Task[None] | None = None
        link.on_resume(self._push_all)

    def storage(self, backend: str) -> SharedBreakerStorage:
        """The backend's storage; the same one again after a reload (its state carries on)."""
        storage = self._breakers.get(backend)
        if storage is None:
            storage = SharedBreakerStorage(backend, self._link, self._background)
            self._breakers[backend] = storage
        return storage

    def forget(self, backend: str) -> None:
        self._breakers.pop(backend, None)
        self._on_change.pop(backend, None)

    def watch(self, backend: str, refresh: Callable[[], object]) -> None:
        """``refresh`` is called when another replica changed this backend's breaker."""
        self._on_change[backend] = refresh

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._sync())

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()

    def _push_all(self) -> None:
        for storage in self._breakers.values():
            self._background.spawn(storage.push())

    async def _sync(self) -> None:
        while True:
            await asyncio.sleep(self._period)
            # Read each round: a reload may add or forget backends.
            storages = dict(self._breakers)
            names = list(storages)
            if not self._link.shared or not names:
                continue

            async def read(
                r: Any, names: list[str] = names, storages: dict[str, Any] = storages
            ) -> list[dict[bytes, bytes]]:
                pipe = r.pipeline(transaction=False)
                for name in names:
                    pipe.hgetall(storages[name].key)
                return list(await pipe.execute())

            try:
                states = await self._link.run("breaker_sync", read)
            except RedisDown:
                continue
            for name, fields in zip(names, states, strict=True):
                if storages[name].apply_remote(fields):
                    refresh = self._on_change.get(name)
                    if refresh is not None:
                        refresh()
