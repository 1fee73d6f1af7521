"""Reload a running gateway (tests/support/procs.py) with a new config file: write it,
send SIGHUP, and wait for the one line that says how the reload ended."""

from __future__ import annotations

import signal
import time
from dataclasses import dataclass

import httpx

from tests.support.procs import GatewayProcess, metric_value

REFUSED = "config reload refused"
APPLIED = "config reloaded from"


@dataclass(frozen=True)
class Reload:
    applied: bool
    #: What the gateway logged from the signal to the line that ended the reload.
    logs: str


def reload_with(gw: GatewayProcess, text: str, timeout: float = 20.0) -> Reload:
    """Write ``text`` as ``gw``'s config, SIGHUP it, and wait for its verdict."""
    before = gw.logs()
    gw.config_path.write_text(text)
    gw.proc.send_signal(signal.SIGHUP)
    deadline = time.monotonic() + timeout
    while True:
        logs = gw.logs()[len(before) :]
        if REFUSED in logs or APPLIED in logs:
            # The line is written a little after the swap; let the rest arrive.
            time.sleep(0.1)
            return Reload(APPLIED in logs, gw.logs()[len(before) :])
        assert gw.proc.poll() is None, f"the gateway exited:\n{gw.logs()}"
        assert time.monotonic() < deadline, f"no reload verdict in:\n{logs}"
        time.sleep(0.05)


def reloads(gw: GatewayProcess, result: str) -> float:
    """``authn_gateway_config_reloads_total{result=...}`` from the review port's /metrics."""
    text = httpx.get(f"{gw.url}/metrics", timeout=10).text
    return metric_value(text, "authn_gateway_config_reloads_total", result=result)


def authenticated(gw: GatewayProcess, token: str) -> str | None:
    """The username ``gw`` answers for ``token``, None if it is refused. Any answer but
    200 (an internal error among them) fails the test that asks."""
    answer = gw.review(token)
    assert answer.status_code == 200, answer.text
    assert "internal error" not in answer.text, answer.text
    status = answer.json()["status"]
    return status["user"]["username"] if status.get("authenticated") else None
