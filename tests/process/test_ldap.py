"""The LDAP backend against a real OpenLDAP (tests/support/slapd.py), mostly through a
real gateway process."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from backends.base import Authenticated, Rejected, Unavailable
from backends.ldap import search as ldap_search
from tests.support.ldap_helpers import _config, backend_for, pw, token
from tests.support.procs import GatewayProcess, metric_value, start_gateway
from tests.support.slapd import (
    GROUPS,
    PEOPLE,
    POSIX_GROUPS,
    SERVICE_DN,
    SERVICE_PASSWORD,
    USERS,
    CertificateAuthority,
    Slapd,
    make_ca,
    start_slapd,
)

Start = Callable[..., GatewayProcess]


@pytest.fixture(scope="session")
def pki(tmp_path_factory: pytest.TempPathFactory) -> tuple[CertificateAuthority, Path]:
    """The CA that signed slapd's certificate, and an unrelated CA's certificate."""
    d = tmp_path_factory.mktemp("pki")
    return make_ca(d / "test", "test-ca"), make_ca(d / "wrong", "wrong-ca").cert


@pytest.fixture(scope="session")
def slapd(
    tmp_path_factory: pytest.TempPathFactory, pki: tuple[CertificateAuthority, Path]
) -> Iterator[Slapd]:
    server = start_slapd(tmp_path_factory.mktemp("slapd"), pki[0])
    yield server
    server.stop()


@pytest.fixture
def own_slapd(tmp_path: Path, pki: tuple[CertificateAuthority, Path]) -> Iterator[Slapd]:
    """A slapd of the test's own, for tests that stop or restart it (starts in ~0.2 s)."""
    server = start_slapd(tmp_path / "slapd", pki[0])
    yield server
    server.stop()


def ldap_backend(
    server: Slapd, password_file: Path, name: str = "ldap", **overrides: Any
) -> dict[str, Any]:
    """Search mode over ldaps://, memberOf groups, test-friendly resilience knobs."""
    backend: dict[str, Any] = {
        "name": name,
        "type": "ldap",
        "url": server.ldaps_url,
        "tls": {"ca_file": str(server.ca.cert)},
        "bind_dn": SERVICE_DN,
        "bind_password": f"file:{password_file}",
        "user_base": PEOPLE,
        "user_filter": "(&(objectClass=inetOrgPerson)(uid={username}))",
        "extra_attributes": {"example.org/mail": "mail"},
        "timeouts": {"connect_seconds": 1.0, "read_seconds": 2.0, "total_seconds": 3.0},
        "breaker": {"fail_max": 100, "reset_timeout_seconds": 1.0},
        "bucket": {"rate": 1000, "burst": 1000},
    }
    backend.update(overrides)
    return backend


