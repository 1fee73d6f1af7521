"""Backends' fleet-shared values (:class:`backends.shared.SharedBlobs`) in Redis.

Each value is stored as ``signature + payload`` under the backend's own key space,
signed with the gateway secret like cache entries, so a value written by anything
but a replica reads as missing. Redis trouble never fails a caller: reads give
None, claims give True (each replica then acts alone, as without Redis).
"""

from __future__ import annotations

import hmac
import os
from typing import Any

from .keys import TokenHasher
from .redis_link import RedisDown, RedisLink

SIGNATURE_BYTES = 32


class RedisSharedBlobs:
    def __init__(self, link: RedisLink, hasher: TokenHasher, backend: str) -> None:
        self._link = link
        self._hasher = hasher
        self._backend = backend
        # Identifies this replica's claims in Redis (for operators reading the keys).
        self._replica = os.urandom(8).hex()

    def _key(self, name: str) -> str:
        return self._link.key("shared", self._backend, name)

    def _signed(self, name: str, payload: bytes) -> bytes:
        # The name is signed too: a value cannot be moved to another key or backend.
        return self._hasher.sign(f"{self._backend}\0{name}\0".encode() + payload)

    async def get(self, name: str) -> bytes | None:
        key = self._key(name)

        async def read(r: Any) -> bytes | None:
            value: bytes | None = await r.get(key)
            return value

        try:
            raw = await self._link.run("shared_get", read)
        except RedisDown:
            return None
        if raw is None or len(raw) < SIGNATURE_BYTES:
            return None
        signature, payload = raw[:SIGNATURE_BYTES], raw[SIGNATURE_BYTES:]
        if not hmac.compare_digest(signature, self._signed(name, payload)):
            return None
        return payload

    async def put(self, name: str, value: bytes, ttl_seconds: float) -> None:
        key, blob = self._key(name), self._signed(name, value) + value
        ttl_ms = max(1, int(ttl_seconds * 1000))
        await self._link.best_effort("shared_put", lambda r: r.set(key, blob, px=ttl_ms))

    async def claim(self, name: str, ttl_seconds: float) -> bool:
        key, ttl_ms = self._key(name), max(1, int(ttl_seconds * 1000))

        async def take(r: Any) -> bool:
            return bool(await r.set(key, self._replica, nx=True, px=ttl_ms))

        try:
            return await self._link.run("shared_claim", take)
        except RedisDown:
            return True
