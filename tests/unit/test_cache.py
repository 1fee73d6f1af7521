"""Review cache policy: TTLs, expiry caps, negative jitter, stale window, LRU bound."""

from __future__ import annotations

import hashlib
import hmac

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from authn_gateway.keyed_hashes import TokenHasher
from authn_gateway.layers.cache import CacheEntry, MemoryStore, ReviewCache
from authn_gateway.layers.cache.redis import EntryCodec
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


def test_entries_past_their_keep_window_are_dropped_on_read() -> None:
    store = MemoryStore(10)
    cache = policy(positive_ttl_seconds=1, max_stale_seconds=1, keep_stale_seconds=5)
    entry = cache.entry_for(ALICE, NOW)
    assert entry is not None
    store.put_now(b"k", entry)
    # Past max_stale it is no longer servable, but kept: a raise could still reach it.
    assert cache.stale_limit(entry) == NOW + 2
    assert store.get_now(b"k", NOW + 2.5) is entry
    assert store.get_now(b"k", NOW + 6.5) is None
    assert len(store) == 0


def test_the_stale_limit_is_the_readers_config_not_the_writers() -> None:
    written = policy(positive_ttl_seconds=300, max_stale_seconds=60).entry_for(ALICE, NOW)
    assert written is not None
    assert written.keep_until == NOW + 300 + 86400  # keep_stale_seconds' default: a day
    raised = policy(positive_ttl_seconds=300, max_stale_seconds=7200)
    lowered = policy(positive_ttl_seconds=300, max_stale_seconds=10)
    assert raised.stale_limit(written) == NOW + 300 + 7200
    assert lowered.stale_limit(written) == NOW + 300 + 10
    assert policy(max_stale_seconds=0).stale_limit(written) == written.fresh_until


def test_a_raised_max_stale_stops_at_what_storage_kept_and_at_the_tokens_expiry() -> None:
    kept = policy(positive_ttl_seconds=300, max_stale_seconds=60, keep_stale_seconds=600)
    entry = kept.entry_for(ALICE, NOW)
    assert entry is not None
    raised = policy(positive_ttl_seconds=300, max_stale_seconds=3600)
    assert raised.stale_limit(entry) == NOW + 300 + 600
    expiring = Authenticated(UserInfo("alice"), expires_at=NOW + 400)
    entry = kept.entry_for(expiring, NOW)
    assert entry is not None
    assert entry.kept_until == NOW + 400
    assert raised.stale_limit(entry) == NOW + 400


def test_an_entry_from_the_previous_version_is_kept_until_its_stale_until() -> None:
    # The previous version's entries have no keep_until: their stale_until was their end.
    old = CacheEntry(ALICE, NOW + 300, NOW + 300 + 3600)
    assert old.kept_until == NOW + 300 + 3600
    assert policy(max_stale_seconds=7200).stale_limit(old) == NOW + 300 + 3600
    assert policy(max_stale_seconds=60).stale_limit(old) == NOW + 300 + 60


def test_a_refusal_is_never_servable_stale() -> None:
    cache = policy(negative_ttl_seconds=30)
    entry = cache.entry_for(Rejected("no"), NOW)
    assert entry is not None
    assert entry.kept_until == entry.fresh_until
    assert cache.stale_limit(entry) == 0.0


def test_max_stale_above_keep_stale_is_a_config_error_naming_both() -> None:
    with pytest.raises(ValueError, match="max_stale_seconds: 90000 is above keep_stale_seconds"):
        CacheSettings(max_stale_seconds=90000)
    assert CacheSettings(max_stale_seconds=90000, keep_stale_seconds=90000).max_stale_seconds


def test_cache_keys_depend_on_backend_token_audiences_and_secret() -> None:
    h = TokenHasher(b"secret")
    base = h.cache_key("idp", "tok", ())
    assert base == TokenHasher(b"secret").cache_key("idp", "tok", ())
    assert base != h.cache_key("other", "tok", ())
    assert base != h.cache_key("idp", "tok2", ())
    assert base != h.cache_key("idp", "tok", ("aud",))
    assert base != TokenHasher(b"other-secret").cache_key("idp", "tok", ())
    assert b"tok" not in base


