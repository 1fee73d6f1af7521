"""The review cache's in-process store: two bounded LRUs (identities, refusals) with
per-entry expiry.

Not cachetools: this is the cache-hit path, and an OrderedDict lookup with the
caller's clock reading costs ~0.1 us where ``TLRUCache[key]`` costs ~0.3 us and reads
its own timer (docs/decisions.md).
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator

from authn_gateway.layers.cache.policy import CacheEntry, PreviousKeys
from authn_gateway.revocation.subject import Subject
from backends.base import Authenticated

# Entries examined between two yields to the event loop during an eviction.
EVICTION_SLICE = 5000


class MemoryStore:
    """Two bounded LRUs: identities, and refusals with a capacity of their own.

    A refusal never pushes out an identity, so a flood of random tokens (each one a
    refusal, or no entry at all) cannot evict a known user. A positive entry leaves
    only when its own lifetime ends (``kept_until``), when newer identities fill
    ``max_entries``, when its user has ``max_entries_per_user`` newer ones (so one
    account's many tokens push out only its own), or when the IdP refuses that same
    token later (the refusal replaces it). Expired entries are dropped when met or
    pushed out by size.
    """

    def __init__(
        self,
        max_entries: int,
        max_negative_entries: int | None = None,
        clock: Callable[[], float] = time.time,
        max_entries_per_user: int | None = None,
        on_user_capped: Callable[[], None] | None = None,
    ) -> None:
        self._max = max_entries
        self._max_negative = max_negative_entries or max_entries
        self._clock = clock
        self._positive: OrderedDict[bytes, CacheEntry] = OrderedDict()
        self._negative: OrderedDict[bytes, CacheEntry] = OrderedDict()
        # One user's identities, oldest written first: a user who mints token after
        # token (any Keystone user can; GitLab users make access tokens at will) pushes
        # out their own oldest past this many, never the other users'.
        self._per_user_max = max_entries_per_user or max_entries
        # A user's one key as it is, or an insertion-ordered dict of several: most users
        # have one token at a time, and a dict costs ~230 B (an OrderedDict ~400 B more).
        self._by_user: dict[str, bytes | dict[bytes, None]] = {}
        self._on_user_capped = on_user_capped

    def get_now(self, key: bytes, now: float) -> CacheEntry | None:
        segment = self._positive
        entry = segment.get(key)
        if entry is None:
            segment = self._negative
            entry = segment.get(key)
            if entry is None:
                return None
        if entry.kept_until <= now:
            del segment[key]
            self._unindex(key, entry)
            return None
        segment.move_to_end(key)
        return entry

    def put_now(self, key: bytes, entry: CacheEntry) -> bool:
        """Store ``entry``; True if it pushed out an older identity of the same user
        (the user holds ``max_entries_per_user``)."""
        # One entry per key: the newer answer wins.
        old = self._positive.pop(key, None)
        if old is not None:
            self._unindex(key, old)
        self._negative.pop(key, None)
        if not entry.positive:
            self._negative[key] = entry
            while len(self._negative) > self._max_negative:
                self._negative.popitem(last=False)
            return False
        user = entry.username or ""
        self._positive[key] = entry
        held = self._by_user.get(user)
        if held is None or held == key:
            self._by_user[user] = key
        elif isinstance(held, bytes):
            self._by_user[user] = {held: None, key: None}
        else:
            held[key] = None
        # The LRU first: the user's own bound acts only where it is the tighter one.
        while len(self._positive) > self._max:
            pushed, gone = self._positive.popitem(last=False)
            self._unindex(pushed, gone)
        keys = self._by_user.get(user)
        capped = False
        while isinstance(keys, dict) and len(keys) > self._per_user_max:
            oldest = next(iter(keys))
            del keys[oldest]
            self._positive.pop(oldest, None)
            capped = True
            if self._on_user_capped is not None:
                self._on_user_capped()
        return capped

    def _unindex(self, key: bytes, entry: CacheEntry) -> None:
        user = entry.username
        if user is None:
            return
        held = self._by_user.get(user)
        if isinstance(held, bytes):
            if held == key:
                del self._by_user[user]
        elif held is not None:
            held.pop(key, None)
            if not held:
                del self._by_user[user]

    def peek(self, key: bytes, now: float) -> CacheEntry | None:
        return self.get_now(key, now)

    async def get(self, key: bytes, previous: PreviousKeys | None = None) -> CacheEntry | None:
        return self.get_now(key, self._clock())  # one process, one secret: no previous keys

    async def put(self, key: bytes, entry: CacheEntry) -> None:
        self.put_now(key, entry)

    def __len__(self) -> int:
        return len(self._positive) + len(self._negative)

    async def recheck(self, key: bytes) -> CacheEntry | None:
        return None  # no other process writes here

    def live_identities(self, clock: Callable[[], float]) -> Iterator[tuple[bytes, CacheEntry]]:
        """Identities within their lifetime, most recently used first, without touching
        the LRU order. Walks a snapshot of the keys (one list, ~1 ms per 100 000), so the
        caller may await between items; entries gone by the time they are reached are
        skipped."""
        for key in list(reversed(self._positive)):
            entry = self._positive.get(key)
            if entry is not None and entry.kept_until > clock():
                yield key, entry

    async def evict_local(self, subject: Subject) -> int:
        """Drop every entry about ``subject``: a scan, in slices with the event loop let
        run between them, so reviews are not held up. An index would cost every cache
        write and ~100 bytes per entry for what is a rare operator's action; the scan
        costs ~0.3 us per entry (docs/decisions.md, issue 17)."""
        kind = subject.kind
        by_token = kind == "token"
        # A username or a credential id is only ever in an identity; a token id may be
        # in either segment.
        segments = (self._positive, self._negative) if by_token else (self._positive,)
        value, dropped = subject.value, 0
        for data in segments:
            # Keys only: one list, not 100 000 tuples for the garbage collector to walk.
            keys = list(data)
            doomed: list[bytes] = []
            for start in range(0, len(keys), EVICTION_SLICE):
                for key in keys[start : start + EVICTION_SLICE]:
                    e = data.get(key)
                    if e is None:
                        continue
                    if by_token:
                        if e.token_id == value:
                            doomed.append(key)
                    elif type(o := e.outcome) is Authenticated and (
                        o.user.username == value
                        if kind == "user"
                        else value in o.user.credential_ids
                    ):
                        doomed.append(key)
                await asyncio.sleep(0)
            for key in doomed:
                gone = data.pop(key, None)
                if gone is not None:
                    self._unindex(key, gone)
                    dropped += 1
        return dropped

    async def evict_shared(self, subject: Subject) -> int | None:
        return None  # no shared tier
