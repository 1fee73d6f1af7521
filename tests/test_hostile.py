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
import base64
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from authn_gateway.breaker import Breaker, LocalProbePermits
from authn_gateway.config import parse_config
from authn_gateway.gateway import Gateway
from backends.base import (
    Authenticated,
    Backend,
    InternalError,
    Outcome,
    Rejected,
    Unavailable,
    UserInfo,
)
from backends.http import retry_after_seconds
from backends.ldap import Credentials, LDAPBackend, LDAPSettings
from backends.userinfo import UserinfoBackend, UserinfoSettings
from tests.conftest import userinfo_backend
from tests.support import loadclient
from tests.support.fakes.gitlab import FakeGitLab
from tests.support.fakes.idp import FakeIdP
from tests.support.procs import GatewayProcess, metric_value
from tests.support.slapd import PEOPLE, SERVICE_DN, SERVICE_PASSWORD, Slapd, make_ca, start_slapd
from tests.test_gitlab import ALICE, FRANK, add_token, gitlab_backend, oauth, seed

Start = Callable[..., GatewayProcess]

# What kube-apiserver passes on: any text a client sent, bytes that are not UTF-8 as U+FFFD.
NON_ASCII = ("good-é1", "good-\ufffd", "good-\u0663", "ключ-good", "good-\u202etxt", "good-✓")


# --- helpers ------------------------------------------------------------------------


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
    assert all(a.status == 200 for a in answers)
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


# --- userinfo -----------------------------------------------------------------------


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


def userinfo_outage(idp: FakeIdP) -> Callable[[], None]:
    return lambda: idp.configure(refuse=True)


async def test_non_ascii_tokens_are_refused_without_a_call_and_never_open_the_breaker(
    fake_idp: FakeIdP, userinfo_gw: GatewayProcess
) -> None:
    tokens = [f"{t}{i}" for t in NON_ASCII for i in range(10)]
    answers = await storm(userinfo_gw, tokens)
    assert all(a == {"authenticated": False} for a in answers)
    assert fake_idp.calls == 0
    assert breaker_state(userinfo_gw, "idp") == "closed"
    assert_clean_logs(userinfo_gw, *NON_ASCII)
    assert_still_serving(
        userinfo_gw,
        "idp",
        lambda: fake_idp.calls,
        ("good-newcomer", "newcomer"),
        ("good-known", "known"),
        userinfo_outage(fake_idp),
    )


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


async def test_answers_without_a_username_are_refusals_that_never_open_the_breaker(
    fake_idp: FakeIdP, userinfo_gw: GatewayProcess
) -> None:
    # The IdP vouches for each token (a client-credentials token) but names no user.
    answers = await storm(userinfo_gw, [f"nameless-{i}" for i in range(20)])
    assert all(a == {"authenticated": False} for a in answers)
    assert fake_idp.stats().by_status == {200: 20}
    assert breaker_state(userinfo_gw, "idp") == "closed"
    assert (
        metric(
            userinfo_gw, "authn_gateway_backend_rejections_total", backend="idp", cause="unmapped"
        )
        == 20
    )
    assert_clean_logs(userinfo_gw, "nameless-")
    assert "no 'preferred_username' claim (username_claim)" in userinfo_gw.logs()
    assert_still_serving(
        userinfo_gw,
        "idp",
        lambda: fake_idp.calls,
        ("good-newcomer", "newcomer"),
        ("good-known", "known"),
        userinfo_outage(fake_idp),
    )


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
    assert_still_serving(
        userinfo_gw,
        "idp",
        lambda: fake_idp.calls,
        ("good-newcomer", "newcomer"),
        ("good-known", "known"),
        userinfo_outage(fake_idp),
    )


@pytest.mark.parametrize("value", ["315360000", "Fri, 01 Jan 2100 00:00:00 GMT"])
async def test_a_retry_after_of_years_holds_the_breaker_no_longer_than_the_cap(
    fake_idp: FakeIdP, userinfo_gw: GatewayProcess, value: str
) -> None:
    fake_idp.configure(status=429, retry_after=value)
    assert status(userinfo_gw, "good-stranger")["error"] == "idp: rate limited by IdP (429)"
    assert breaker_state(userinfo_gw, "idp") == "open"
    fake_idp.configure(status=None, retry_after=None)
    # Held: nothing reaches the IdP, and the known user is served stale meanwhile.
    time.sleep(1.1)
    answer = status(userinfo_gw, "good-known")
    assert answer["authenticated"] is True
    assert status(userinfo_gw, "good-other")["error"] == "idp: circuit breaker open"
    assert fake_idp.calls == 1
    # max_retry_after_seconds is 1.5: then the breaker probes, and the IdP is healthy.
    time.sleep(0.6)
    assert "holding open for max_retry_after_seconds (1.5s)" in userinfo_gw.logs()
    assert_clean_logs(userinfo_gw)
    assert_still_serving(
        userinfo_gw,
        "idp",
        lambda: fake_idp.calls,
        ("good-newcomer", "newcomer"),
        ("good-known", "known"),
        userinfo_outage(fake_idp),
    )


