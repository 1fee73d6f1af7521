"""What clients that pipeline requests and never read the answers cost the gateway.

    python -m loadtests.pipeflood --connections 200 --seconds 20

Starts ``authn-gateway serve`` (plain HTTP, a static backend, an ops port) once
once per flood, and floods it from N connections that each pipeline one request over
and over without reading a byte: cached reviews on the review port, reviews without
credentials on a review port with ``server.caller_tokens`` (401s), and ``GET /healthz``
on the ops port; and cached reviews with a head and body near the default limits
(``review-largest``). Meanwhile another client sends one review at a time. Prints the
server's RSS before and at its peak, per flooding connection, when the server closed the
flooding connections (``server.send_timeout_seconds``, 10 s by default) and how the
other client's reviews fared. docs/operations.md ("Connections and timeouts") states
the bound these figures are measured against.
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from tests.support.flood import FloodResult, flood
from tests.support.procs import review_body, start_gateway

TOKEN = "t" * 16
STATIC = {"name": "demo", "type": "static", "tokens": [{"token": TOKEN, "username": "u"}]}
CALLER_TOKEN = "caller-test-only-Wq2Zp9Xk4Lm7Vt1Nc8Bh3Dy6Fs5Gj0RuE"
REVIEW = json.dumps(review_body(TOKEN)).encode()


def post(extra: bytes = b"") -> bytes:
    return (
        b"POST /authenticate HTTP/1.1\r\nhost: gw\r\ncontent-type: application/json\r\n"
        b"content-length: %d\r\n%s\r\n" % (len(REVIEW), extra) + REVIEW
    )


def largest() -> bytes:
    """A cached review with the largest head and body the default limits let through."""
    body = json.dumps({**review_body(TOKEN), "pad": "p" * (60 * 1024)}).encode()
    pad = b"".join(b"x-pad-%02d: %s\r\n" % (i, b"v" * 220) for i in range(60))
    return (
        b"POST /authenticate HTTP/1.1\r\nhost: gw\r\ncontent-type: application/json\r\n"
        b"content-length: %d\r\n%s\r\n" % (len(body), pad) + body
    )


FLOODS = {
    "review": (post(), False, False),
    "review-largest": (largest(), False, False),
    "review-401": (post(), True, False),
    "ops-healthz": (b"GET /healthz HTTP/1.1\r\nhost: gw\r\n\r\n", False, True),
}


def ops_port(logs: str) -> int:
    for line in logs.splitlines():
        if "ops listener" in line:
            return int(line.rsplit(":", 1)[1])
    raise RuntimeError(f"no ops listener in the log:\n{logs}")


def config(callers: bool, connections: int, send_timeout: float) -> dict[str, Any]:
    server: dict[str, Any] = {
        "ops": {"port": 0},
        "max_connections": connections + 50,
        "send_timeout_seconds": send_timeout,
    }
    if callers:
        server["caller_tokens"] = [{"name": "apiserver", "token": CALLER_TOKEN}]
    return {"logging": {"reviews": False}, "server": server, "backends": [STATIC]}


def run_flood(
    name: str,
    connections: int,
    seconds: float,
    send_timeout: float,
    workdir: Path,
    receive_buffer: int | None = None,
) -> tuple[FloodResult, str]:
    """One flood against a fresh gateway; the result and the gateway's log."""
    request, callers, on_ops = FLOODS[name]
    gw = start_gateway(config(callers, connections, send_timeout), workdir, name=name)
    try:
        deadline = time.monotonic() + 30
        while "Application startup complete" not in gw.logs():
            if time.monotonic() > deadline:
                raise RuntimeError(gw.logs())
            time.sleep(0.05)
        headers = {"authorization": f"Bearer {CALLER_TOKEN}"} if callers else {}
        client = httpx.Client(timeout=5, headers=headers)

        def other() -> None:
            answer = client.post(f"{gw.url}/authenticate", json=review_body(TOKEN))
            if answer.status_code != 200 or not answer.json()["status"]["authenticated"]:
                raise AssertionError(f"{answer.status_code} {answer.text}")

        other()  # the token is cached before the flood
        time.sleep(1)  # RSS after start-up settles
        port = ops_port(gw.logs()) if on_ops else gw.port
        result = flood(
            port, request, gw.proc.pid, seconds, connections, other, receive_buffer=receive_buffer
        )
        client.close()
        return result, gw.logs()
    finally:
        gw.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--connections", type=int, default=100)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--send-timeout", type=float, default=10.0)
    parser.add_argument("--flood", choices=sorted(FLOODS), action="append")
    parser.add_argument(
        "--receive-buffer",
        type=int,
        help="SO_RCVBUF of the flooding sockets (small: the answers back up sooner)",
    )
    args = parser.parse_args(argv)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, max(soft, args.connections + 200)), hard))
    with tempfile.TemporaryDirectory(prefix="authn-pipeflood-") as tmp:
        for name in args.flood or sorted(FLOODS):
            result, _ = run_flood(
                name,
                args.connections,
                args.seconds,
                args.send_timeout,
                Path(tmp),
                args.receive_buffer,
            )
            print(f"{name}: {result.summary()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
