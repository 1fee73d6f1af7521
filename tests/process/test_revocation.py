"""The deny list, the eviction bus and operator actions, over memory, a file and real Redis."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from authn_gateway.config import RedisSettings
from authn_gateway.fleet.redis_link import RedisLink
from authn_gateway.keyed_hashes import TokenHasher
from authn_gateway.layers.cache.memory import MemoryStore
from authn_gateway.layers.cache.redis import EntryCodec, TieredCacheStore
from authn_gateway.observe.metrics import Metrics
from authn_gateway.revocation import subject as subjects
from authn_gateway.revocation.actions import Revocations
from authn_gateway.revocation.denylist import DenyList, DenyStore
from authn_gateway.revocation.eviction import Evictor
from authn_gateway.revocation.memory import FileDenyStore, MemoryDenyStore
from authn_gateway.revocation.redis import RedisBus, RedisDenyStore, reader_client
from backends.base import CREDENTIAL_ID_KEY, UserInfo
from tests.support.redis_server import RedisServer
from tests.support.revocation_helpers import ALICE, LEAKED, TOKEN, Clock, Tier, entry


@pytest.fixture(scope="module")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path_factory.mktemp("redis")).start()
    yield server
    server.stop()


def redis_settings(server: RedisServer, prefix: str = "t") -> RedisSettings:
    return RedisSettings(url=server.url, key_prefix=prefix, timeout_seconds=0.5, retry_seconds=0.2)


@pytest.fixture
async def link(
    redis_server: RedisServer, request: pytest.FixtureRequest
) -> AsyncIterator[RedisLink]:
    # A prefix per test keeps tests apart on the one server.
    link = RedisLink(redis_settings(redis_server, prefix=f"t{id(request)}"), Metrics())
    await link.start()
    yield link
    await link.close()


def make_store(kind: str, tmp_path: Path, link: RedisLink, clock: Clock) -> DenyStore:
    if kind == "memory":
        return MemoryDenyStore(clock)
    if kind == "file":
        return FileDenyStore(tmp_path / "deny.json", clock)
    return RedisDenyStore(link, clock)


@pytest.mark.parametrize("kind", ["memory", "file", "redis"])
async def test_a_denied_user_is_refused_and_others_are_not(
    kind: str, tmp_path: Path, link: RedisLink
) -> None:
    clock = Clock()
    deny = DenyList(make_store(kind, tmp_path, link, clock), clock)
    assert not deny.denies_user("alice")
    _, stored = await deny.add(ALICE, 60, by="ops")
    assert stored
    assert deny.denies_user("alice")
    assert not deny.denies_user("bob")
    assert not deny.denies_token(lambda: ("0123456789ab",))


@pytest.mark.parametrize("kind", ["memory", "file", "redis"])
async def test_a_denied_credential_refuses_the_answers_carrying_it_only(
    kind: str, tmp_path: Path, link: RedisLink
) -> None:
    clock = Clock()
    deny = DenyList(make_store(kind, tmp_path, link, clock), clock)
    leaked = UserInfo("alice", extra={CREDENTIAL_ID_KEY: ("JTI=7f3c2a-leaked",)})
    other = UserInfo("alice", extra={CREDENTIAL_ID_KEY: ("JTI=other",)})
    assert not deny.denies_credential(leaked)
    await deny.add(LEAKED, 60, by="ops")
    assert deny.denies_credential(leaked)
    assert not deny.denies_credential(other)
    assert not deny.denies_credential(UserInfo("alice"))
    assert not deny.denies_user("alice")  # the user's other tokens keep working
    restarted = DenyList(make_store(kind, tmp_path, link, clock), clock)
    await restarted.refresh()
    assert restarted.denies_credential(leaked) == (kind != "memory")


@pytest.mark.parametrize("kind", ["memory", "file", "redis"])
async def test_a_denial_ends_after_its_seconds(kind: str, tmp_path: Path, link: RedisLink) -> None:
    clock = Clock()
    deny = DenyList(make_store(kind, tmp_path, link, clock), clock)
    await deny.add(TOKEN, 30, by="ops")
    clock.now += 29
    assert deny.denies_token(lambda: ("0123456789ab",))
    clock.now += 2
    assert not deny.denies_token(lambda: ("0123456789ab",))
    await deny.refresh()
    assert deny.entries() == []


@pytest.mark.parametrize("kind", ["memory", "file", "redis"])
async def test_a_lifted_denial_no_longer_refuses(
    kind: str, tmp_path: Path, link: RedisLink
) -> None:
    clock = Clock()
    deny = DenyList(make_store(kind, tmp_path, link, clock), clock)
    await deny.add(ALICE, 60, by="ops")
    assert await deny.lift(ALICE) == (True, True)
    assert not deny.denies_user("alice")
    await deny.refresh()
    assert not deny.denies_user("alice")
    assert await deny.lift(ALICE) == (False, True)


@pytest.mark.parametrize("kind", ["file", "redis"])
async def test_a_denial_survives_a_restart(kind: str, tmp_path: Path, link: RedisLink) -> None:
    clock = Clock()
    await DenyList(make_store(kind, tmp_path, link, clock), clock).add(TOKEN, 60, by="ops")
    restarted = DenyList(make_store(kind, tmp_path, link, clock), clock)
    assert not restarted.denies_token(lambda: ("0123456789ab",))
    await restarted.refresh()
    assert restarted.denies_token(lambda: ("0123456789ab",))
    [entry] = restarted.entries()
    assert (entry.subject, entry.by) == (TOKEN, "ops")


@pytest.mark.parametrize("kind", ["file", "redis"])
async def test_a_token_denied_under_a_previous_secret_is_denied_under_the_current_one_too(
    kind: str, tmp_path: Path, link: RedisLink
) -> None:
    # Issue 29, finding 8: the check used the current secret's id only, so a rotation
    # ended every token-id denial while the listing still showed it.
    old, new = TokenHasher(b"old" * 11), TokenHasher(b"new" * 11, previous=[b"old" * 11])
    token = "the-leaked-token"
    assert new.token_ids(token) == (new.token_id(token), old.token_id(token))
    clock = Clock()
    before = DenyList(make_store(kind, tmp_path, link, clock), clock)
    await before.add(subjects.token_id(old.token_id(token)), 600, by="ops")
    clock.now += 10

    after = DenyList(make_store(kind, tmp_path, link, clock), clock)  # a replica on the new secret
    await after.refresh()
    assert not after.denies_token(lambda: (new.token_id(token),))  # the current id alone
    assert after.denies_token(lambda: new.token_ids(token))
    assert not after.denies_token(lambda: new.token_ids("another-token"))
    # Carried to the current id, with the same end: it holds once the old secret is gone.
    assert after.denies_token(lambda: (new.token_id(token),))
    carried = {e.subject.value: e for e in after.entries()}
    assert carried[new.token_id(token)].until == carried[old.token_id(token)].until
    await after.refresh()  # and written to the store, for the other replicas
    third = DenyList(make_store(kind, tmp_path, link, clock), clock)
    await third.refresh()
    assert third.denies_token(lambda: (new.token_id(token),))
    clock.now += 600
    assert not third.denies_token(lambda: (new.token_id(token),))


async def test_malformed_redis_entries_are_skipped(link: RedisLink) -> None:
    await link.client.hset(link.key("deny"), "user:mallory", b"{junk")
    deny = DenyList(RedisDenyStore(link))
    await deny.add(ALICE, 60, by="ops")
    await deny.refresh()
    assert [e.subject for e in deny.entries()] == [ALICE]


async def test_a_denial_survives_redis_losing_its_data_and_a_lift_is_not_undone(
    link: RedisLink,
) -> None:
    # Found by the chaos runner (seed 1218, issue 32): after a FLUSHALL (or a Redis
    # restart without persistence) every replica loaded an empty list and served the
    # denied user again. The replicas that knew the denial write it back.
    one, two = DenyList(RedisDenyStore(link)), DenyList(RedisDenyStore(link))
    await one.add(ALICE, 60, by="ops")
    await one.add(subjects.user("bob"), 60, by="ops")
    await two.refresh()
    assert two.denies_user("alice")
    await link.client.flushdb()
    await two.refresh()
    assert two.denies_user("alice") and two.denies_user("bob")
    started_after = DenyList(RedisDenyStore(link))  # a pod started after the loss
    await started_after.refresh()
    assert started_after.denies_user("alice") and started_after.denies_user("bob")
    # A lift removes one entry, never the marker: it is not taken for a loss.
    await one.lift(ALICE)
    await two.refresh()
    await one.refresh()
    assert not two.denies_user("alice") and not one.denies_user("alice")
    assert two.denies_user("bob")


async def test_a_denial_made_while_redis_is_down_reaches_redis_when_it_is_back(
    tmp_path: Path,
) -> None:
    server = RedisServer(tmp_path)
    settings = RedisSettings(url=server.url, timeout_seconds=0.2, retry_seconds=0.1)
    link = RedisLink(settings, Metrics())
    try:
        deny = DenyList(RedisDenyStore(link))
        _, stored = await deny.add(ALICE, 60, by="ops")
        assert not stored
        assert deny.denies_user("alice")
        server.start()
        for _ in range(50):
            if link.shared:
                break
            await asyncio.sleep(0.1)
        await deny.refresh()
        other = DenyList(RedisDenyStore(link))
        await other.refresh()
        assert other.denies_user("alice")
    finally:
        await link.close()
        server.stop()


async def replica(link: RedisLink, name: str, tier: Tier, actions: list[Any]) -> Revocations:
    reader = reader_client(link.settings, block_seconds=0.5)
    bus = RedisBus(link, reader, origin=name, block_seconds=0.5, retry_seconds=0.1)
    evictor = Evictor(guard_seconds=5.0)
    evictor.add_tier(tier)
    revocations = Revocations(
        DenyList(RedisDenyStore(link)),
        evictor,
        bus,
        name,
        sync_seconds=3600,  # only the bus can carry changes in these tests
        on_action=lambda *a: actions.append(a),
    )
    await revocations.start()
    return revocations


async def eventually(check: Any, seconds: float = 1.0) -> None:
    loop = asyncio.get_running_loop()
    end = loop.time() + seconds
    while not check():
        assert loop.time() < end, "not within the time allowed"
        await asyncio.sleep(0.02)


async def test_an_eviction_reaches_the_other_replica_within_a_second(link: RedisLink) -> None:
    tier_a = Tier(("alice", "aaaaaaaaaaaa"), ("bob", "bbbbbbbbbbbb"))
    tier_b = Tier(("alice", "aaaaaaaaaaaa"), ("alice", "cccccccccccc"), ("bob", "bbbbbbbbbbbb"))
    actions: list[Any] = []
    a = await replica(link, "a", tier_a, actions)
    b = await replica(link, "b", tier_b, [])
    try:
        answer = await a.evict(ALICE, by="ops")
        assert answer == {
            "evicted": {"user": "alice"},
            "local_entries": 1,
            "shared_entries": None,
            "fleet": True,
        }
        await eventually(lambda: tier_b.answers == [("bob", "bbbbbbbbbbbb")])
        assert tier_a.answers == [("bob", "bbbbbbbbbbbb")]
        assert [(x[0], x[1], x[2]) for x in actions] == [("evict", ALICE, "ops")]
    finally:
        await a.close()
        await b.close()


async def test_a_replica_does_not_apply_its_own_event_twice(link: RedisLink) -> None:
    tier = Tier(("alice", "aaaaaaaaaaaa"))
    a = await replica(link, "a", tier, [])
    try:
        await a.evict(ALICE, by="ops")
        await asyncio.sleep(0.7)  # longer than one blocking read
        assert tier.shared_calls == 1
    finally:
        await a.close()


async def test_a_denial_and_its_lifting_reach_the_other_replica(link: RedisLink) -> None:
    a = await replica(link, "a", Tier(), [])
    b = await replica(link, "b", Tier(), [])
    try:
        answer = await a.deny(TOKEN, 120, by="ops")
        assert answer["stored_in"] == "redis" and answer["fleet"] is True
        await eventually(lambda: b.deny_list.denies_token(lambda: ("0123456789ab",)))
        lifted = await b.lift(TOKEN, by="ops2")
        assert lifted["was_denied"] is True
        await eventually(lambda: not a.deny_list.denies_token(lambda: ("0123456789ab",)))
        assert [e["token_id"] for e in a.listing(0)["entries"]] == []
    finally:
        await a.close()
        await b.close()


async def test_malformed_events_on_the_stream_are_skipped(link: RedisLink) -> None:
    tier = Tier(("alice", "aaaaaaaaaaaa"))
    b = await replica(link, "b", tier, [])
    try:
        stream = link.key("revocations")
        await link.client.xadd(stream, {"op": "explode", "subject": "user:alice", "origin": "x"})
        await link.client.xadd(stream, {"op": "evict", "subject": "nobody", "origin": "x"})
        await link.client.xadd(stream, {"op": "evict", "subject": "user:alice", "origin": "x"})
        await eventually(lambda: tier.answers == [])
    finally:
        await b.close()


class LosesTheCancellation:
    """A stream reader whose blocking read turns the first cancellation into a timeout,
    as redis-py's can when the cancellation lands as its own read timeout fires (seen
    as a test whose close() never returned)."""

    def __init__(self) -> None:
        self.reads = 0
        self.lost = 0
        self.closed = False

    async def xrevrange(self, key: str, count: int) -> list[Any]:
        return []

    async def xread(self, streams: dict[str, str], block: int, count: int) -> None:
        self.reads += 1
        try:
            await asyncio.sleep(block / 1000)
        except asyncio.CancelledError:
            if self.lost:
                raise
            self.lost += 1
            raise TimeoutError("read timed out") from None

    async def aclose(self) -> None:
        self.closed = True


async def test_close_ends_when_the_reader_loses_the_cancellation(link: RedisLink) -> None:
    reader = LosesTheCancellation()
    bus = RedisBus(link, reader, origin="a", block_seconds=0.5, retry_seconds=0.1)
    await bus.start()
    await asyncio.sleep(0.1)  # the loop is in its first blocking read
    async with asyncio.timeout(5.0):
        await bus.close()
    assert (reader.reads, reader.lost, reader.closed) == (1, 1, True)


async def test_the_shared_tier_drops_entries_through_its_index_and_skips_negatives(
    link: RedisLink,
) -> None:
    hasher = TokenHasher(b"k")
    writer = TieredCacheStore(MemoryStore(100), link, EntryCodec(hasher), Metrics())
    reader = TieredCacheStore(MemoryStore(100), link, EntryCodec(hasher), Metrics())
    await writer.put(b"k1", entry("alice", "aaaaaaaaaaaa"))
    await writer.put(b"k2", entry("bob", "bbbbbbbbbbbb"))
    await writer.put(b"k3", entry(None, "dddddddddddd"))
    assert await link.client.exists(link.key("idx", "token", "dddddddddddd")) == 0
    assert await reader.evict_shared(ALICE) == 1
    assert await reader.get(b"k1") is None  # gone from Redis: another replica cannot find it
    assert (await reader.get(b"k2")) is not None
    assert await writer.evict_local(ALICE) == 1
    ttl = await link.client.pttl(link.key("idx", "user", "bob"))
    assert 0 < ttl <= 600_000


async def test_the_shared_tier_drops_a_credentials_entries_through_its_index(
    link: RedisLink,
) -> None:
    hasher = TokenHasher(b"k")
    writer = TieredCacheStore(MemoryStore(100), link, EntryCodec(hasher), Metrics())
    reader = TieredCacheStore(MemoryStore(100), link, EntryCodec(hasher), Metrics())
    await writer.put(b"k1", entry("alice", "aaaaaaaaaaaa", "JTI=7f3c2a-leaked"))
    await writer.put(b"k2", entry("alice", "bbbbbbbbbbbb", "JTI=other"))
    assert await reader.evict_shared(LEAKED) == 1
    assert await reader.get(b"k1") is None
    assert await reader.get(b"k2") is not None
    assert await writer.evict_local(LEAKED) == 1
