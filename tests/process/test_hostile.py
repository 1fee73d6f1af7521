"""Issue 13's attacks, on real processes: what anyone who can send a bearer token can
do must never count as the IdP failing, nor stop known users from being served.

Each attack runs against a real ``authn-gateway serve`` in front of the real IdP
(OpenLDAP's slapd) or the fake one that follows the IdP's API (userinfo, GitLab), and
asserts on the IdP's own counters and on the breaker. Each then shows the two things
users care about: a token the gateway has never seen still authenticates, with one
call to the IdP, and a known user is still served stale while the IdP is down.
"""

from __future__ import annotations

import base64
import contextlib
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis.asyncio as redis

from authn_gateway.config import RedisSettings
from authn_gateway.keyed_hashes import TokenHasher
from authn_gateway.layers.cache.metrics import CacheMetrics
from authn_gateway.observe.metrics import Metrics
from authn_gateway.review.stores import RedisStores
from backends.base import (
    Authenticated,
    Rejected,
    UserInfo,
)
from backends.ldap import Credentials, LDAPBackend, LDAPSettings
from tests.support import loadclient
from tests.support.backend_configs import userinfo_backend
from tests.support.fakes.gitlab import FakeGitLab
from tests.support.fakes.idp import FakeIdP
from tests.support.fakes.keystone import FakeKeystone, mint_token
from tests.support.gitlab_helpers import ALICE, FRANK, add_token, gitlab_backend, oauth, seed
from tests.support.hostile_helpers import NON_ASCII, cached
from tests.support.procs import GatewayProcess, metric_value
from tests.support.redis_server import RedisServer
from tests.support.slapd import PEOPLE, SERVICE_DN, SERVICE_PASSWORD, Slapd, make_ca, start_slapd

Start = Callable[..., GatewayProcess]


def status(gw: GatewayProcess, token: str) -> dict[str, Any]:
    response = gw.review(token)
    assert response.status_code == 200, response.text
    result: dict[str, Any] = response.json()["status"]
    return result


def metric(gw: GatewayProcess, name: str, **labels: str) -> float:
    return metric_value(httpx.get(f"{gw.url}/metrics").text, name, **labels)


def breaker_state(gw: GatewayProcess, backend: str) -> str:
    text = httpx.get(f"{gw.url}/metrics").text
    for state in ("closed", "open", "half-open"):
        if metric_value(text, "authn_gateway_breaker_state", backend=backend, state=state) == 1:
            return state
    raise AssertionError("no breaker state exported")


async def storm(gw: GatewayProcess, tokens: list[str]) -> list[dict[str, Any]]:
    answers = await loadclient.storm(gw.url, tokens, 20)
    loadclient.assert_all(answers, 200)
    return [a.review for a in answers]


def assert_clean_logs(gw: GatewayProcess, *secrets: str) -> None:
    """No traceback and no token material in anything the gateway wrote."""
    time.sleep(0.3)  # review lines are flushed every 100 ms
    logs = gw.logs()
    assert "Traceback" not in logs
    assert "internal error" not in logs
    for secret in secrets:
        assert secret not in logs


def assert_still_serving(
    gw: GatewayProcess,
    backend: str,
    idp_calls: Callable[[], int],
    newcomer: tuple[str, str],
    known: tuple[str, str],
    outage: Callable[[], None],
) -> None:
    """A never-seen token authenticates with IdP calls, and the breaker is closed; with
    the IdP down, the known user (authenticated before the attack, positive TTL 1 s)
    is served stale."""
    before = idp_calls()
    token, user = newcomer
    answer = status(gw, token)
    assert answer["authenticated"] is True, answer
    assert answer["user"]["username"] == user
    assert idp_calls() > before
    assert breaker_state(gw, backend) == "closed"
    outage()
    time.sleep(1.1)  # past the known entry's positive TTL
    stale = metric(gw, "authn_gateway_cache_lookups_total", backend=backend, result="stale_served")
    token, user = known
    answer = status(gw, token)
    assert answer["authenticated"] is True, answer
    assert answer["user"]["username"] == user
    assert (
        metric(gw, "authn_gateway_cache_lookups_total", backend=backend, result="stale_served")
        == stale + 1
    )


