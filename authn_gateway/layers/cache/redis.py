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
``HMAC(secret, key || payload) || payload``, the payload naming the secret by its key
id (:mod:`..sealing`); binding the key stops an attacker from copying a valid entry
under the key of a token they hold. Values that do not verify are ignored, counted and
logged. Keys are keyed hashes; values carry no token.

Secret rotation (``previous_secrets``): keys are HMACs of the token, so a replica on
the new secret finds nothing under its own key for an entry an old-secret replica
wrote. Only then (a shared-tier miss, and only while ``previous_secrets`` is set) it
looks under each previous secret's key; an entry found there answers and is written
again under the current key, so each known user costs that extra read once.

Redis may lose entries (FLUSHALL, a memory-only restart, maxmemory). What it lost is
written back from the replicas' local tiers: all of it when sharing resumes or the
epoch marker changes, one identity when a read finds it missing (read-repair); see
:mod:`.repair`. The identities in Redis are counted through a sorted set of their keys
scored by expiry (``authn_gateway_shared_cache_identities``; docs/decisions.md).
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable, Iterable
from typing import Any

import orjson

from authn_gateway.fleet.redis_link import RedisLink
from authn_gateway.fleet.sealing import (
    document_fields,
    document_key_id,
    seal_document,
    unseal_document,
)
from authn_gateway.keyed_hashes import TokenHasher
from authn_gateway.layers.cache.memory import MemoryStore
from authn_gateway.layers.cache.metrics import CacheMetrics
from authn_gateway.layers.cache.policy import CacheEntry, PreviousKeys
from authn_gateway.layers.cache.repair import SharedTierRepair
from authn_gateway.observe.metrics import Metrics
from authn_gateway.revocation.subject import Subject, subjects_of
from backends.base import Authenticated, Rejected, UserInfo
from backends.durations import whole_ms
from backends.flight import SingleFlight

log = logging.getLogger(__name__)

# How long an eviction is remembered for reads of Redis that began before it: far past
# any Redis call's deadline (redis.timeout_seconds).
EVICTIONS_KEPT_SECONDS = 60.0
# Refusals live at most this long in Redis, and their write budget renews this often.
NEGATIVE_WINDOW_SECONDS = 60.0


