"""The LDAP backend against a real OpenLDAP (tests/support/slapd.py), mostly through a
real gateway process."""

from __future__ import annotations

import asyncio
import base64
import socket
import uuid
from pathlib import Path

import pytest

from authn_gateway.config import ConfigError, parse_config
from backends.base import Rejected, Unavailable
from backends.ldap import (
    AD_IN_CHAIN,
    LDAPGroupSettings,
    LDAPSettings,
    dn_with,
    filter_with,
    group_name,
    parse_token,
    result_failure,
    text_values,
)
from tests.support.ldap_helpers import _config, backend_for, pw, token
from tests.support.procs import free_port
from tests.support.slapd import (
    SERVICE_PASSWORD,
)


@pytest.mark.parametrize(
    "tok",
    [
        "not base64!",
        "YWxpY2U",  # base64 of "alice" with the padding cut off
        base64.b64encode(b"alice").decode(),  # no colon
        token("", "alice-pw"),
        token("alice", ""),
        token("   ", "alice-pw"),
        token("alice\x00", "alice-pw"),
        token("ali\nce", "alice-pw"),
        base64.b64encode(b"\xffalice:pw").decode(),  # not UTF-8
    ],
)
def test_malformed_tokens_and_empty_parts_are_refused_locally(tok: str) -> None:
    assert parse_token(tok) is None


def test_password_keeps_every_colon_after_the_first() -> None:
    creds = parse_token(token("bob", "a:b:c"))
    assert creds is not None
    assert (creds.username, creds.password) == ("bob", "a:b:c")
    assert "a:b:c" not in repr(creds)


def test_plain_token_format_takes_username_colon_password_as_is() -> None:
    creds = parse_token("alice:pw", "plain")
    assert creds is not None and creds.username == "alice"


@pytest.mark.parametrize(
    ("value", "escaped"),
    [
        ("*", "\\2a"),
        (")(uid=*", "\\29\\28uid=\\2a"),
        ("\\00", "\\5c00"),
        ("a\x00b", "a\\00b"),
    ],
)
def test_filter_values_are_escaped_per_rfc_4515(value: str, escaped: str) -> None:
    assert filter_with("(uid={username})", username=value) == f"(uid={escaped})"


@pytest.mark.parametrize(
    ("value", "escaped"),
    [
        ("ann,lee+x=1", "ann\\,lee\\+x\\=1"),
        ('a"b;c<d>e\\f', 'a\\"b\\;c\\<d\\>e\\\\f'),
        ("#x", "\\#x"),
        (" lead", "\\ lead"),
        ("trail ", "trail\\ "),
        ("a\x00b", "a\\00b"),
    ],
)
def test_dn_values_are_escaped_per_rfc_4514(value: str, escaped: str) -> None:
    assert dn_with("uid={username},dc=x", value) == f"uid={escaped},dc=x"


def test_group_name_is_the_unescaped_first_rdn_value_or_the_whole_dn() -> None:
    assert group_name("cn=Smith\\, John,ou=g,dc=x", "cn") == "Smith, John"
    assert group_name("cn=a\\2Cb,ou=g,dc=x", "cn") == "a,b"
    assert group_name("ou=teams,dc=x", "cn") == "ou=teams,dc=x"


def test_binary_values_become_text_and_ad_guids_their_canonical_form() -> None:
    guid = uuid.UUID("2c1f0e6a-7b3d-4e5f-8a9b-0c1d2e3f4a5b")
    assert text_values("objectGUID", [guid.bytes_le]) == [str(guid)]
    assert text_values("jpegPhoto", [b"\xff\xd8"]) == ["/9g="]
    assert text_values("mail", ["é@x".encode()]) == ["é@x"]


def test_ad_nested_groups_use_the_matching_rule_in_chain() -> None:
    groups = LDAPGroupSettings(mode="search", base="dc=x", ad_nested=True)
    flt = filter_with(groups.search_filter, dn="CN=Smith\\, J (x),DC=x")
    assert flt == f"(member:{AD_IN_CHAIN}:=CN=Smith\\5c, J \\28x\\29,DC=x)"


