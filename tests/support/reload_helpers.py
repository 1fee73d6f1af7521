"""Reload a running gateway (tests/support/procs.py) with a new config file: write it,
send SIGHUP, and wait for the one line that says how the reload ended."""

from __future__ import annotations

import signal
import time
from dataclasses import dataclass

import httpx

from tests.support.procs import GatewayProcess, metric_value

REFUSED = "config reload refused"


@dataclass(frozen=True)
class Reload:
    applied: bool
    #: What the gateway logged from the signal to the line that ended the reload.
    logs: str


def reload_with(gw: GatewayProcess, text: str, timeout: float = 20.0) -> Reload:
    """Write ``text`` as ``gw``'s config, SIGHUP it, and wait for its verdict: the
    reload counters (a config may set logging.level past the info line of an applied
    reload), then, for a refusal, its line."""
    before = gw.logs()
    counts = reloads(gw, "applied"), reloads(gw, "refused")
    # As check-config's fuzz writes it: a lone surrogate goes to the file as its bytes.
    gw.config_path.write_bytes(text.encode("utf-8", "surrogatepass"))
    gw.proc.send_signal(signal.SIGHUP)
    deadline = time.monotonic() + timeout
    while True:
        now = reloads(gw, "applied"), reloads(gw, "refused")
        logs = gw.logs()[len(before) :]
        if now[0] > counts[0] or (now[1] > counts[1] and REFUSED in logs):
            assert now[0] + now[1] == counts[0] + counts[1] + 1, (counts, now)
            return Reload(now[0] > counts[0], logs)
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