SHORT_CACHE = {"positive_ttl_seconds": 1, "max_stale_seconds": 60}


@pytest.fixture
def userinfo_gw(fake_idp: FakeIdP, gateway_factory: Start) -> GatewayProcess:
    gw = gateway_factory(
        {
            "backends": [
                userinfo_backend(
                    fake_idp,
                    cache=SHORT_CACHE,
                    breaker={
                        "fail_max": 3,
                        "reset_timeout_seconds": 1.0,
                        "max_retry_after_seconds": 1.5,
                    },
                )
            ]
        }
    )
    assert status(gw, "good-known")["authenticated"] is True
    fake_idp.reset_stats()
    return gw


def userinfo_still_serving(gw: GatewayProcess, idp: FakeIdP) -> None:
    assert_still_serving(
        gw,
        "idp",
        lambda: idp.calls,
        ("good-newcomer", "newcomer"),
        ("good-known", "known"),
        lambda: idp.configure(refuse=True),
    )


async def test_non_ascii_tokens_are_refused_without_a_call_and_never_open_the_breaker(
    fake_idp: FakeIdP, userinfo_gw: GatewayProcess
) -> None:
    tokens = [f"{t}{i}" for t in NON_ASCII for i in range(10)]
    answers = await storm(userinfo_gw, tokens)
    assert all(a == {"authenticated": False} for a in answers)
    assert fake_idp.calls == 0
    assert breaker_state(userinfo_gw, "idp") == "closed"
    assert_clean_logs(userinfo_gw, *NON_ASCII)
    userinfo_still_serving(userinfo_gw, fake_idp)


@pytest.mark.parametrize(
    ("kind", "logged"),
    [
        # The IdP vouches for each token (a client-credentials token) but names no user.
        ("nameless", "no 'preferred_username' claim (username_claim)"),
        # An OIDC client registered for signed userinfo (dynamic registration can let
        # anyone register one) gets tokens whose userinfo answer is a JWT.
        ("signed", "signed userinfo (application/jwt)"),
    ],
)
async def test_answers_the_mapping_cannot_use_are_refusals_that_never_open_the_breaker(
    fake_idp: FakeIdP, userinfo_gw: GatewayProcess, kind: str, logged: str
) -> None:
    answers = await storm(userinfo_gw, [f"{kind}-{i}" for i in range(20)])
    assert all(a == {"authenticated": False} for a in answers)
    assert fake_idp.stats().by_status == {200: 20}
    assert breaker_state(userinfo_gw, "idp") == "closed"
    assert (
        metric(
            userinfo_gw, "authn_gateway_backend_rejections_total", backend="idp", cause="unmapped"
        )
        == 20
    )
    assert_clean_logs(userinfo_gw, f"{kind}-")
    assert logged in userinfo_gw.logs()
    userinfo_still_serving(userinfo_gw, fake_idp)


