"""Helpers shared by the tiers of test_edge_bound."""

from __future__ import annotations

import json
import time

from tests.support.procs import GatewayProcess, review_body
from tests.support.rawhttp import request


def started(gw: GatewayProcess) -> GatewayProcess:
    deadline = time.monotonic() + 30
    while "Application startup complete" not in gw.logs():
        assert gw.proc.poll() is None and time.monotonic() < deadline, gw.logs()
        time.sleep(0.05)
    return gw


def assert_no_traceback(gw: GatewayProcess) -> None:
    logs = gw.logs()
    assert "Traceback" not in logs and "Exception in ASGI" not in logs, logs[-3000:]


def review(token: str) -> bytes:
    return request(json.dumps(review_body(token)).encode())
