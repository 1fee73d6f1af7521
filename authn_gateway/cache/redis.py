"""The shared cache tier: a local LRU in front of Redis, with signed entries.

Hot hits never leave the process (a Redis GET costs ~40-100 us of CPU, more than
a whole cached review). Redis is read on a local miss or when the local entry is
no longer fresh, and written on every cacheable backend answer, with the entry's
remaining lifetime as its TTL, so a new or restarted replica starts warm.

Refusals cannot crowd identities out of Redis either (with ``allkeys-lru`` a full
Redis evicts whatever was used least recently): at most ``max_negative_entries``
refusals are written per minute, fleet-wide, each living at most a minute there, so at
most twice that many are ever stored. Past the budget a refusal stays in the local tier
only, and the flood is counted in ``authn_gateway_cache_negatives_unshared_total``.

Write access to Redis must not let anyone mint an identity. Each value is
``HMAC(secret, key || payload) || payload``; binding the key stops an attacker
from copying a valid entry under the key of a token they hold. Values that do not
verify are ignored, counted and logged. Keys are keyed hashes; values carry no token.
"""

from __future__ import annotations

import hmac
import logging
import time
from collections.abc import Callable
from typing import Any

import orjson

from backends.base import Authenticated, Rejected, UserInfo
from backends.flight import SingleFlight

from ..keys import TokenHasher
from ..metrics import Metrics
from ..redis_link import RedisLink
from ..revocation.subject import Subject
from .memory import MemoryStore
from .policy import CacheEntry

log = logging.getLogger(__name__)

SIGNATURE_BYTES = 32
# Refusals live at most this long in Redis, and their write budget renews this often.
NEGATIVE_WINDOW_SECONDS = 60.0


class EntryCodec:
    def __init__(self, hasher: TokenHasher) -> None:
        self._hasher = hasher

    def encode(self, key: bytes, entry: CacheEntry) -> bytes:
        outcome = entry.outcome
        doc: dict[str, Any] = {"f": entry.fresh_until, "s": entry.stale_until, "t": entry.token_id}
        if entry.keep_until:
            # Added in issue 18: how long the entry is kept. Replicas of the previous
            # version ignore it and serve stale up to "s", as they always did.
            doc["l"] = entry.keep_until
        if isinstance(outcome, Authenticated):
            user = outcome.user
            doc.update(
                k="a",
                u=user.username,
                i=user.uid,
                g=list(user.groups),
                x={k: list(v) for k, v in user.extra.items()},
                e=outcome.expires_at,
            )
        else:
            doc.update(k="r", r=outcome.reason)
        payload = orjson.dumps(doc)
        return self._hasher.sign(key + payload) + payload

    def decode(self, key: bytes, raw: bytes) -> CacheEntry | None:
        """The entry, or None when the value is unsigned, tampered or malformed."""
        signature, payload = raw[:SIGNATURE_BYTES], raw[SIGNATURE_BYTES:]
        if len(signature) != SIGNATURE_BYTES or not hmac.compare_digest(
            signature, self._hasher.sign(key + payload)
        ):
            return None
        try:
            doc = orjson.loads(payload)
            outcome: Authenticated | Rejected
            if doc["k"] == "a":
                user = UserInfo(
                    doc["u"], doc["i"], tuple(doc["g"]), {k: tuple(v) for k, v in doc["x"].items()}
                )
                outcome = Authenticated(user, doc["e"])
            else:
                outcome = Rejected(doc["r"])
            token_id = doc.get("t")
            return CacheEntry(
                outcome,
                float(doc["f"]),
                float(doc["s"]),
                token_id if isinstance(token_id, str) else None,
                # Absent in entries from the previous version: kept until "s".
                keep_until=float(doc.get("l", 0.0)),
            )
        except (ValueError, KeyError, TypeError):
            # Signed by us but unreadable: a newer version's format, never attacker input.
            return None


