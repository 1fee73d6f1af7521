"""Review cache policy: TTLs, expiry caps, negative jitter, stale window, LRU bound."""

from __future__ import annotations

import pytest

from authn_gateway.cache import MemoryStore, ReviewCache
from authn_gateway.keys import TokenHasher
from backends.base import Authenticated, Rejected, Unavailable, UserInfo
from backends.settings import CacheSettings

NOW = 1_000_000.0
ALICE = Authenticated(UserInfo("alice"))


def policy(**kw: float) -> ReviewCache:
    return ReviewCache(CacheSettings(**kw), MemoryStore(100))


def test_positive_entry_lives_for_positive_ttl_then_max_stale() -> None:
    entry = policy(positive_ttl_seconds=300, max_stale_seconds=3600).entry_for(ALICE, NOW)
    assert entry is not None
    assert entry.fresh_until == NOW + 300
    assert entry.stale_until == NOW + 300 + 3600


def test_token_expiry_caps_fresh_and_stale_lifetimes() -> None:
    expiring = Authenticated(UserInfo("alice"), expires_at=NOW + 60)
    entry = policy(positive_ttl_seconds=300, max_stale_seconds=3600).entry_for(expiring, NOW)
    assert entry is not None
    assert entry.fresh_until == NOW + 60
    assert entry.stale_until == NOW + 60


def test_already_expired_token_is_not_cached() -> None:
    expired = Authenticated(UserInfo("alice"), expires_at=NOW - 1)
    assert policy().entry_for(expired, NOW) is None


def test_max_stale_zero_disables_stale_serving() -> None:
    entry = policy(positive_ttl_seconds=10, max_stale_seconds=0).entry_for(ALICE, NOW)
    assert entry is not None
    assert entry.stale_until == entry.fresh_until


def test_negative_entries_are_jittered_and_never_stale() -> None:
    cache = policy(negative_ttl_seconds=30, negative_jitter=0.1)
    lifetimes = set()
    for _ in range(50):
        entry = cache.entry_for(Rejected("no"), NOW)
        assert entry is not None
        assert 27 <= entry.fresh_until - NOW <= 33
        assert entry.stale_until == entry.fresh_until
        lifetimes.add(entry.fresh_until)
    assert len(lifetimes) > 10


def test_unavailable_is_never_cached() -> None:
    assert policy().entry_for(Unavailable("down"), NOW) is None


def test_zero_ttls_disable_caching() -> None:
    cache = policy(positive_ttl_seconds=0, negative_ttl_seconds=0)
    assert cache.entry_for(ALICE, NOW) is None
    assert cache.entry_for(Rejected("no"), NOW) is None


def test_lru_evicts_least_recently_used() -> None:
    clock = [NOW]
    store = MemoryStore(2, clock=lambda: clock[0])
    cache = ReviewCache(CacheSettings(), store)
    for key in (b"a", b"b"):
        entry = cache.entry_for(ALICE, NOW)
        assert entry is not None
        store.put_now(key, entry)
    assert store.get_now(b"a", NOW) is not None  # a is now most recent
    entry = cache.entry_for(ALICE, NOW)
    assert entry is not None
    store.put_now(b"c", entry)
    assert len(store) == 2
    assert store.get_now(b"b", NOW) is None
    assert store.get_now(b"a", NOW) is not None


def test_entries_past_stale_window_are_dropped_on_read() -> None:
    store = MemoryStore(10)
    entry = policy(positive_ttl_seconds=1, max_stale_seconds=1).entry_for(ALICE, NOW)
    assert entry is not None
    store.put_now(b"k", entry)
    assert store.get_now(b"k", NOW + 1.5) is entry
    assert store.get_now(b"k", NOW + 2.5) is None
    assert len(store) == 0


def test_cache_keys_depend_on_backend_token_audiences_and_secret() -> None:
    h = TokenHasher(b"secret")
    base = h.cache_key("idp", "tok", ())
    assert base == TokenHasher(b"secret").cache_key("idp", "tok", ())
    assert base != h.cache_key("other", "tok", ())
    assert base != h.cache_key("idp", "tok2", ())
    assert base != h.cache_key("idp", "tok", ("aud",))
    assert base != TokenHasher(b"other-secret").cache_key("idp", "tok", ())
    assert b"tok" not in base


@pytest.mark.parametrize("token", ["q", "a-much-longer-token-value"])
def test_token_id_is_a_short_hash_not_the_token(token: str) -> None:
    token_id = TokenHasher(b"s").token_id(token)
    assert len(token_id) == 12
    assert token not in token_id