async def test_one_user_minting_token_after_token_pushes_out_only_their_own(
    fake_idp: FakeIdP, gateway_factory: Start
) -> None:
    # Any Keystone user can mint tokens at will, a GitLab user makes access tokens: each
    # is a new identity in the cache. Room for 50, of which one user may hold 5; without
    # the per-user bound, 200 of mallory's would push every known user out.
    gw = gateway_factory(
        {
            "cache": {"max_entries": 50, "max_entries_per_user": 5},
            "backends": [userinfo_backend(fake_idp, cache=SHORT_CACHE)],
        }
    )
    for user in ("known", "other"):
        assert status(gw, f"good-{user}")["authenticated"] is True
    # A few at a time: every one of them is a new identity (none saturates the IdP).
    answers = await loadclient.storm(gw.url, [f"good-mallory~{i}" for i in range(200)], 4)
    loadclient.assert_all(answers, 200, authenticated=True)
    assert {a.review["user"]["username"] for a in answers} == {"mallory"}
    assert metric(gw, "authn_gateway_cache_user_capped_total") == 195
    # The other known user is still cached: answered with the IdP down, without a call.
    # (The storm can outlast the 1 s positive TTL under load; a stale entry's refresh
    # then finds the IdP refusing, so the count below does not depend on timing.)
    calls = fake_idp.calls
    fake_idp.configure(refuse=True)
    assert status(gw, "good-other")["user"]["username"] == "other"
    assert fake_idp.calls == calls
    fake_idp.configure(refuse=False)
    assert_clean_logs(gw, "good-mallory~")
    userinfo_still_serving(gw, fake_idp)


@pytest.mark.parametrize("value", ["1e20", "-5", "soon", "30.5"])
async def test_a_retry_after_that_does_not_parse_is_ignored_with_a_warning(
    fake_idp: FakeIdP, userinfo_gw: GatewayProcess, value: str
) -> None:
    fake_idp.configure(status=429, retry_after=value)
    answer = status(userinfo_gw, "good-stranger")
    assert answer["error"] == "idp: rate limited by IdP (429)"
    assert metric(userinfo_gw, "authn_gateway_internal_errors_total") == 0
    # A 429 is the IdP's own word on its health: it counts, but holds nothing open.
    assert breaker_state(userinfo_gw, "idp") == "closed"
    assert "Retry-After that is neither delay-seconds nor an HTTP date" in userinfo_gw.logs()
    fake_idp.configure(status=None, retry_after=None)
    assert_clean_logs(userinfo_gw)
    userinfo_still_serving(userinfo_gw, fake_idp)


@pytest.mark.parametrize("value", ["315360000", "Fri, 01 Jan 2100 00:00:00 GMT"])
async def test_a_retry_after_of_years_holds_the_breaker_no_longer_than_the_cap(
    fake_idp: FakeIdP, userinfo_gw: GatewayProcess, value: str
) -> None:
    fake_idp.configure(status=429, retry_after=value)
    held_at = time.monotonic()
    assert status(userinfo_gw, "good-stranger")["error"] == "idp: rate limited by IdP (429)"
    assert breaker_state(userinfo_gw, "idp") == "open"
    fake_idp.configure(status=None, retry_after=None)
    # Held: nothing reaches the IdP, though it is healthy again.
    assert status(userinfo_gw, "good-other")["error"] == "idp: circuit breaker open"
    assert fake_idp.calls == 1
    # The known user is answered meanwhile (stale while held, fresh once probed).
    time.sleep(1.1)
    assert status(userinfo_gw, "good-known")["authenticated"] is True
    # max_retry_after_seconds is 1.5: then the breaker probes, and the IdP is healthy.
    time.sleep(max(0.0, held_at + 1.7 - time.monotonic()))
    assert "waiting breaker.max_retry_after_seconds (1.5s) instead" in userinfo_gw.logs()
    assert_clean_logs(userinfo_gw)
    userinfo_still_serving(userinfo_gw, fake_idp)


@pytest.fixture(scope="module")
def gitlab() -> Iterator[FakeGitLab]:
    fake = FakeGitLab(seed=seed()).start_in_thread()
    try:
        yield fake
    finally:
        fake.stop()


@pytest.fixture
def gitlab_gw(gitlab: FakeGitLab, gateway_factory: Start) -> Iterator[GatewayProcess]:
    gitlab.reset()
    backend = gitlab_backend(
        gitlab.url,
        cache=SHORT_CACHE,
        breaker={"fail_max": 3, "reset_timeout_seconds": 1.0, "max_retry_after_seconds": 1.5},
    )
    gw = gateway_factory({"backends": [backend]})
    known = add_token(gitlab, oauth(0x1301), FRANK)
    assert status(gw, known)["user"]["username"] == "frank"
    gitlab.reset()
    yield gw
    gitlab.reset()


