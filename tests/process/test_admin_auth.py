"""Failed admin authentications are counted and limited (issue 29, finding 12).

Before, ``admin.token: "a"`` was found by guessing and 2,778 wrong guesses a second
were answered 401, none counted or slowed. Now the token must be strong
(tests/{process,unit}/test_secrets.py), and every failure is counted and limited per source address
and overall, while an operator at a clean address still gets in. The guard's rules are
checked on its own clock; the numbers on a real server over real sockets.
"""

from __future__ import annotations

import base64
import os
import subprocess
import sys
import time
from collections.abc import Iterator

import httpx
import pytest

from tests.support.admin_auth_helpers import TOKEN
from tests.support.procs import GatewayProcess, free_port, metric_value, start_gateway

DEMO = {"name": "demo", "type": "static", "tokens": [{"token": "t", "username": "u"}]}


@pytest.fixture
def gateway(tmp_path: os.PathLike[str]) -> Iterator[tuple[GatewayProcess, int]]:
    from pathlib import Path

    ops_port = free_port()
    gw = start_gateway(
        {
            "server": {"ops": {"port": ops_port}},
            "admin": {"enabled": True, "token": TOKEN},
            "backends": [DEMO],
        },
        Path(tmp_path),
    )
    deadline = time.monotonic() + 30
    while "Application startup complete" not in gw.logs():
        assert gw.proc.poll() is None and time.monotonic() < deadline, gw.logs()
        time.sleep(0.05)
    yield gw, ops_port
    gw.stop()


def test_guessing_over_one_connection_is_counted_and_stops_being_checked(
    gateway: tuple[GatewayProcess, int],
) -> None:
    gw, ops_port = gateway
    ops = f"http://127.0.0.1:{ops_port}"
    statuses: list[int] = []
    started = time.monotonic()
    with httpx.Client(base_url=ops, timeout=10) as client:
        for i in range(300):
            guess = base64.b64encode(i.to_bytes(32, "big")).decode()
            statuses.append(
                client.get("/admin/deny", headers={"authorization": f"Bearer {guess}"}).status_code
            )
    elapsed = time.monotonic() - started
    checked = statuses.count(401)
    # At most the burst, plus one per 6 s the loop took, was ever compared.
    assert checked <= 10 + elapsed / 6 + 1, (checked, elapsed)
    assert statuses.count(429) == 300 - checked, sorted(set(statuses))
    scrape = httpx.get(f"{ops}/metrics", timeout=5).text
    name = "authn_gateway_admin_auth_failures_total"
    assert metric_value(scrape, name, reason="wrong") == checked, scrape
    assert metric_value(scrape, name, reason="throttled") == 300 - checked
    logs = gw.wait_for_log("admin API: credentials refused (throttled) from 127.0.0.1")
    assert "admin API: credentials refused (wrong) from 127.0.0.1" in logs
    assert logs.count("admin API: credentials refused") <= 4, logs  # rate-limited
    assert TOKEN not in logs

    # The operator, at another address, gets in meanwhile.
    transport = httpx.HTTPTransport(local_address="127.0.0.2")
    with httpx.Client(base_url=ops, transport=transport, timeout=10) as operator:
        answer = operator.get("/admin/deny", headers={"authorization": f"Bearer {TOKEN}"})
    assert answer.status_code == 200, answer.text
    # The guesser's own address, right token included, is still told to wait; the CLI
    # says for how long.
    throttled = httpx.get(f"{ops}/admin/deny", headers={"authorization": f"Bearer {TOKEN}"})
    assert throttled.status_code == 429
    assert 1 <= int(throttled.headers["retry-after"]) <= 6
    cli = subprocess.run(
        [sys.executable, "-m", "authn_gateway", "admin", "--url", ops, "denied"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "AUTHN_GATEWAY_ADMIN_TOKEN": TOKEN},
    )
    assert cli.returncode == 1, cli.stdout + cli.stderr
    assert "HTTP 429: too many failed admin authentications" in cli.stderr, cli.stderr
    assert "(retry after " in cli.stderr, cli.stderr