# --- GitLab -------------------------------------------------------------------------


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
    assert "holding open for max_retry_after_seconds (1.5s)" in gitlab_gw.logs()
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


# --- LDAP ---------------------------------------------------------------------------


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


# --- a bug of ours ------------------------------------------------------------------


class Buggy(Backend):
    """Raises, with token material in the message, for tokens that start with "bug";
    authenticates "good-<name>"; answers unavailable for everything while ``down``."""

    kind = "buggy"

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.calls = 0
        self.down = False

    async def authenticate(self, token: str) -> Outcome:
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


# --- Retry-After and RateLimit-Reset, parsed strictly --------------------------------

NOW = 1_800_000_000.0  # 2027-01-15T08:00:00Z


def throttled(**headers: bytes) -> httpx.Response:
    return httpx.Response(
        429, headers=[(k.replace("_", "-").encode(), v) for k, v in headers.items()]
    )


@pytest.mark.parametrize(
    ("value", "seconds"),
    [
        (b"30", 30.0),
        (b" 7 ", 7.0),
        (b"315360000", 315360000.0),  # parsed as asked; the breaker caps it
        (b"9" * 5000, 1e12),  # past int()'s 4300-digit limit: "very long", capped too
        (b"Fri, 15 Jan 2027 08:00:30 GMT", 30.0),  # IMF-fixdate
        (b"Friday, 15-Jan-27 08:00:30 GMT", 30.0),  # RFC 850
        (b"Fri Jan 15 08:00:30 2027", 30.0),  # asctime
        (b"Thu, 01 Jan 1970 00:00:00 GMT", 0.0),  # in the past: no wait
    ],
)
def test_retry_after_is_delay_seconds_or_an_http_date(value: bytes, seconds: float) -> None:
    assert retry_after_seconds(throttled(retry_after=value), now=NOW) == seconds


@pytest.mark.parametrize(
    "value",
    [b"1e20", b"-5", b"30.5", b"0x10", b"\xd9\xa3", b"\xc2\xb2", b"soon", b"",
     b"Fri, 31 Feb 2027 08:00:30 GMT", b"Fri, 15 Jan 2027 08:00:30 +0100", b"nan", b"inf"],
)  # fmt: skip
def test_a_retry_after_that_does_not_parse_is_ignored(
    value: bytes, caplog: pytest.LogCaptureFixture
) -> None:
    assert retry_after_seconds(throttled(retry_after=value), now=NOW) is None
    assert "Retry-After that is neither delay-seconds nor an HTTP date" in caplog.text


def test_ratelimit_reset_is_a_unix_time_or_a_delay_and_only_digits() -> None:
    at = str(int(NOW) + 40).encode()
    assert retry_after_seconds(throttled(ratelimit_reset=at), now=NOW) == 40.0
    assert retry_after_seconds(throttled(ratelimit_reset=b"12"), now=NOW) == 12.0
    assert retry_after_seconds(throttled(ratelimit_reset=b"1e20"), now=NOW) is None
    # Retry-After first; one that does not parse falls through to RateLimit-Reset.
    both = throttled(retry_after=b"5", ratelimit_reset=b"12")
    assert retry_after_seconds(both, now=NOW) == 5.0
    fallback = throttled(retry_after=b"soon", ratelimit_reset=b"12")
    assert retry_after_seconds(fallback, now=NOW) == 12.0


async def test_the_breaker_holds_open_no_longer_than_max_retry_after() -> None:
    breaker = Breaker("b", 5, 0.05, LocalProbePermits(1), max_hold=0.2)
    breaker.hold_open(315360000)
    assert breaker.state == "open"
    assert await breaker.admit() is None
    await asyncio.sleep(0.3)
    assert await breaker.admit() is not None
