"""Backends' fleet-shared values (:class:`backends.shared.SharedBlobs`) in Redis.

Each value is sealed (:mod:`.sealing`: key id, signature, payload) under the backend's
own key space, signed with the gateway secret like cache entries, so a value written by
anything but a replica reads as missing; during a secret rotation a value signed with
one of ``previous_secrets`` still reads. Redis trouble never fails a caller: reads give
None, claims give True (each replica then acts alone, as without Redis).
"""

from __future__ import annotations

import os
from typing import Any

from authn_gateway.fleet.redis_link import RedisDown, RedisLink
from authn_gateway.fleet.sealing import seal, unseal
from authn_gateway.keyed_hashes import TokenHasher
from backends.durations import whole_ms


class RedisSharedBlobs:
    def __init__(self, link: RedisLink, hasher: TokenHasher, backend: str) -> None:
        self._link = link
        self._hasher = hasher
        self._backend = backend
        # Identifies this replica's claims in Redis (for operators reading the keys).
        self._replica = os.urandom(8).hex()

    def _key(self, name: str) -> str:
        return self._link.key("shared", self._backend, name)

    def _context(self, name: str) -> bytes:
        # The name is signed too: a value cannot be moved to another key or backend.
        return f"{self._backend}\0{name}\0".encode()

    async def get(self, name: str) -> bytes | None:
        key = self._key(name)

        async def read(r: Any) -> bytes | None:
            value: bytes | None = await r.get(key)
            return value

        try:
            raw = await self._link.run("shared_get", read)
        except RedisDown:
            return None
        if raw is None:
            return None
        return unseal(self._hasher, self._context(name), raw)

    async def put(self, name: str, value: bytes, ttl_seconds: float) -> None:
        key, blob = self._key(name), seal(self._hasher, self._context(name), value)
        ttl_ms = whole_ms(ttl_seconds)
        await self._link.best_effort("shared_put", lambda r: r.set(key, blob, px=ttl_ms))

    async def claim(self, name: str, ttl_seconds: float) -> bool:
        key, ttl_ms = self._key(name), whole_ms(ttl_seconds)

        async def take(r: Any) -> bool:
            return bool(await r.set(key, self._replica, nx=True, px=ttl_ms))

        try:
            return await self._link.run("shared_claim", take)
        except RedisDown:
            return True
