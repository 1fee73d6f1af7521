"""No empty or weak credential is ever accepted (issue 29, finding 1 and 12).

Every secret the config takes is refused when it is empty or only whitespace once its
``env:`` or ``file:`` reference is read, naming the field and never the value. The
ones the operator generates (the gateway secret, previous secrets, caller tokens, the
admin token) must also pass the fleet secret's strength rule. An empty bearer matches
nothing on a running server, and a reload to a config with an empty secret is refused
while the running config keeps working.
"""

from __future__ import annotations

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

from tests.support.procs import GatewayProcess, free_port, review_body, start_gateway
from tests.support.secrets_helpers import STATIC, ldap, random_secret

DEMO_TOKEN = "demo-dev-token"

DEMO = {
    "name": "demo",
    "type": "static",
    "tokens": [{"token": DEMO_TOKEN, "username": "demo-dev", "uid": "1"}],
}


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
            "admin.token: too weak (too few distinct characters: 7; too short: 7 characters)",
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