def gitlab_still_serving(gitlab: FakeGitLab, gw: GatewayProcess) -> None:
    newcomer = add_token(gitlab, f"glpat-newcomer-{uuid.uuid4().hex[:12]}", ALICE)
    assert_still_serving(
        gw,
        "gitlab",
        lambda: gitlab.stats().calls,
        (newcomer, "alice"),
        (oauth(0x1301), "frank"),
        lambda: gitlab.configure(status=502),
    )


async def test_non_ascii_gitlab_tokens_are_refused_without_a_call(
    gitlab: FakeGitLab, gitlab_gw: GatewayProcess
) -> None:
    tokens = [f"glpat-{t}{i}" for t in NON_ASCII for i in range(5)]
    tokens += [("é" + oauth(i))[:64] for i in range(20)]
    answers = await storm(gitlab_gw, tokens)
    assert all(a == {"authenticated": False} for a in answers)
    assert gitlab.stats().calls == 0
    assert breaker_state(gitlab_gw, "gitlab") == "closed"
    assert_clean_logs(gitlab_gw, *NON_ASCII)
    gitlab_still_serving(gitlab, gitlab_gw)


async def test_a_ratelimit_reset_years_away_holds_the_breaker_no_longer_than_the_cap(
    gitlab: FakeGitLab, gitlab_gw: GatewayProcess
) -> None:
    # GitLab's RateLimit-Reset is a Unix time; this one is ten years away, and there is
    # no Retry-After to prefer.
    gitlab.configure(
        status=429, retry_after=str(int(time.time()) + 315360000), drop_headers=["retry-after"]
    )
    stranger = add_token(gitlab, oauth(0x1302), ALICE)
    assert status(gitlab_gw, stranger)["error"] == "gitlab: rate limited by IdP (429)"
    assert breaker_state(gitlab_gw, "gitlab") == "open"
    gitlab.configure(status=None, retry_after=None, drop_headers=[])
    assert status(gitlab_gw, stranger)["error"] == "gitlab: circuit breaker open"
    assert gitlab.stats().calls == 1
    time.sleep(1.7)  # the cap, 1.5 s
    assert "waiting breaker.max_retry_after_seconds (1.5s) instead" in gitlab_gw.logs()
    assert_clean_logs(gitlab_gw)
    gitlab_still_serving(gitlab, gitlab_gw)


async def test_a_ratelimit_reset_that_does_not_parse_is_ignored(
    gitlab: FakeGitLab, gitlab_gw: GatewayProcess
) -> None:
    gitlab.configure(status=429, retry_after="1e20")
    stranger = add_token(gitlab, oauth(0x1303), ALICE)
    assert status(gitlab_gw, stranger)["error"] == "gitlab: rate limited by IdP (429)"
    assert breaker_state(gitlab_gw, "gitlab") == "closed"
    logs = gitlab_gw.logs()
    assert "Retry-After that is neither" in logs and "RateLimit-Reset that is neither" in logs
    gitlab.configure(status=None, retry_after=None)
    assert_clean_logs(gitlab_gw)
    gitlab_still_serving(gitlab, gitlab_gw)


def ldap_token(username: str, password: str) -> str:
    return base64.b64encode(f"{username}:{password}".encode()).decode()


# Passwords a simple bind cannot carry (RFC 4013): control characters, mixed right-to-left
# and left-to-right text, private use, one that maps to nothing at all.
UNSENDABLE_PASSWORDS = (
    "alice\x07pw",
    "alice-pw\u05d0",
    "\u05d0alice-pw\u05d1",
    "\ue000pw",
    "\u00ad",
)