@settings(max_examples=200, deadline=None)
@given(
    secret=st.binary(min_size=1, max_size=200),
    backend=st.text(max_size=20),
    token=st.text(max_size=300),
    audiences=st.lists(st.text(max_size=10), max_size=3),
    payload=st.binary(max_size=300),
)
def test_cache_keys_and_signatures_are_hmac_sha256_in_every_release(
    secret: bytes, backend: str, token: str, audiences: list[str], payload: bytes
) -> None:
    # Replicas of the previous release read and write the same Redis keys and entry
    # signatures: HMAC-SHA256 under the secret, however it is computed (secrets longer
    # than SHA-256's block included).
    hasher = TokenHasher(secret)
    message = f"review\0{backend}\0{token}\0{chr(0).join(audiences)}".encode()
    assert (
        hasher.cache_key(backend, token, tuple(audiences))
        == hmac.new(secret, message, hashlib.sha256).digest()
    )
    assert hasher.sign(payload) == hmac.new(secret, b"entry\0" + payload, hashlib.sha256).digest()


@pytest.mark.parametrize("token", ["q", "a-much-longer-token-value"])
def test_token_id_is_a_short_hash_not_the_token(token: str) -> None:
    hasher = TokenHasher(b"s")
    token_id = hasher.token_id(token)
    assert len(token_id) == 12
    assert token not in token_id
    # The same id on every call and in every release (operators deny and evict by it):
    # keyed BLAKE2b under the log key, however it is computed.
    log_key = hmac.new(b"s", b"log-id", hashlib.sha256).digest()
    assert token_id == hashlib.blake2b(token.encode(), key=log_key, digest_size=6).hexdigest()
    assert hasher.token_id(token) == token_id
    assert TokenHasher(b"other").token_id(token) != token_id


SIGNING = TokenHasher(b"codec-test-secret")

KEY = b"k" * 32


def previous_version_value(doc: dict[str, object]) -> bytes:
    """A value as the previous version wrote it: HMAC(secret, key || payload) || payload,
    the payload without "l"."""
    payload = orjson.dumps(doc)
    return SIGNING.sign(KEY + payload) + payload


def test_an_entry_written_by_the_previous_version_is_read_and_kept_until_its_s() -> None:
    doc = {"f": NOW + 300, "s": NOW + 3900, "t": "0123456789ab", "k": "a", "u": "alice"}
    doc |= {"i": "1", "g": ["dev"], "x": {}, "e": None}
    entry = EntryCodec(SIGNING).decode(KEY, previous_version_value(doc))
    assert entry is not None
    assert entry.outcome == Authenticated(UserInfo("alice", "1", ("dev",), {}))
    assert (entry.fresh_until, entry.stale_until, entry.token_id) == (
        NOW + 300,
        NOW + 3900,
        "0123456789ab",
    )
    assert entry.kept_until == NOW + 3900


def test_a_new_entry_carries_its_keep_time_and_still_the_previous_versions_fields() -> None:
    cache = policy(positive_ttl_seconds=300, max_stale_seconds=3600)
    entry = cache.entry_for(ALICE, NOW, "0123456789ab")
    assert entry is not None
    value = EntryCodec(SIGNING).encode(KEY, entry)
    assert EntryCodec(SIGNING).decode(KEY, value) == entry
    doc = orjson.loads(value[32:])
    # A replica of the previous version reads "f" and "s" (its stale limit) and
    # ignores the rest, so during a rolling upgrade it serves exactly as before.
    assert (doc["f"], doc["s"], doc["l"]) == (NOW + 300, NOW + 3900, NOW + 300 + 86400)


def test_a_refusal_is_written_without_a_keep_time() -> None:
    entry = policy().entry_for(Rejected("no"), NOW)
    assert entry is not None
    value = EntryCodec(SIGNING).encode(KEY, entry)
    assert "l" not in orjson.loads(value[32:])
    assert EntryCodec(SIGNING).decode(KEY, value) == entry
