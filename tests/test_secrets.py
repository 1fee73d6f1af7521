"""No empty or weak credential is ever accepted (issue 29, finding 1 and 12).

Every secret the config takes is refused when it is empty or only whitespace once its
``env:`` or ``file:`` reference is read, naming the field and never the value. The
ones the operator generates (the gateway secret, previous secrets, caller tokens, the
admin token) must also pass the fleet secret's strength rule. An empty bearer matches
nothing on a running server, and a reload to a config with an empty secret is refused
while the running config keeps working.
"""

from __future__ import annotations

import base64
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from authn_gateway.config import ConfigError, parse_config
from tests.support.procs import GatewayProcess, free_port, review_body, start_gateway

STATIC = {"name": "demo", "type": "static", "tokens": [{"token": "t", "username": "u"}]}
STRONG = "test-only-Hn4Wq8zR2mK6vT1xB9cY3uL7aE5sD0fGjPiNbV"
OTHER_STRONG = "test-only-Zq3Xw8Lm5Nb2Vc7Kj4Hg9Fd1Sa6Pp0OoIiUuYy"
DEMO_TOKEN = "demo-dev-token"
DEMO = {
    "name": "demo",
    "type": "static",
    "tokens": [{"token": DEMO_TOKEN, "username": "demo-dev", "uid": "1"}],
}
# An env: reference set to the empty string, one set to whitespace, and an empty file.
EMPTY_ENV = "AUTHN_GW_TEST_EMPTY_SECRET"
BLANK_ENV = "AUTHN_GW_TEST_BLANK_SECRET"


def random_secret() -> str:
    return base64.b64encode(os.urandom(32)).decode()


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


def ldap(password: Any) -> dict[str, Any]:
    return {
        "name": "corp",
        "type": "ldap",
        "url": "ldaps://ldap.invalid",
        "bind_dn": "cn=gw,dc=example,dc=org",
        "bind_password": password,
        "user_base": "ou=people,dc=example,dc=org",
    }


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


def static(token: Any) -> dict[str, Any]:
    return {**STATIC, "tokens": [{"token": token, "username": "u"}]}


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


# --- check-config: exit code and one clean line -----------------------------------------


def check_config(path: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "authn_gateway", "check-config", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        env={**{k: v for k, v in os.environ.items() if k != "AUTHN_GATEWAY_SECRET"}, **env},
        stdin=subprocess.DEVNULL,
    )


def test_check_config_refuses_empty_and_weak_secrets_without_a_traceback_or_the_value(
    tmp_path: Path,
) -> None:
    empty_file = tmp_path / "admin-token"
    empty_file.write_text("\n")
    cases = [
        (
            {"server": {"caller_tokens": [{"name": "api", "token": ""}]}},
            {},
            "server.caller_tokens[0].token: must not be empty",
        ),
        (
            {"admin": {"enabled": True, "token": "env:GW_EMPTY_ADMIN"}},
            {"GW_EMPTY_ADMIN": ""},
            "admin.token: must not be empty (environment variable GW_EMPTY_ADMIN is empty",
        ),
        (
            {"admin": {"enabled": True, "token": f"file:{empty_file}"}},
            {},
            f"admin.token: must not be empty (secret file {empty_file} is empty",
        ),
        (
            {"admin": {"enabled": True, "token": "env:GW_WEAK_ADMIN"}},
            {"GW_WEAK_ADMIN": "Hunter2"},
            "admin.token: too weak (7 characters",
        ),
        (
            {"backends": [ldap("env:GW_EMPTY_BIND")]},
            {"GW_EMPTY_BIND": " "},
            "backends[0].bind_password: must not be empty",
        ),
    ]
    for doc, env, expected in cases:
        path = tmp_path / "gw.yaml"
        path.write_text(yaml.safe_dump({"backends": [STATIC], **doc}))
        result = check_config(path, env)
        out = result.stdout + result.stderr
        assert result.returncode == 1, (doc, out)
        assert "Traceback" not in out, out
        assert f"{path}: {expected}" in result.stderr, (expected, out)
        assert "Hunter2" not in out, out


def test_check_config_accepts_strong_generated_secrets(tmp_path: Path) -> None:
    path = tmp_path / "gw.yaml"
    doc = {
        "secret": "env:GW_SECRET",
        "server": {"caller_tokens": [{"name": "api", "token": random_secret()}]},
        "admin": {"enabled": True, "token": random_secret()},
        "backends": [DEMO],
    }
    path.write_text(yaml.safe_dump(doc))
    result = check_config(path, {"GW_SECRET": os.urandom(32).hex()})
    assert result.returncode == 0, result.stdout + result.stderr


def test_serve_refuses_to_start_with_an_empty_caller_or_admin_token(tmp_path: Path) -> None:
    # The configs from the finding: before, both served and let "Bearer " in.
    for doc, field in (
        ({"server": {"caller_tokens": [{"name": "api", "token": ""}]}}, "server.caller_tokens"),
        ({"admin": {"enabled": True, "token": ""}}, "admin.token"),
    ):
        path = tmp_path / "gw.yaml"
        path.write_text(yaml.safe_dump({"backends": [DEMO], **doc}))
        result = subprocess.run(
            [sys.executable, "-m", "authn_gateway", "serve", "--config", str(path)],
            capture_output=True,
            text=True,
            timeout=60,
            stdin=subprocess.DEVNULL,
        )
        out = result.stdout + result.stderr
        assert result.returncode == 1, out
        assert "Traceback" not in out and "Uvicorn running" not in out, out
        assert field in result.stderr and "must not be empty" in result.stderr, out


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