@pytest.fixture
def slapd(tmp_path: Path) -> Iterator[Slapd]:
    server = start_slapd(tmp_path / "slapd", make_ca(tmp_path / "ca", "test-ca"))
    # An entry with a password but no uid, found by cn: the mapping has no username.
    server.add(
        f"dn: cn=robot,{PEOPLE}\nobjectClass: inetOrgPerson\ncn: robot\nsn: robot\n"
        "userPassword: robot-pw\n"
    )
    yield server
    server.stop()


@pytest.fixture
def ldap_gw(slapd: Slapd, gateway_factory: Start, tmp_path: Path) -> GatewayProcess:
    secret = tmp_path / "bind-password"
    secret.write_text(SERVICE_PASSWORD)
    backend = {
        "name": "ldap",
        "type": "ldap",
        "url": slapd.ldaps_url,
        "tls": {"ca_file": str(slapd.ca.cert)},
        "bind_dn": SERVICE_DN,
        "bind_password": f"file:{secret}",
        "user_base": PEOPLE,
        "user_filter": "(|(uid={username})(cn={username}))",
        "timeouts": {"connect_seconds": 0.5, "read_seconds": 1.0, "total_seconds": 1.5},
        "cache": SHORT_CACHE,
        "breaker": {"fail_max": 3, "reset_timeout_seconds": 1.0},
        "bucket": {"rate": 1000, "burst": 1000},
    }
    gw = gateway_factory({"backends": [backend]})
    assert status(gw, ldap_token("carol", "carol-pw"))["user"]["username"] == "carol"
    return gw


def ldap_still_serving(slapd: Slapd, gw: GatewayProcess) -> None:
    assert_still_serving(
        gw,
        "ldap",
        slapd.operations,
        (ldap_token("alice", "alice-pw"), "alice"),
        (ldap_token("carol", "carol-pw"), "carol"),
        slapd.stop,
    )


async def test_passwords_failing_saslprep_are_refused_without_a_bind(
    slapd: Slapd, ldap_gw: GatewayProcess
) -> None:
    binds = slapd.operations("Bind")
    tokens = [ldap_token(u, p) for u in ("alice", "bob", "nobody") for p in UNSENDABLE_PASSWORDS]
    answers = await storm(ldap_gw, tokens * 2)
    assert all(a == {"authenticated": False} for a in answers)
    assert slapd.operations("Bind") == binds
    assert breaker_state(ldap_gw, "ldap") == "closed"
    assert_clean_logs(ldap_gw, *UNSENDABLE_PASSWORDS, *tokens)
    ldap_still_serving(slapd, ldap_gw)


async def test_a_bind_that_ldap3_refuses_to_build_is_a_refusal(slapd: Slapd) -> None:
    # The edge itself, below could_accept and authenticate's own check: the exception
    # ldap3 raises while building the bind request becomes a plain refusal.
    backend = LDAPBackend(
        LDAPSettings(
            name="ldap",
            type="ldap",
            url=slapd.ldaps_url,
            tls={"ca_file": slapd.ca.cert},
            bind_dn=SERVICE_DN,
            bind_password=SERVICE_PASSWORD,
            user_base=PEOPLE,
        )
    )
    try:
        binds = slapd.operations("Bind")
        for password in UNSENDABLE_PASSWORDS:
            creds = Credentials("alice", password)
            outcome = await backend._in_thread(
                lambda c=creds: backend._guarded(lambda: backend._exchange(c))
            )
            assert outcome == Rejected(
                "password is not valid under SASLprep (RFC 4013)", "unsendable"
            )
        # The service account's bind and search ran; no user bind was sent.
        assert slapd.operations("Bind") == binds + 1
    finally:
        await backend.close()


async def test_an_entry_without_the_username_attribute_is_a_refusal(
    slapd: Slapd, ldap_gw: GatewayProcess
) -> None:
    binds = slapd.operations("Bind")
    for _ in range(6):
        assert status(ldap_gw, ldap_token("robot", "robot-pw")) == {"authenticated": False}
    # The negative cache answers the repeats; the one real bind succeeded.
    assert slapd.operations("Bind") > binds
    assert breaker_state(ldap_gw, "ldap") == "closed"
    assert (
        metric(ldap_gw, "authn_gateway_backend_rejections_total", backend="ldap", cause="unmapped")
        == 1
    )
    assert "user entry has no 'uid' attribute (username_attribute)" in ldap_gw.logs()
    assert_clean_logs(ldap_gw, "robot-pw")
    ldap_still_serving(slapd, ldap_gw)