@pytest.mark.parametrize(
    ("code", "name", "misconfigured"),
    [(51, "busy", False), (52, "unavailable", False), (3, "timeLimitExceeded", False),
     (50, "insufficientAccessRights", True), (32, "noSuchObject", True)],
)  # fmt: skip
def test_server_result_codes_mean_unavailable(code: int, name: str, misconfigured: bool) -> None:
    failure = result_failure({"result": code, "description": name}, "user search")
    assert failure == Unavailable(f"user search: {name} ({code})", misconfigured=misconfigured)


@pytest.mark.parametrize(
    ("backend", "problem"),
    [
        ({"url": "ldap://dc1", "user_dn_template": "uid={username}"}, "sends passwords in clear"),
        (
            {"url": "ldaps://dc1", "start_tls": "true", "user_dn_template": "uid={username}"},
            "start_tls: not with ldaps://",
        ),
        ({"url": "ldaps://dc1", "user_base": "dc=x"}, "bind_dn: required"),
        ({"url": "ldaps://dc1", "user_dn_template": "uid=x"}, "must contain {username}"),
        ({"url": "ldaps://dc1"}, "exactly one of user_base or user_dn_template"),
        ({"url": "https://dc1", "user_dn_template": "uid={username}"}, "url"),
        (
            {
                "url": "ldaps://dc1",
                "user_dn_template": "uid={username}",
                "groups": "{mode: search}",
            },
            "base: required when mode is search",
        ),
    ],
)
def test_invalid_ldap_settings_are_refused_naming_the_field(
    backend: dict[str, str], problem: str
) -> None:
    with pytest.raises(ConfigError) as err:
        parse_config(_config(**backend), "gw.yaml")
    assert problem in str(err.value)
    assert str(err.value).startswith("gw.yaml: backends[0]")


def test_bind_password_comes_from_a_secret_file(service_password_file: Path) -> None:
    config = parse_config(
        _config(url="ldaps://dc1", bind_dn="cn=gw", bind_password=f"file:{service_password_file}",
                user_base="dc=x"),
        "gw.yaml",
    )  # fmt: skip
    backend = config.backends[0]
    assert isinstance(backend, LDAPSettings) and backend.bind_password is not None
    assert backend.bind_password.get_secret_value() == SERVICE_PASSWORD
    assert SERVICE_PASSWORD not in repr(backend)


def test_an_empty_bind_password_is_refused_naming_the_field(tmp_path: Path) -> None:
    # An LDAP simple bind with a DN and an empty password is an unauthenticated bind
    # (RFC 4513 5.1.2): a missing Secret key would have bound as nobody.
    empty = tmp_path / "empty"
    empty.write_text("\n")
    for value in ("''", f"file:{empty}"):
        with pytest.raises(ConfigError) as err:
            parse_config(
                _config(url="ldaps://dc1", bind_dn="cn=gw", bind_password=value, user_base="dc=x"),
                "gw.yaml",
            )
        assert "backends[0].bind_password: must not be empty" in str(err.value), str(err.value)


async def test_empty_password_is_rejected_without_any_connection(
    service_password_file: Path,
) -> None:
    # Nothing listens there: any attempt to connect would answer "unavailable".
    backend = backend_for(
        f"ldap://127.0.0.1:{free_port()}", service_password_file, allow_plaintext=True
    )
    try:
        assert not backend.could_accept(token("alice", ""))
        assert await backend.authenticate(token("alice", "")) == Rejected(
            "token is not username:password with both parts set"
        )
        assert backend.pool is not None and backend.pool.opened == 0
    finally:
        await backend.close()


async def test_a_server_that_never_answers_times_out_without_blocking_the_loop(
    service_password_file: Path,
) -> None:
    # Accepts connections (the kernel completes the handshake) and never says a word.
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(16)
        port = silent.getsockname()[1]
        backend = backend_for(
            f"ldap://127.0.0.1:{port}", service_password_file, allow_plaintext=True
        )
        ticks = 0

        async def ticker() -> None:
            nonlocal ticks
            while True:
                await asyncio.sleep(0.01)
                ticks += 1

        task = asyncio.create_task(ticker())
        try:
            outcome = await backend.authenticate(token("alice", pw("alice")))
        finally:
            task.cancel()
            await backend.close()
    assert outcome == Unavailable("timed out", timed_out=True)
    # The 0.5 s wait happened in a worker thread: the event loop kept running.
    assert ticks >= 5
