"""No empty or weak credential is ever accepted (issue 29, finding 1 and 12).

Every secret the config takes is refused when it is empty or only whitespace once its
``env:`` or ``file:`` reference is read, naming the field and never the value. The
ones the operator generates (the gateway secret, previous secrets, caller tokens, the
admin token) must also pass the fleet secret's strength rule. An empty bearer matches
nothing on a running server, and a reload to a config with an empty secret is refused
while the running config keeps working.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from authn_gateway.config import ConfigError, parse_config
from tests.support.secrets_helpers import STATIC, ldap, random_secret, static

STRONG = "test-only-Hn4Wq8zR2mK6vT1xB9cY3uL7aE5sD0fGjPiNbV"

# An env: reference set to the empty string, one set to whitespace, and an empty file.
EMPTY_ENV = "AUTHN_GW_TEST_EMPTY_SECRET"

BLANK_ENV = "AUTHN_GW_TEST_BLANK_SECRET"


def keystone(password: Any) -> dict[str, Any]:
    return {
        "name": "ks",
        "type": "keystone",
        "auth_url": "https://keystone.invalid:5000/v3",
        "service": {"username": "gw", "password": password, "system_scope": "all"},
    }


def keystone_appcred(secret: Any) -> dict[str, Any]:
    service = {"application_credential_id": "abc", "application_credential_secret": secret}
    return {**keystone("x"), "service": service, "groups": {"enabled": False}}


def introspection(secret: Any) -> dict[str, Any]:
    return {
        "name": "opaque",
        "type": "introspection",
        "url": "https://idp.invalid/introspect",
        "client_id": "gw",
        "client_secret": secret,
        "accept": {"client_ids": ["cli"]},
        "claimMappings": {"username": {"claim": "sub", "prefix": ""}},
    }


# (where the secret goes, the field the error must name). ``put(doc, value)`` writes it.
FIELDS: list[tuple[str, Any, str]] = [
    ("gateway secret", lambda d, v: d.update(secret=v), "secret"),
    (
        "previous secret",
        lambda d, v: d.update(secret=STRONG, previous_secrets=[v]),
        "previous_secrets[0]",
    ),
    (
        "caller token",
        lambda d, v: d.update(server={"caller_tokens": [{"name": "api", "token": v}]}),
        "server.caller_tokens[0].token",
    ),
    ("admin token", lambda d, v: d.update(admin={"enabled": True, "token": v}), "admin.token"),
    (
        "redis password",
        lambda d, v: d.update(secret=STRONG, redis={"url": "redis://127.0.0.1:1/0", "password": v}),
        "redis.password",
    ),
    (
        "keystone password",
        lambda d, v: d.update(backends=[keystone(v)]),
        "backends[0].service.password",
    ),
    (
        "keystone application credential",
        lambda d, v: d.update(backends=[keystone_appcred(v)]),
        "backends[0].service.application_credential_secret",
    ),
    (
        "ldap bind password",
        lambda d, v: d.update(backends=[ldap(v)]),
        "backends[0].bind_password",
    ),
    (
        "introspection client secret",
        lambda d, v: d.update(backends=[introspection(v)]),
        "backends[0].client_secret",
    ),
    ("static token", lambda d, v: d.update(backends=[static(v)]), "backends[0].tokens[0].token"),
]

IDS = [name for name, _, _ in FIELDS]


def config_with(put: Any, value: str) -> str:
    doc: dict[str, Any] = {"backends": [STATIC]}
    put(doc, value)
    return yaml.safe_dump(doc)


def problems(text: str) -> list[str]:
    with pytest.raises(ConfigError) as err:
        parse_config(text, "gw.yaml")
    return err.value.problems


@pytest.fixture
def empty_sources(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    monkeypatch.setenv(EMPTY_ENV, "")
    monkeypatch.setenv(BLANK_ENV, " \t ")
    monkeypatch.delenv("AUTHN_GATEWAY_SECRET", raising=False)
    empty_file = tmp_path / "empty"
    empty_file.write_text("")
    newline_file = tmp_path / "newline"
    newline_file.write_text("\n  \n")
    return {
        "literal": "",
        "whitespace": "   ",
        "env-empty": f"env:{EMPTY_ENV}",
        "env-whitespace": f"env:{BLANK_ENV}",
        "file-empty": f"file:{empty_file}",
        "file-newlines": f"file:{newline_file}",
    }


@pytest.mark.parametrize(
    "source",
    ["literal", "whitespace", "env-empty", "env-whitespace", "file-empty", "file-newlines"],
)
@pytest.mark.parametrize(("what", "put", "field"), FIELDS, ids=IDS)
def test_every_secret_is_refused_when_empty_after_resolution(
    empty_sources: dict[str, str], source: str, what: str, put: Any, field: str
) -> None:
    found = problems(config_with(put, empty_sources[source]))
    mine = [p for p in found if p.startswith(f"{field}: ")]
    assert mine, f"{what} from {source}: no problem names {field}; saw {found}"
    assert "empty" in mine[0], mine


@pytest.mark.parametrize(("what", "put", "field"), FIELDS, ids=IDS)
def test_every_secret_takes_a_strong_value(
    what: str, put: Any, field: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("AUTHN_GATEWAY_SECRET", raising=False)
    assert parse_config(config_with(put, random_secret()), "gw.yaml") is not None, what


GENERATED = [
    f
    for f in FIELDS
    if f[0] in ("gateway secret", "previous secret", "caller token", "admin token")
]


@pytest.mark.parametrize(
    "weak",
    [
        "a",
        "Hunter2-admin",
        "0123456789abcdef" * 2,  # 16 bytes in hex
        "REPLACE-with-32-random-bytes-base64",
        "a" * 64,
    ],
)
@pytest.mark.parametrize(("what", "put", "field"), GENERATED, ids=[f[0] for f in GENERATED])
def test_secrets_the_operator_generates_follow_the_fleet_secret_strength_rule(
    weak: str, what: str, put: Any, field: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("AUTHN_GATEWAY_SECRET", raising=False)
    found = problems(config_with(put, weak))
    mine = [p for p in found if p.startswith(f"{field}: ")]
    assert mine, f"{what}: no problem names {field}; saw {found}"
    assert "head -c 32 /dev/urandom | base64" in mine[0], mine
    if len(weak) > 1:  # "a" is in any sentence
        assert all(weak not in p for p in found), found


def test_backend_passwords_set_by_the_idp_are_not_held_to_the_strength_rule() -> None:
    # The IdP's owner chose them; only "empty" is ours to refuse.
    for backend in (keystone("pw"), ldap("pw"), introspection("pw"), static("t")):
        assert parse_config(yaml.safe_dump({"backends": [backend]}), "gw.yaml").backends


@pytest.mark.parametrize("value", ["", "  ", "short"])
def test_the_secret_from_the_environment_is_refused_when_empty_or_weak(
    value: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AUTHN_GATEWAY_SECRET", value)
    [problem] = problems(yaml.safe_dump({"backends": [STATIC]}))
    assert problem.startswith("secret (from AUTHN_GATEWAY_SECRET): "), problem


def test_an_empty_bearer_matches_no_empty_token_that_bypassed_the_config() -> None:
    # Defence in depth: settings built without validation (model_construct) still never
    # let an empty bearer through the comparison.
    from pydantic import SecretStr

    from authn_gateway.config import CallerToken, ServerSettings
    from authn_gateway.edge.callerauth import CallerAuth, bearer_token

    empty = CallerToken.model_construct(name="api", token=SecretStr(""))
    auth = CallerAuth(ServerSettings.model_construct(caller_tokens=[empty], tls=None))
    assert auth.required
    for header in (b"Bearer ", b"Bearer", b"bearer \t ", b"Bearer  "):
        assert bearer_token(header) is None, header
        assert auth.identify((), header) is None, header
    assert bearer_token(b"Basic abc") is None
    assert bearer_token(b"Bearer  abc ") == b"abc"
