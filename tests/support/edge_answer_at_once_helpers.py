"""Helpers shared by the tiers of test_edge_answer_at_once."""

from __future__ import annotations

import json
import socket
from typing import Any

from tests.support.procs import GatewayProcess, review_body
from tests.support.rawhttp import Reader


def body(token: str, **kw: Any) -> bytes:
    return json.dumps(review_body(token, **kw)).encode()


def connect(gw: GatewayProcess) -> tuple[socket.socket, Reader]:
    sock = socket.create_connection(("127.0.0.1", gw.port), timeout=10)
    return sock, Reader(sock)