@pytest.fixture(scope="module")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path_factory.mktemp("redis")).start()
    yield server
    server.stop()


@contextlib.asynccontextmanager
async def fleet_cache(
    server: RedisServer, **limits: int
) -> AsyncIterator[tuple[Any, Metrics, str]]:
    """A started fleet state with room for 100 identities and ``limits``: its cache
    store, its metrics and its key prefix."""
    prefix = f"t{time.monotonic_ns()}"
    metrics = Metrics()
    settings = RedisSettings(url=server.url, key_prefix=prefix)
    fleet = RedisStores(settings, TokenHasher(b"k"), metrics, 100, **limits)
    await fleet.start()
    try:
        yield fleet.cache_store(), metrics, prefix
    finally:
        await fleet.close()


async def redis_cache_ttls(server: RedisServer, prefix: str) -> dict[bytes, int]:
    """Every cache entry in Redis under ``prefix``, with its TTL in seconds."""
    client = redis.Redis.from_url(server.url)
    try:
        return {k: await client.ttl(k) async for k in client.scan_iter(f"{prefix}:cache:*")}
    finally:
        await client.aclose()


async def test_redis_takes_a_bounded_number_of_refusals_and_every_identity(
    redis_server: RedisServer,
) -> None:
    async with fleet_cache(redis_server, max_negative_entries=5) as (store, metrics, prefix):
        await store.put(b"a" * 32, cached(Authenticated(UserInfo("alice")), ttl=600))
        for i in range(20):
            await store.put(i.to_bytes(32, "big"), cached(Rejected("no"), ttl=600))
        await store.put(b"b" * 32, cached(Authenticated(UserInfo("bob")), ttl=600))
        ttls = await redis_cache_ttls(redis_server, prefix)
        # Two identities and five refusals; refusals live a minute at most in Redis.
        assert len(ttls) == 7
        assert sorted(ttls.values())[:5] == [60] * 5
        assert metrics.group(CacheMetrics).negatives_unshared._value.get() == 15
        for key in (b"a" * 32, b"b" * 32):
            shared = await store.get_shared(key)
            assert shared is not None and shared.positive


async def test_redis_takes_no_more_of_one_user_than_the_per_user_bound(
    redis_server: RedisServer,
) -> None:
    # Past the bound a user's new identities stay in the process: one account's tokens
    # cannot fill Redis's maxmemory and make it evict the other users' entries.
    async with fleet_cache(redis_server, max_entries_per_user=3) as (store, metrics, prefix):
        await store.put(b"a" * 32, cached(Authenticated(UserInfo("alice")), ttl=600))
        for i in range(20):
            await store.put(i.to_bytes(32, "big"), cached(Authenticated(UserInfo("m")), ttl=600))
        ttls = await redis_cache_ttls(redis_server, prefix)
        assert len(ttls) == 1 + 3  # alice, and the first three of m's
        assert metrics.group(CacheMetrics).user_capped._value.get() == 17
        shared = await store.get_shared(b"a" * 32)
        assert shared is not None and shared.positive