# --- a real server: an empty bearer matches nothing --------------------------------------


@pytest.fixture
def start(tmp_path: Path) -> Iterator[Callable[[dict[str, Any]], GatewayProcess]]:
    started: list[GatewayProcess] = []

    def run(config: dict[str, Any]) -> GatewayProcess:
        gw = start_gateway(config, tmp_path)
        started.append(gw)
        # The socket is bound before start-up completes.
        wait_for(gw, "Application startup complete", 1, 30)
        return gw

    yield run
    for gw in started:
        gw.stop()


def wait_for(gw: GatewayProcess, text: str, count: int, seconds: float = 15.0) -> str:
    deadline = time.monotonic() + seconds
    while True:
        logs = gw.logs()
        if logs.count(text) >= count:
            return logs
        assert gw.proc.poll() is None, f"the gateway exited:\n{logs}"
        assert time.monotonic() < deadline, f"{text!r} not seen {count}x in:\n{logs}"
        time.sleep(0.05)


def raw_status(port: int, method: str, path: str, authorization: str, body: bytes = b"") -> int:
    """The status of one request sent byte for byte (httpx refuses a header value with
    trailing whitespace, which is what ``curl -H 'Authorization: Bearer '`` sends)."""
    head = (
        f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: {authorization}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
        "Connection: close\r\n\r\n"
    )
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(head.encode() + body)
        answer = b""
        while b"\r\n" not in answer:
            chunk = sock.recv(4096)
            assert chunk, f"connection closed after {answer!r}"
            answer += chunk
    return int(answer.split(b" ", 2)[1])


def review(gw: GatewayProcess, authorization: str) -> int:
    body = json.dumps(review_body(DEMO_TOKEN)).encode()
    return raw_status(gw.port, "POST", "/authenticate", authorization, body)


def admin_list(port: int, authorization: str) -> int:
    return raw_status(port, "GET", "/admin/deny", authorization)


EMPTY_BEARERS = ("Bearer ", "Bearer", "bearer    ", "Bearer \t")


def test_a_running_gateway_refuses_an_empty_bearer_from_callers_and_at_the_admin_api(
    start: Callable[[dict[str, Any]], GatewayProcess],
) -> None:
    caller, admin = random_secret(), random_secret()
    ops_port = free_port()
    gw = start(
        {
            "server": {
                "caller_tokens": [{"name": "api", "token": caller}],
                "ops": {"port": ops_port},
            },
            "admin": {"enabled": True, "token": admin},
            "backends": [DEMO],
        }
    )
    for empty in EMPTY_BEARERS:
        assert review(gw, empty) == 401, repr(empty)
        assert admin_list(ops_port, empty) == 401, repr(empty)
    accepted = httpx.post(
        f"{gw.url}/authenticate",
        json=review_body(DEMO_TOKEN),
        headers={"authorization": f"Bearer {caller}"},
    )
    assert accepted.status_code == 200, accepted.text
    assert accepted.json()["status"]["user"]["username"] == "demo-dev"
    assert admin_list(ops_port, f"Bearer {admin}") == 200
    # Each door has its own token.
    assert admin_list(ops_port, f"Bearer {caller}") == 401
    assert review(gw, f"Bearer {admin}") == 401


# --- reload: an empty secret is refused, the running config kept --------------------------


def test_a_reload_to_an_emptied_secret_file_is_refused_and_the_running_tokens_keep_working(
    tmp_path: Path, start: Callable[[dict[str, Any]], GatewayProcess]
) -> None:
    caller, admin = random_secret(), random_secret()
    caller_file, admin_file = tmp_path / "caller-token", tmp_path / "admin-token"
    caller_file.write_text(caller + "\n")
    admin_file.write_text(admin + "\n")
    ops_port = free_port()
    gw = start(
        {
            "server": {
                "caller_tokens": [{"name": "api", "token": f"file:{caller_file}"}],
                "ops": {"port": ops_port},
            },
            "admin": {"enabled": True, "token": f"file:{admin_file}"},
            "backends": [DEMO],
        }
    )
    assert review(gw, f"Bearer {caller}") == 200

    # The Secret's keys go missing: a mounted file is emptied, then a SIGHUP.
    emptied_files = ((caller_file, "server.caller_tokens[0].token"), (admin_file, "admin.token"))
    for emptied, field in emptied_files:
        kept = emptied.read_text()
        emptied.write_text("")
        refusals = gw.logs().count("config reload refused")
        gw.proc.send_signal(signal.SIGHUP)
        logs = wait_for(gw, "config reload refused", refusals + 1)
        assert f"{field}: must not be empty (secret file {emptied} is empty" in logs, logs
        # Still the running config: the real tokens work, an empty bearer does not.
        assert review(gw, f"Bearer {caller}") == 200
        assert admin_list(ops_port, f"Bearer {admin}") == 200
        for empty in EMPTY_BEARERS:
            assert review(gw, empty) == 401, repr(empty)
            assert admin_list(ops_port, empty) == 401, repr(empty)
        emptied.write_text(kept)
    assert "config reloaded" not in gw.logs()
    assert caller not in gw.logs() and admin not in gw.logs()