class TieredCacheStore:
    def __init__(
        self,
        local: MemoryStore,
        link: RedisLink,
        codec: EntryCodec,
        metrics: Metrics,
        clock: Callable[[], float] = time.time,
        max_negative_entries: int = 50_000,
    ) -> None:
        self._local = local
        self._max_negative = max_negative_entries
        self._link = link
        self._codec = codec
        self._metrics = metrics
        self._clock = clock
        self._reads: SingleFlight[CacheEntry | None] = SingleFlight()

    def __len__(self) -> int:
        return len(self._local)

    def _redis_key(self, key: bytes) -> str:
        return self._link.key("cache", key.hex())

    def peek(self, key: bytes, now: float) -> CacheEntry | None:
        return self._local.get_now(key, now)

    async def get(self, key: bytes) -> CacheEntry | None:
        now = self._clock()
        entry = self._local.get_now(key, now)
        if entry is not None and now < entry.fresh_until:
            return entry
        remote = await self.get_shared(key)
        if remote is None or remote.kept_until <= now:
            return entry
        if entry is None or remote.fresh_until > entry.fresh_until:
            self._local.put_now(key, remote)
            return remote
        return entry

    async def recheck(self, key: bytes) -> CacheEntry | None:
        entry = await self.get_shared(key)
        if entry is None or self._clock() >= entry.fresh_until:
            return None
        self._local.put_now(key, entry)
        return entry

    async def get_shared(self, key: bytes) -> CacheEntry | None:
        """The entry in Redis only, verified; None when absent, bad or Redis is down."""
        if not self._link.shared:
            return None
        # A burst of reviews of one cold token makes one Redis read, not one each.
        return await self._reads.do(key, lambda: self._fetch(key))

    async def _fetch(self, key: bytes) -> CacheEntry | None:
        redis_key = self._redis_key(key)
        raw = await self._link.either("cache_get", lambda r: r.get(redis_key), lambda: None)
        if raw is None:
            return None
        entry = self._codec.decode(key, raw)
        if entry is None:
            self._metrics.cache_tampered_entries.inc()
            log.warning(
                "redis: ignored a cache entry that fails its signature check (key %s)",
                key.hex()[:12],
            )
        return entry

    async def put(self, key: bytes, entry: CacheEntry) -> None:
        self._local.put_now(key, entry)
        now = self._clock()
        # Kept as long as a later raise of max_stale could still serve it (kept_until).
        ttl_ms = int((entry.kept_until - now) * 1000)
        if ttl_ms <= 0 or not self._link.shared:
            return
        if not entry.positive:
            ttl_ms = min(ttl_ms, int(NEGATIVE_WINDOW_SECONDS * 1000))
            if not await self._negative_budget(now):
                self._metrics.cache_negatives_unshared.inc()
                return
        value = self._codec.encode(key, entry)
        redis_key = self._redis_key(key)
        indexes = self._indexes(entry)

        async def write(r: Any) -> Any:
            # One round trip; not a transaction (keys in a Redis Cluster live on many nodes).
            pipe = r.pipeline(transaction=False)
            pipe.set(redis_key, value, px=ttl_ms)
            for index in indexes:
                pipe.sadd(index, redis_key)
                # NX sets a TTL on a new set; GT lengthens it for a longer-lived entry.
                pipe.pexpire(index, ttl_ms, nx=True)
                pipe.pexpire(index, ttl_ms, gt=True)
            return await pipe.execute()

        # If Redis is down the local tier has it; other replicas ask the IdP themselves.
        await self._link.best_effort("cache_set", write)

    async def _negative_budget(self, now: float) -> bool:
        """Whether one more refusal may go to Redis in this window (fleet-wide count)."""
        window = int(now // NEGATIVE_WINDOW_SECONDS)
        counter = self._link.key("cache-negatives", str(window))

        async def take(r: Any) -> int:
            async with r.pipeline(transaction=False) as pipe:
                pipe.incr(counter)
                pipe.expire(counter, int(2 * NEGATIVE_WINDOW_SECONDS))
                count, _ = await pipe.execute()
            return int(count)

        count = await self._link.best_effort("cache_negative_budget", take)
        return count is not None and count <= self._max_negative

    def _index_key(self, subject: Subject) -> str:
        return self._link.key("idx", subject.kind, subject.value)

    def _indexes(self, entry: CacheEntry) -> list[str]:
        """Positive entries only: a flood of invalid tokens must not grow the indexes."""
        keys: list[str] = []
        if not entry.positive:
            return keys
        if entry.username is not None:
            keys.append(self._index_key(Subject("user", entry.username)))
        if entry.token_id is not None:
            keys.append(self._index_key(Subject("token", entry.token_id)))
        return keys

    async def evict_local(self, subject: Subject) -> int:
        return await self._local.evict_local(subject)

    async def evict_shared(self, subject: Subject) -> int | None:
        """Delete every shared entry about ``subject`` (found through its index set)."""
        index = self._index_key(subject)

        async def evict(r: Any) -> int | None:
            members = await r.smembers(index)
            pipe = r.pipeline(transaction=False)
            for member in members:
                pipe.delete(member)
            pipe.delete(index)
            results = await pipe.execute()
            return int(sum(results[:-1]))

        return await self._link.either("cache_evict", evict, lambda: None)
