"""Issue 13's attacks, on real processes: what anyone who can send a bearer token can
do must never count as the IdP failing, nor stop known users from being served.

Each attack runs against a real ``authn-gateway serve`` in front of the real IdP
(OpenLDAP's slapd) or the fake one that follows the IdP's API (userinfo, GitLab), and
asserts on the IdP's own counters and on the breaker. Each then shows the two things
users care about: a token the gateway has never seen still authenticates, with one
call to the IdP, and a known user is still served stale while the IdP is down.
"""

from __future__ import annotations

import asyncio
import time

import pytest
import yaml

from authn_gateway.config import parse_config
from authn_gateway.layers.breaker import Breaker, LocalProbePermits
from authn_gateway.layers.cache.memory import MemoryStore
from authn_gateway.layers.cache.policy import CacheEntry
from authn_gateway.serve.gateway import Gateway
from backends.base import (
    Authenticated,
    Backend,
    InternalError,
    Outcome,
    Rejected,
    Unavailable,
    UserInfo,
)
from backends.context import WireTime
from backends.userinfo import UserinfoBackend, UserinfoSettings
from tests.support.fakes.idp import FakeIdP
from tests.support.hostile_helpers import NON_ASCII, cached


async def test_userinfo_backend_refuses_an_unsendable_token_at_its_edge(fake_idp: FakeIdP) -> None:
    # Behind the pipeline could_accept already refuses it; the backend on its own too.
    backend = UserinfoBackend(UserinfoSettings(name="idp", type="userinfo", url=fake_idp.url))
    try:
        for token in NON_ASCII:
            outcome = await backend.authenticate(token)
            assert outcome == Rejected(
                "token cannot be sent in an HTTP header (not visible ASCII)", "unsendable"
            )
        assert isinstance(await backend.authenticate("good-alice"), Authenticated)
    finally:
        await backend.close()
    assert fake_idp.calls == 1


def test_the_per_user_bound_follows_every_way_an_identity_leaves() -> None:
    # An identity replaced by a refusal, expired, or evicted no longer counts towards
    # its user's bound: the user's later tokens are not pushed out on its account.
    clock = [1000.0]
    capped: list[int] = []
    store = MemoryStore(
        100, clock=lambda: clock[0], max_entries_per_user=2, on_user_capped=lambda: capped.append(1)
    )

    def identity(user: str, ttl: float = 60) -> CacheEntry:
        return CacheEntry(Authenticated(UserInfo(user)), clock[0] + ttl, clock[0] + ttl)

    def key(n: int) -> bytes:
        return n.to_bytes(32, "big")

    store.put_now(key(1), identity("m"))
    store.put_now(key(2), identity("m", ttl=5))
    store.put_now(key(1), CacheEntry(Rejected("revoked"), clock[0] + 60, clock[0] + 60))
    clock[0] += 10
    assert store.get_now(key(2), clock[0]) is None  # expired
    store.put_now(key(3), identity("m"))
    store.put_now(key(4), identity("m"))
    assert capped == []  # keys 1 and 2 left on their own
    store.put_now(key(5), identity("m"))
    assert capped == [1]
    assert [store.get_now(key(n), clock[0]) is not None for n in (3, 4, 5)] == [False, True, True]
    # The same token answered again is one identity, not two.
    store.put_now(key(5), identity("m"))
    assert capped == [1] and store.get_now(key(4), clock[0]) is not None
    # The same key now another user's: it leaves m's count.
    store.put_now(key(5), identity("x"))
    store.put_now(key(6), identity("m"))
    assert capped == [1] and store.get_now(key(4), clock[0]) is not None


class Buggy(Backend):
    """Raises, with token material in the message, for tokens that start with "bug";
    authenticates "good-<name>"; answers unavailable for everything while ``down``."""

    kind = "buggy"

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.calls = 0
        self.down = False

    async def authenticate(self, token: str, wire: WireTime | None = None) -> Outcome:
        self.calls += 1
        if self.down:
            return Unavailable("connection failed")
        if token.startswith("bug"):
            token.encode("ascii")  # UnicodeEncodeError naming the character and position
            raise KeyError(token)
        if token.startswith("good-"):
            return Authenticated(UserInfo(token[5:]))
        return Rejected("unknown token")


async def test_a_bug_of_ours_is_an_error_that_never_opens_the_breaker(
    caplog: pytest.LogCaptureFixture,
) -> None:
    config = {
        "backends": [
            {
                "name": "buggy",
                "type": "static",
                "tokens": [{"token": "x", "username": "x"}],
                "breaker": {"fail_max": 3},
                "cache": {"positive_ttl_seconds": 0.05, "max_stale_seconds": 60},
            }
        ]
    }
    backend = Buggy("buggy")
    gw = Gateway(parse_config(yaml.safe_dump(config), "test.yaml"), backends=[backend])
    stack = gw.pipeline.backends["buggy"]
    assert stack.breaker is not None
    assert isinstance((await gw.pipeline.review("good-known", (), "c")).outcome, Authenticated)

    caplog.set_level("ERROR")
    secrets = [f"bug-secret-{i}" for i in range(10)] + [f"bug-sécret-{i}" for i in range(10)]
    for token in secrets:
        verdict = await gw.pipeline.review(token, (), "c")
        assert verdict.outcome == InternalError("internal error")
    assert stack.breaker.state == "closed"
    errors = gw.metrics.internal_errors
    assert errors.labels("buggy", "KeyError")._value.get() == 10
    assert errors.labels("buggy", "UnicodeEncodeError")._value.get() == 10
    # Logged once per kind, with the stack, never with the message.
    records = [r for r in caplog.records if "internal error" in r.getMessage()]
    assert len(records) == 2
    text = "\n".join(r.getMessage() for r in records)
    assert "Traceback" not in caplog.text and "secret" not in text and "é" not in text

    verdict = await gw.pipeline.review("good-newcomer", (), "c")
    assert isinstance(verdict.outcome, Authenticated)
    backend.down = True
    await asyncio.sleep(0.1)  # past the known entry's positive TTL
    verdict = await gw.pipeline.review("good-known", (), "c")
    assert isinstance(verdict.outcome, Authenticated) and verdict.stale


async def test_the_breaker_holds_open_no_longer_than_max_retry_after() -> None:
    breaker = Breaker("b", 5, 0.05, LocalProbePermits(1), max_hold=0.2)
    breaker.hold_open(315360000)
    assert breaker.state == "open"
    assert await breaker.admit() is None
    await asyncio.sleep(0.3)
    assert await breaker.admit() is not None


def test_refusals_never_push_identities_out_of_the_memory_store() -> None:
    store = MemoryStore(max_entries=3, max_negative_entries=2)
    for name in ("a", "b", "c"):
        store.put_now(name.encode() * 32, cached(Authenticated(UserInfo(name))))
    for i in range(1000):
        store.put_now(i.to_bytes(32, "big"), cached(Rejected("no")))
    now = time.time()
    assert all(store.get_now(n.encode() * 32, now) is not None for n in "abc")
    assert len(store) == 5  # three identities, the two newest refusals
    # Only a newer identity pushes out the least recently used one.
    store.put_now(b"d" * 32, cached(Authenticated(UserInfo("d"))))
    assert store.get_now(b"a" * 32, now) is None
    # A refusal of the same token replaces its identity (the IdP revoked it).
    store.put_now(b"b" * 32, cached(Rejected("revoked")))
    entry = store.get_now(b"b" * 32, now)
    assert entry is not None and not entry.positive