class EntryCodec:
    def __init__(self, hasher: TokenHasher) -> None:
        self._hasher = hasher

    def encode(self, key: bytes, entry: CacheEntry) -> bytes:
        outcome = entry.outcome
        # The key id first (sealing.py); the previous version ignores it.
        doc: dict[str, Any] = {
            **document_fields(self._hasher),
            "f": entry.fresh_until,
            "s": entry.stale_until,
            "t": entry.token_id,
        }
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
        return seal_document(self._hasher, key, orjson.dumps(doc))

    def decode(
        self, key: bytes, raw: bytes, found_by: TokenHasher | None = None
    ) -> CacheEntry | None:
        """The entry, or None when the value is unsigned, tampered or malformed.

        ``found_by``: the (previous) secret whose key found it, which signed it if it
        predates key ids; default the current one."""
        payload = unseal_document(self._hasher, key, raw, legacy=found_by)
        if payload is None:
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
        write_back_per_second: int = 500,
        count_every_seconds: float = 15.0,
    ) -> None:
        self._local = local
        self._max_negative = max_negative_entries
        self._link = link
        self._codec = codec
        self._metrics = metrics.group(CacheMetrics)
        self._clock = clock
        self._reads: SingleFlight[CacheEntry | None] = SingleFlight()
        self._repair = SharedTierRepair(
            local,
            link,
            self._write,
            self._redis_key,
            metrics,
            clock,
            per_second=write_back_per_second,
            count_every_seconds=count_every_seconds,
        )
        self._live = self._repair.live_key
        # Subject key -> when this replica last evicted it (time.monotonic()), for reads
        # that were on their way meanwhile (EVICTIONS_KEPT_SECONDS).
        self._evictions: dict[str, float] = {}
        self._previous_found = self._metrics.previous_key_lookups.labels("found")
        self._previous_missing = self._metrics.previous_key_lookups.labels("missing")

    def __len__(self) -> int:
        return len(self._local)

    def _redis_key(self, key: bytes) -> str:
        return self._link.key("cache", key.hex())

    def peek(self, key: bytes, now: float) -> CacheEntry | None:
        return self._local.get_now(key, now)

    async def get(self, key: bytes, previous: PreviousKeys | None = None) -> CacheEntry | None:
        now = self._clock()
        entry = self._local.get_now(key, now)
        if entry is not None and now < entry.fresh_until:
            return entry
        asked = time.monotonic()
        remote = await self.get_shared(key)
        if remote is None and previous is not None and self._link.shared:
            remote = await self._get_previous(key, previous(), now, asked)
        # An eviction that ran while Redis was read: neither what was read nor what was
        # held is kept or served (taken into the local tier, it would outlive the
        # eviction here, and a write-back would spread it again).
        if self._evicted_since(remote, asked):
            remote = None
        if self._evicted_since(entry, asked):
            return None
        if remote is None and entry is not None:
            # A live identity here that Redis lost (FLUSHALL, maxmemory): put it back now,
            # so a pod that starts during an IdP outage finds it (repair.py).
            self._repair.missing(key, entry)
        if remote is None or remote.kept_until <= now:
            return entry
        if entry is None or remote.fresh_until > entry.fresh_until:
            self._local.put_now(key, remote)
            return remote
        return entry

    async def _get_previous(
        self, key: bytes, previous: list[tuple[bytes, TokenHasher]], now: float, asked: float
    ) -> CacheEntry | None:
        """The entry a replica on another secret wrote, re-written under ``key``."""
        for old_key, hasher in previous:
            found = await self._reads.do(old_key, functools.partial(self._fetch, old_key, hasher))
            if found is None or found.kept_until <= now or self._evicted_since(found, asked):
                continue
            self._previous_found.inc()
            # Under the current secret, unless a replica wrote a newer answer meanwhile.
            rewrite = functools.partial(self._write, items=[(key, found)], now=now, nx=True)
            await self._link.best_effort("cache_rotate", rewrite)
            return found
        self._previous_missing.inc()
        return None

    async def recheck(self, key: bytes) -> CacheEntry | None:
        asked = time.monotonic()
        entry = await self.get_shared(key)
        if entry is None or self._clock() >= entry.fresh_until:
            return None
        if self._evicted_since(entry, asked):
            return None
        self._local.put_now(key, entry)
        return entry

    async def get_shared(self, key: bytes) -> CacheEntry | None:
        """The entry in Redis only, verified; None when absent, bad or Redis is down."""
        if not self._link.shared:
            return None
        # A burst of reviews of one cold token makes one Redis read, not one each.
        return await self._reads.do(key, lambda: self._fetch(key))

    async def _fetch(self, key: bytes, found_by: TokenHasher | None = None) -> CacheEntry | None:
        redis_key = self._redis_key(key)
        raw = await self._link.either("cache_get", lambda r: r.get(redis_key), lambda: None)
        if raw is None:
            return None
        entry = self._codec.decode(key, raw, found_by)
        if entry is None:
            self._metrics.tampered_entries.inc()
            key_id = document_key_id(raw)
            log.warning(
                "redis: ignored a cache entry that fails its signature check (key %s%s)",
                key.hex()[:12],
                f", signed by key id {key_id.hex()}" if key_id is not None else "",
            )
        return entry

    def _ttl_ms(self, entry: CacheEntry, now: float) -> int:
        """The entry's remaining lifetime in Redis (refusals: at most the budget window).
        Kept as long as a later raise of max_stale could still serve it (kept_until)."""
        # Clamped: an entry read back from Redis may say anything its writer's config did.
        ttl_ms = whole_ms(entry.kept_until - now, at_least=0)
        if not entry.positive:
            ttl_ms = min(ttl_ms, int(NEGATIVE_WINDOW_SECONDS * 1000))
        return ttl_ms

    async def put(self, key: bytes, entry: CacheEntry) -> None:
        capped = self._local.put_now(key, entry)
        now = self._clock()
        if capped or self._ttl_ms(entry, now) <= 0 or not self._link.shared:
            # Capped: a user past cache.max_entries_per_user here. Their further tokens
            # stay local, so one account cannot fill Redis (maxmemory) either.
            return
        if not entry.positive and not await self._negative_budget(now):
            self._metrics.negatives_unshared.inc()
            return
        # If Redis is down the local tier has it; other replicas ask the IdP themselves.
        await self._link.best_effort(
            "cache_set", lambda r: self._write(r, [(key, entry)], now, nx=False)
        )

    async def _write(
        self, r: Any, items: list[tuple[bytes, CacheEntry]], now: float, nx: bool
    ) -> list[bool]:
        """Write ``items`` with their indexes; which ones were written. One round trip, or
        two with ``nx`` (indexes only for the entries written). Not a transaction, nor a
        script: keys in a Redis Cluster live on many nodes."""
        live = [(k, e, self._ttl_ms(e, now)) for k, e in items]
        live = [(k, e, ttl) for k, e, ttl in live if ttl > 0]
        if nx:
            pipe = r.pipeline(transaction=False)
            for key, entry, ttl_ms in live:
                pipe.set(self._redis_key(key), self._codec.encode(key, entry), px=ttl_ms, nx=True)
            written = [bool(done) for done in await pipe.execute()]
            to_index = [item for item, done in zip(live, written, strict=True) if done]
            if to_index:
                pipe = r.pipeline(transaction=False)
                self._index(pipe, to_index, now)
                await pipe.execute()
            return written
        pipe = r.pipeline(transaction=False)
        for key, entry, ttl_ms in live:
            pipe.set(self._redis_key(key), self._codec.encode(key, entry), px=ttl_ms)
        self._index(pipe, live, now)
        await pipe.execute()
        return [True] * len(live)

    def _index(self, pipe: Any, items: Iterable[tuple[bytes, CacheEntry, int]], now: float) -> None:
        for key, entry, ttl_ms in items:
            redis_key = self._redis_key(key)
            for index in self._indexes(entry):
                pipe.sadd(index, redis_key)
                # NX sets a TTL on a new set; GT lengthens it for a longer-lived entry.
                pipe.pexpire(index, ttl_ms, nx=True)
                pipe.pexpire(index, ttl_ms, gt=True)
            if entry.positive:
                # Scored by expiry, so that counting can drop the expired (count_shared).
                pipe.zadd(self._live, {key: int(now * 1000) + ttl_ms})
                pipe.pexpire(self._live, ttl_ms, nx=True)
                pipe.pexpire(self._live, ttl_ms, gt=True)

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

    # ---- what Redis lost: write-back, read-repair, the epoch marker (repair.py) ----

    async def write_back(self) -> int:
        return await self._repair.write_back()

    async def count_shared(self, notice_emptied: bool = True) -> int | None:
        return await self._repair.count_shared(notice_emptied)

    def start(self) -> None:
        self._repair.start()

    async def close(self) -> None:
        await self._repair.close()

    # ---- evictions ----

    def _index_key(self, subject: Subject) -> str:
        return self._link.key("idx", subject.kind, subject.value)

    def _indexes(self, entry: CacheEntry) -> list[str]:
        """Positive entries only: a flood of invalid tokens must not grow the indexes."""
        if not entry.positive:
            return []
        about = subjects_of(entry.username, entry.token_id, entry.credential_ids)
        return [self._index_key(s) for s in about]

    async def evict_local(self, subject: Subject) -> int:
        # Noted first: a Redis read already on its way must not bring the entry back.
        now = time.monotonic()
        recent = {k: t for k, t in self._evictions.items() if now - t < EVICTIONS_KEPT_SECONDS}
        recent[subject.key] = now
        self._evictions = recent
        return await self._local.evict_local(subject)

    def _evicted_since(self, entry: CacheEntry | None, asked: float) -> bool:
        """Whether an eviction here touched ``entry``'s user or token after ``asked``
        (time.monotonic()), when a read that found it began."""
        if entry is None or not self._evictions:
            return False
        for subject in subjects_of(entry.username, entry.token_id, entry.credential_ids):
            at = self._evictions.get(subject.key)
            if at is not None and at >= asked:
                return True
        return False

    async def evict_shared(self, subject: Subject) -> int | None:
        """Delete every shared entry about ``subject`` (found through its index set)."""
        index = self._index_key(subject)
        prefix = self._link.key("cache", "").encode()

        async def evict(r: Any) -> int | None:
            members = list(await r.smembers(index))
            pipe = r.pipeline(transaction=False)
            for member in members:
                pipe.delete(member)
            pipe.delete(index)
            counted = [k for m in members if (k := _cache_key_of(m, prefix)) is not None]
            if counted:
                pipe.zrem(self._live, *counted)
            results = await pipe.execute()
            return int(sum(results[: len(members)]))

        return await self._link.either("cache_evict", evict, lambda: None)


def _cache_key_of(member: bytes, prefix: bytes) -> bytes | None:
    """The cache key an index member (a Redis key) names; None if it names none."""
    try:
        return bytes.fromhex(member.removeprefix(prefix).decode())
    except (ValueError, UnicodeDecodeError):
        return None
