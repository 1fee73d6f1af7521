"""Small values a backend shares with the other replicas of a fleet.

The gateway hands a backend one of these in fleet mode (Redis); without Redis a
backend has none and keeps everything local. Values are signed by the gateway (a
tampered value reads as missing), and every call degrades rather than fails: when
Redis is down, ``get`` gives None and ``claim`` gives True, so each replica falls
back to acting alone.
"""

from __future__ import annotations

from typing import Protocol


class SharedBlobs(Protocol):
    async def get(self, name: str) -> bytes | None:
        """The value last put under ``name``, if any, still valid and correctly signed."""
        ...

    async def put(self, name: str, value: bytes, ttl_seconds: float) -> None:
        """Store ``value`` for ``ttl_seconds``; best effort."""
        ...

    async def claim(self, name: str, ttl_seconds: float) -> bool:
        """True for exactly one replica per ``ttl_seconds`` (True for all if Redis is down)."""
        ...