@pytest.mark.parametrize("shared", [False, True], ids=["memory", "redis"])
async def test_a_flood_of_random_tokens_never_evicts_a_known_user(
    fake_idp: FakeIdP, gateway_factory: Start, redis_server: RedisServer, shared: bool
) -> None:
    config: dict[str, Any] = {
        # Room for 50 identities: the flood is forty times that.
        "cache": {"max_entries": 50, "max_negative_entries": 200},
        "inbound_limit": {"enabled": False},
        "backends": [
            userinfo_backend(
                fake_idp,
                cache=SHORT_CACHE,
                # A loaded 2-core machine can be slow to answer 2,000 calls; that is not
                # what this test is about.
                timeouts={"connect_seconds": 1, "read_seconds": 3, "total_seconds": 3},
                breaker={"fail_max": 50, "reset_timeout_seconds": 1.0},
            )
        ],
    }
    if shared:
        config["redis"] = {"url": redis_server.url, "key_prefix": f"flood{time.monotonic_ns()}"}
        config["secret"] = "Zm9vZC1mbG9vZC10ZXN0LXNlY3JldC0wMTIzNDU2Nzg5YWJj"
    gw = gateway_factory(config)
    assert status(gw, "good-known")["authenticated"] is True
    fake_idp.reset_stats()
    junk = [f"junk-{uuid.uuid4().hex}" for _ in range(2000)]
    answers = await storm(gw, junk)
    assert not any(a["authenticated"] for a in answers)
    # Junk the IdP refused, cached as refusals: many times the 50 identities' room
    # (the concurrency limit may refuse some of the storm before the IdP).
    statuses = fake_idp.stats().by_status
    assert set(statuses) == {401} and statuses[401] > 500
    userinfo_still_serving(gw, fake_idp)


async def test_junk_at_the_inbound_ceiling_never_fails_a_cached_user(
    fake_idp: FakeIdP, gateway_factory: Start
) -> None:
    # kube-apiserver is one caller (here 127.0.0.1) for junk and known users alike.
    gw = gateway_factory(
        {
            "inbound_limit": {"rate": 20, "burst": 20},
            "backends": [userinfo_backend(fake_idp, cache=SHORT_CACHE)],
        }
    )
    assert status(gw, "good-known")["authenticated"] is True
    time.sleep(1.0)  # the caller's bucket refills
    fake_idp.reset_stats()
    junk = [f"junk-{uuid.uuid4().hex}" for _ in range(400)]
    tokens = [t for pair in zip(junk, ["good-known"] * 400, strict=True) for t in pair]
    answers = await storm(gw, tokens)
    known = [a for t, a in zip(tokens, answers, strict=True) if t == "good-known"]
    refused = [a for t, a in zip(tokens, answers, strict=True) if t != "good-known"]
    assert all(a["authenticated"] and a["user"]["username"] == "known" for a in known)
    over = [a for a in refused if a.get("error") == "idp: caller exceeded its review rate"]
    assert len(over) > 300
    # Only the junk the caller's rate allowed reached the IdP (plus, maybe, the known
    # user's refresh once its 1 s TTL ran out): each such call is one 401 and one plain
    # refusal. Junk the rate allowed may also meet the adaptive concurrency limit during
    # the storm, and is then refused by the gateway without any call.
    rejected_by_idp = [a for a in refused if "error" not in a]
    held_back = [a for a in refused if a not in over and "error" in a]
    assert all("IdP saturated" in a["error"] for a in held_back), held_back
    assert fake_idp.stats().by_status.get(401, 0) == len(rejected_by_idp) < 100
    assert len(rejected_by_idp) + len(held_back) + len(over) == len(refused)
    # A known user whose entry went stale mid-storm may be refused a refresh too: it
    # is then served stale, as above, so at least the junk's refusals are counted.
    assert metric(gw, "authn_gateway_limiter_refusals_total", limiter="inbound") >= len(over)
    time.sleep(1.1)
    userinfo_still_serving(gw, fake_idp)


@pytest.fixture
def keystone() -> Iterator[FakeKeystone]:
    fake = FakeKeystone().start_in_thread()
    yield fake
    fake.stop()


