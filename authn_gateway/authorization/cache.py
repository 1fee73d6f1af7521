"""Decisions kept, as kube-apiserver's webhook authorizer keeps them.

kube-apiserver caches each answer by its request's spec, in an LRU of 8192 entries
(``cache.NewLRUExpireCache(8192)``), an allowed answer for ``authorizedTTL`` and any
other for ``unauthorizedTTL`` (``--authorization-webhook-cache-authorized-ttl``, 5m,
and ``-unauthorized-ttl``, 30s; webhook.go, ``Authorize``). This is the same kind of
cache on the gateway's side: an LRU with the same two TTLs, bounded by its own count
(``authorization.cache.max_entries``, 10,000 per process by default: more distinct
reviews than kube's 8192, docs/decisions.md), keyed by a keyed hash of the whole request
body: kube-apiserver serializes a spec the same way each time, and the body is all a
decision reads, so one body has one answer while the policy stands. Each entry is a
16-byte key and a reference to an answer the policy rendered once, whatever the body's
size; a change of policy empties it (:meth:`DecisionCache.clear`).

Answers given because no decision could be made are never kept: the next review after
the policy is back is decided by it.
"""

from __future__ import annotations

import secrets
import time
from collections import OrderedDict
from collections.abc import Callable
from hashlib import blake2b

from authn_gateway.authorization.rules import ALLOWED


class DecisionCache:
    def __init__(
        self,
        max_entries: int,
        authorized_ttl: float,
        unauthorized_ttl: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.max_entries = max_entries
        self._ttl = {True: authorized_ttl, False: unauthorized_ttl}
        self._clock = clock
        # Per process: nothing outside it can aim two bodies at one entry.
        self._key = secrets.token_bytes(32)
        # key -> (expires at, apiVersion, answer kind, answer body)
        self._entries: OrderedDict[bytes, tuple[float, str, str, bytes]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def key(self, body: bytes) -> bytes:
        return blake2b(body, key=self._key, digest_size=16).digest()

    def get(self, key: bytes) -> tuple[str, str, bytes] | None:
        """(apiVersion, kind, body) of the answer kept for ``key``, or None (absent or
        expired)."""
        entry = self._entries.get(key)
        if entry is None:
            return None
        if entry[0] <= self._clock():
            del self._entries[key]
            return None
        self._entries.move_to_end(key)
        return entry[1], entry[2], entry[3]

    def put(self, key: bytes, api_version: str, kind: str, body: bytes) -> None:
        ttl = self._ttl[kind == ALLOWED]
        if ttl <= 0 or self.max_entries <= 0:
            return
        entries = self._entries
        entries[key] = (self._clock() + ttl, api_version, kind, body)
        entries.move_to_end(key)
        while len(entries) > self.max_entries:
            entries.popitem(last=False)

    def clear(self) -> None:
        self._entries.clear()