@pytest.fixture(scope="module")
def gateway(
    slapd: Slapd,
    pki: tuple[CertificateAuthority, Path],
    service_password_file: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[GatewayProcess]:
    """One gateway, one LDAP backend per configuration, each behind its own prefix."""
    wrong_ca = {"ca_file": str(pki[1])}
    pf = service_password_file

    def routed(prefix: str, name: str, **overrides: Any) -> dict[str, Any]:
        return ldap_backend(slapd, pf, name, prefix=prefix, strip_prefix=True, **overrides)

    backends = [
        routed("m.", "memberof"),
        routed(
            "p.",
            "posix",
            url=slapd.ldap_url,
            start_tls=True,
            groups={
                "mode": "search",
                "base": POSIX_GROUPS,
                "filter": "(&(objectClass=posixGroup)(memberUid={username}))",
            },
        ),
        routed("g.", "groupsearch", groups={"mode": "search", "base": GROUPS}),
        routed(
            "d.",
            "direct",
            bind_dn=None,
            bind_password=None,
            user_base=None,
            user_dn_template=f"uid={{username}},{PEOPLE}",
        ),
        routed(
            "s.", "direct-service", user_base=None, user_dn_template=f"uid={{username}},{PEOPLE}"
        ),
        routed("t.", "twins", user_filter="(cn={username})"),
        routed("w.", "wrong-ca", tls=wrong_ca),
        routed("x.", "wrong-ca-starttls", url=slapd.ldap_url, start_tls=True, tls=wrong_ca),
        routed("b.", "bad-service", bind_password="not-the-service-password"),
        routed("n.", "no-such-base", user_base=f"ou=nobody,{PEOPLE}"),
    ]
    gw = start_gateway({"backends": backends}, tmp_path_factory.mktemp("gw"))
    yield gw
    gw.stop()


def review(gw: GatewayProcess, tok: str) -> dict[str, Any]:
    response = gw.review(tok)
    assert response.status_code == 200
    status: dict[str, Any] = response.json()["status"]
    return status


def assert_rejected(status: dict[str, Any]) -> None:
    # A rejection is a bare "authenticated: false": no error, so kube-apiserver may cache it.
    assert status == {"authenticated": False}


def metrics(gw: GatewayProcess) -> str:
    return httpx.get(f"{gw.url}/metrics").text


def breaker_state(gw: GatewayProcess, backend: str) -> str:
    text = metrics(gw)
    for state in ("closed", "open", "half-open"):
        if metric_value(text, "authn_gateway_breaker_state", backend=backend, state=state) == 1:
            return state
    raise AssertionError("no breaker state exported")


@pytest.mark.parametrize(
    ("contents", "reason"),
    [
        (None, "No such file or directory"),
        (b"", "holds no PEM certificate"),
        (b"not a certificate\n", "holds no PEM certificate"),
        (b"-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n", "ca_file"),
    ],
    ids=["missing", "empty", "text", "broken-pem"],
)
def test_an_unusable_ca_file_is_one_line_from_check_config_and_serve(
    tmp_path: Path, pki: tuple[CertificateAuthority, Path], contents: bytes | None, reason: str
) -> None:
    ca_file = tmp_path / "ca.pem"
    if contents is not None:
        ca_file.write_bytes(contents)
    config = tmp_path / "gw.yaml"
    config.write_text(
        _config(url="ldaps://127.0.0.1:1", user_dn_template="uid={username}")
        + f"    tls: {{ca_file: {ca_file}}}\n"
    )
    for command in (["check-config", str(config)], ["serve", "--config", str(config)]):
        result = subprocess.run(
            [sys.executable, "-m", "authn_gateway", *command],
            capture_output=True,
            text=True,
            timeout=60,
            stdin=subprocess.DEVNULL,
        )
        out = result.stdout + result.stderr
        assert result.returncode == 1, (command, out)
        assert "Traceback" not in out, out
        line = f"{config}: backends[0] (corp): tls.ca_file: {ca_file}: "
        assert line in result.stderr and reason in result.stderr, (command, out)
    # The CA that signed the directory's certificate is accepted, as before.
    ca_file.write_bytes(pki[0].cert.read_bytes())
    result = subprocess.run(
        [sys.executable, "-m", "authn_gateway", "check-config", str(config)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.slow
def test_user_in_several_groups_gets_all_of_them_from_member_of(gateway: GatewayProcess) -> None:
    status = review(gateway, "m." + token("alice", pw("alice")))
    assert status["authenticated"] is True
    user = status["user"]
    assert user["username"] == "alice"
    assert user["groups"] == ["admins", "developers", "viewers"]
    assert len(user["uid"]) == 36  # entryUUID
    assert user["extra"] == {
        "example.org/mail": ["alice@example.org"],
        "authn-gateway.io/backend": ["memberof"],  # the gateway's marker
    }


@pytest.mark.slow
def test_user_in_no_group_is_authenticated_without_groups(gateway: GatewayProcess) -> None:
    status = review(gateway, "m." + token("carol", pw("carol")))
    assert status["authenticated"] is True
    assert status["user"]["username"] == "carol"
    assert "groups" not in status["user"]


@pytest.mark.slow
def test_posix_groups_are_found_by_member_uid_over_starttls(gateway: GatewayProcess) -> None:
    status = review(gateway, "p." + token("bob", pw("bob")))
    assert status["authenticated"] is True
    assert status["user"]["groups"] == ["oncall", "ops"]


@pytest.mark.slow
def test_group_of_names_search_finds_groups_by_member_dn(gateway: GatewayProcess) -> None:
    status = review(gateway, "g." + token("alice", pw("alice")))
    assert status["user"]["groups"] == ["admins", "developers", "viewers"]


@pytest.mark.slow
def test_username_is_the_directory_spelling_not_the_typed_one(gateway: GatewayProcess) -> None:
    status = review(gateway, "m." + token("ALICE", pw("alice")))
    assert status["user"]["username"] == "alice"


@pytest.mark.slow
@pytest.mark.parametrize("prefix", ["d.", "s."])
def test_direct_bind_template_authenticates_with_or_without_a_service_account(
    gateway: GatewayProcess, prefix: str
) -> None:
    status = review(gateway, prefix + token("alice", pw("alice")))
    assert status["user"]["username"] == "alice"
    assert status["user"]["groups"] == ["admins", "developers", "viewers"]


@pytest.mark.slow
@pytest.mark.parametrize("prefix", ["m.", "d.", "s."])
def test_wrong_password_is_rejected(gateway: GatewayProcess, prefix: str) -> None:
    assert_rejected(review(gateway, prefix + token("alice", "not-alice-pw")))


@pytest.mark.slow
@pytest.mark.parametrize("prefix", ["m.", "d.", "s."])
def test_unknown_user_is_rejected(gateway: GatewayProcess, prefix: str) -> None:
    assert_rejected(review(gateway, prefix + token("mallory", "whatever")))


@pytest.mark.slow
def test_ambiguous_filter_matching_two_entries_is_rejected(gateway: GatewayProcess) -> None:
    assert_rejected(review(gateway, "t." + token("twin", pw("twin-a"))))
    # The filter itself works: a cn that matches one entry logs in.
    assert review(gateway, "t." + token("carol", pw("carol")))["authenticated"] is True


@pytest.mark.slow
@pytest.mark.parametrize(
    "tok",
    [token("alice", ""), token("", "alice-pw"), "bm90IGEgdG9rZW4", "@@@", token("a\x00", "x")],
)
def test_empty_parts_and_malformed_tokens_never_reach_the_server(
    gateway: GatewayProcess, tok: str
) -> None:
    before = metric_value(metrics(gateway), "authn_gateway_backend_calls_total", backend="memberof")
    assert_rejected(review(gateway, "m." + tok))
    text = metrics(gateway)
    assert metric_value(text, "authn_gateway_backend_calls_total", backend="memberof") == before
    assert metric_value(text, "authn_gateway_prerejected_total", reason="no_backend_accepts") > 0


@pytest.mark.slow
def test_the_test_server_answers_an_unauthenticated_bind_with_success(slapd: Slapd) -> None:
    """Why an empty password must never be sent: this server, like many, says yes."""
    done = subprocess.run(
        ["ldapwhoami", "-x", "-H", slapd.ldap_url, "-D", USERS["alice"].dn, "-w", ""],
        capture_output=True, text=True, timeout=10,
    )  # fmt: skip
    assert done.returncode == 0 and done.stdout.strip() == "anonymous"


@pytest.mark.slow
@pytest.mark.parametrize(
    "username",
    ["*", "al*", "a*e", "*)(uid=alice", ")(uid=*", "alice)(|(uid=*", "*)(|(objectClass=*",
     "\\61lice", "\\2a", "\\00", "alice\\00"],
)  # fmt: skip
@pytest.mark.parametrize("prefix", ["m.", "p."])
def test_filter_injection_matches_no_other_user(
    gateway: GatewayProcess, prefix: str, username: str
) -> None:
    # Unescaped, "al*" or "\61lice" would find alice, and alice's password would log in.
    assert_rejected(review(gateway, prefix + token(username, pw("alice"))))


@pytest.mark.slow
@pytest.mark.parametrize(
    "username",
    ["alice,ou=people", "alice+cn=x", "uid=alice", "*", "alice\\", "#alice", " "],
)
def test_dn_injection_binds_no_other_user(gateway: GatewayProcess, username: str) -> None:
    assert_rejected(review(gateway, "d." + token(username, pw("alice"))))


@pytest.mark.slow
@pytest.mark.parametrize("prefix", ["m.", "d."])
def test_metacharacters_in_a_real_username_still_log_in(
    gateway: GatewayProcess, prefix: str
) -> None:
    for uid in ("ann,lee+x=1", "star*"):
        status = review(gateway, prefix + token(uid, pw(uid)))
        assert status["authenticated"] is True, uid
        assert status["user"]["username"] == uid


@pytest.mark.slow
@pytest.mark.parametrize("prefix", ["w.", "x."])
def test_wrong_ca_fails_tls_verification_as_unavailable(
    gateway: GatewayProcess, prefix: str
) -> None:
    status = review(gateway, prefix + token("alice", pw("alice")))
    name = {"w.": "wrong-ca", "x.": "wrong-ca-starttls"}[prefix]
    assert status == {
        "authenticated": False,
        "error": f"{name}: TLS certificate verification failed",
    }
    assert metric_value(metrics(gateway), "authn_gateway_backend_config_errors_total", backend=name)


@pytest.mark.slow
def test_refused_service_account_is_unavailable_not_a_rejection(gateway: GatewayProcess) -> None:
    status = review(gateway, "b." + token("alice", pw("alice")))
    assert status["error"] == "bad-service: service account bind: invalidCredentials (49)"


@pytest.mark.slow
def test_missing_user_base_is_a_configuration_problem(gateway: GatewayProcess) -> None:
    status = review(gateway, "n." + token("alice", pw("alice")))
    assert status["error"] == "no-such-base: user search: noSuchObject (32)"


@pytest.mark.slow
def test_gateway_logs_never_hold_a_password_or_token(gateway: GatewayProcess) -> None:
    review(gateway, "m." + token("alice", pw("alice")))
    review(gateway, "b." + token("bob", pw("bob")))
    logs = gateway.logs()
    assert "configuration problem" in logs
    for secret in (pw("alice"), pw("bob"), SERVICE_PASSWORD, token("alice", pw("alice"))):
        assert secret not in logs


@pytest.mark.parametrize(("pages", "answered"), [(3, "groups"), (2, "too many")])
async def test_a_user_in_more_groups_than_are_read_is_refused_not_the_directory_failing(
    slapd: Slapd, service_password_file: Path, monkeypatch: pytest.MonkeyPatch,
    pages: int, answered: str,
) -> None:  # fmt: skip
    # Alice is in three groups: one a page, read over three pages or refused at two.
    # Refused, not unavailable: her own reviews must not open the breaker for everyone.
    monkeypatch.setattr(ldap_search, "GROUP_PAGE_SIZE", 1)
    monkeypatch.setattr(ldap_search, "MAX_GROUP_PAGES", pages)
    backend = backend_for(
        slapd.ldaps_url, service_password_file, tls={"ca_file": str(slapd.ca.cert)},
        groups={"mode": "search", "base": GROUPS},
    )  # fmt: skip
    try:
        outcome = await backend.authenticate(token("alice", pw("alice")))
    finally:
        await backend.close()
    if answered == "groups":
        assert isinstance(outcome, Authenticated)
        assert sorted(outcome.user.groups) == ["admins", "developers", "viewers"]
    else:
        assert outcome == Rejected("user is in more than 2 groups", "unmapped")


@pytest.mark.slow
async def test_service_pool_is_bounded_under_concurrency(
    slapd: Slapd, service_password_file: Path
) -> None:
    backend = backend_for(
        slapd.ldaps_url, service_password_file, tls={"ca_file": str(slapd.ca.cert)},
        pool={"size": 2},
    )  # fmt: skip
    try:
        names = ["alice", "bob", "carol"] * 8
        outcomes = await asyncio.gather(*(backend.authenticate(token(n, pw(n))) for n in names))
        assert [o.user.username for o in outcomes if isinstance(o, Authenticated)] == names
        assert backend.pool is not None and backend.pool.opened <= 2
    finally:
        await backend.close()


@pytest.mark.slow
async def test_pooled_connections_are_replaced_after_a_slapd_restart(
    own_slapd: Slapd, service_password_file: Path
) -> None:
    backend = backend_for(
        own_slapd.ldaps_url, service_password_file, tls={"ca_file": str(own_slapd.ca.cert)},
        pool={"size": 2},
    )  # fmt: skip
    try:
        alice = token("alice", pw("alice"))
        await asyncio.gather(*(backend.authenticate(alice) for _ in range(4)))
        assert backend.pool is not None
        opened = backend.pool.opened
        own_slapd.restart()
        for _ in range(4):
            assert isinstance(await backend.authenticate(alice), Authenticated)
        assert backend.pool.opened > opened
    finally:
        await backend.close()


@pytest.mark.slow
async def test_stopped_server_is_unavailable_and_a_restarted_one_serves_again(
    own_slapd: Slapd, service_password_file: Path
) -> None:
    backend = backend_for(
        own_slapd.ldaps_url, service_password_file, tls={"ca_file": str(own_slapd.ca.cert)}
    )
    try:
        alice = token("alice", pw("alice"))
        assert isinstance(await backend.authenticate(alice), Authenticated)
        own_slapd.stop()
        assert await backend.authenticate(alice) == Unavailable("connection failed")
        own_slapd.start()
        assert isinstance(await backend.authenticate(alice), Authenticated)
    finally:
        await backend.close()


NO_CACHE = {"positive_ttl_seconds": 0, "negative_ttl_seconds": 0, "max_stale_seconds": 0}


@pytest.mark.slow
def test_slapd_stopped_mid_run_opens_the_breaker_and_recovery_is_orderly(
    own_slapd: Slapd, service_password_file: Path, gateway_factory: Start
) -> None:
    gw = gateway_factory({"backends": [ldap_backend(
        own_slapd, service_password_file, cache=NO_CACHE,
        breaker={"fail_max": 2, "reset_timeout_seconds": 1.0, "half_open_probes": 1},
    )]})  # fmt: skip
    alice = token("alice", pw("alice"))
    assert review(gw, alice)["authenticated"] is True

    own_slapd.stop()
    errors = [review(gw, alice).get("error") for _ in range(4)]
    assert errors == ["ldap: connection failed"] * 2 + ["ldap: circuit breaker open"] * 2
    assert breaker_state(gw, "ldap") == "open"

    own_slapd.start()
    answers: list[dict[str, Any]] = []
    for _ in range(40):  # the breaker resets after 1 s; 40 tries cover 10 s
        answers.append(review(gw, alice))
        if answers[-1]["authenticated"]:
            break
        time.sleep(0.25)
    assert answers[-1]["authenticated"] is True
    # Until the breaker let a probe through, callers got a quick "open", nothing else.
    assert all(a == {"authenticated": False, "error": "ldap: circuit breaker open"}
               for a in answers[:-1])  # fmt: skip
    assert breaker_state(gw, "ldap") == "closed"


@pytest.mark.slow
def test_gateway_pool_survives_a_slapd_restart(
    own_slapd: Slapd, service_password_file: Path, gateway_factory: Start
) -> None:
    gw = gateway_factory({"backends": [ldap_backend(
        own_slapd, service_password_file, cache=NO_CACHE, pool={"size": 2},
        breaker={"fail_max": 1, "reset_timeout_seconds": 30},
    )]})  # fmt: skip
    for uid in ("alice", "bob", "carol"):
        assert review(gw, token(uid, pw(uid)))["authenticated"] is True
    own_slapd.restart()
    # No unavailable answer at all: stale pooled connections are replaced in the call.
    for uid in ("alice", "bob", "carol"):
        assert review(gw, token(uid, pw(uid)))["authenticated"] is True
    text = metrics(gw)
    assert metric_value(text, "authn_gateway_backend_calls_total", outcome="unavailable") == 0