@pytest.mark.parametrize("precheck", [False, True], ids=["any-token", "fernet-precheck"])
async def test_non_ascii_keystone_tokens_are_refused_without_a_validation(
    keystone: FakeKeystone, gateway_factory: Start, precheck: bool
) -> None:
    backend = {
        "name": "keystone",
        "type": "keystone",
        "auth_url": f"http://127.0.0.1:{keystone.port}/v3",
        "service": {
            "username": "authn-gateway",
            "password": "GatewayPass123",
            "system_scope": "all",
        },
        "fernet_precheck": precheck,
        "timeouts": {"connect_seconds": 0.5, "read_seconds": 1.0, "total_seconds": 1.5},
        "cache": SHORT_CACHE,
        "breaker": {"fail_max": 3, "reset_timeout_seconds": 1.0},
        "bucket": {"rate": 1000, "burst": 1000},
    }
    gw = gateway_factory({"backends": [backend]})
    known = mint_token("known")
    assert status(gw, known)["user"]["username"] == "known"
    validations = keystone.counts["validate"]
    # Fernet-shaped tokens with one character kube-apiserver could pass on.
    good = mint_token("attacker")
    tokens = [good[:40] + c + good[41:] for c in ("é", "\ufffd", "\u0663", "✓")] * 10
    answers = await storm(gw, tokens)
    assert all(a == {"authenticated": False} for a in answers)
    assert keystone.counts["validate"] == validations
    assert breaker_state(gw, "keystone") == "closed"
    assert_clean_logs(gw, *tokens)
    assert_still_serving(
        gw,
        "keystone",
        lambda: keystone.counts["validate"],
        (mint_token("newcomer"), "newcomer"),
        (known, "known"),
        lambda: keystone.configure(refuse=True),
    )


def write_tokens(path: Path, *rows: str) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text("".join(f"{row}\n" for row in rows))
    tmp.replace(path)  # the way a ConfigMap update lands: one rename


@pytest.fixture
def static_gw(gateway_factory: Start, tmp_path: Path) -> tuple[GatewayProcess, Path]:
    tokens = tmp_path / "tokens.csv"
    write_tokens(tokens, "break-glass-0123456789,admin,0,system:masters")
    backend = {
        "name": "static",
        "type": "static",
        "file": str(tokens),
        "reload_interval_seconds": 0.2,
        # Were any of these in front of it, 300 random tokens would lock it out.
        "bucket": {"rate": 1, "burst": 1},
        "breaker": {"fail_max": 1, "reset_timeout_seconds": 60},
        "cache": {"positive_ttl_seconds": 300, "negative_ttl_seconds": 300},
    }
    return gateway_factory({"backends": [backend]}), tokens


async def test_random_tokens_never_lock_out_a_static_token(
    static_gw: tuple[GatewayProcess, Path],
) -> None:
    gw, _ = static_gw
    answers = await storm(gw, [f"random-{uuid.uuid4().hex}" for _ in range(300)])
    assert all(a == {"authenticated": False} for a in answers)
    answer = status(gw, "break-glass-0123456789")
    assert answer["authenticated"] is True and answer["user"]["username"] == "admin"
    assert metric(gw, "authn_gateway_limiter_refusals_total") == 0
    assert metric(gw, "authn_gateway_cache_lookups_total", backend="static") == 0
    assert_clean_logs(gw)


async def test_token_file_edits_take_effect_at_the_next_reload(
    static_gw: tuple[GatewayProcess, Path],
) -> None:
    gw, tokens = static_gw
    assert status(gw, "break-glass-0123456789")["authenticated"] is True
    assert status(gw, "newly-added-0123456789") == {"authenticated": False}
    write_tokens(tokens, "newly-added-0123456789,ops,1")
    deadline = time.monotonic() + 5
    while "reloaded 1 tokens" not in gw.logs() and time.monotonic() < deadline:
        time.sleep(0.1)
    # Removed: refused at once, not after a positive TTL. Added: accepted at once, not
    # after a negative TTL.
    assert status(gw, "break-glass-0123456789") == {"authenticated": False}
    assert status(gw, "newly-added-0123456789")["user"]["username"] == "ops"
