"""A counting, fault-injecting HTTP proxy in front of Keystone, for tests.

It runs uvicorn in a thread of the test process and forwards each request to the
real Keystone, unless a fault is switched on:

* ``delay``        - wait ``delay_seconds``, then forward (a slow Keystone);
* ``unauthorized`` - answer Keystone's own 401 to every request that carries
  ``X-Auth-Token`` (the service token is refused); logins pass through;
* ``hang``         - answer nothing until the mode changes (Keystone timing out);
  then a 504, long after any caller gave up.

Every request is counted by kind ("login", "validate", "groups", "other") whatever
the mode: the counts are what Keystone's front door received.
"""

from __future__ import annotations

import asyncio
import re
import threading
import time
from collections import Counter
from typing import Any, Literal

import httpx
import uvicorn

from tests.support.procs import free_port, wait_for_port

Mode = Literal["pass", "delay", "unauthorized", "hang"]

_GROUPS = re.compile(r"^/v3/users/[^/]+/groups$")
_HOP = {"connection", "keep-alive", "transfer-encoding", "content-length", "host"}
_UNAUTHORIZED = (
    b'{"error":{"code":401,"message":"The request you have made requires '
    b'authentication.","title":"Unauthorized"}}'
)


def kind_of(method: str, path: str) -> str:
    if path == "/v3/auth/tokens":
        return {"POST": "login", "GET": "validate", "HEAD": "check"}.get(method, "other")
    if method == "GET" and _GROUPS.match(path):
        return "groups"
    return "other"


class KeystoneProxy:
    def __init__(self, upstream: str) -> None:
        """``upstream`` is Keystone's origin, e.g. http://127.0.0.1:5000."""
        self.upstream = upstream.rstrip("/")
        self.port = free_port()
        self.mode: Mode = "pass"
        self.delay_seconds = 0.0
        self._lock = threading.Lock()
        self.counts: Counter[str] = Counter()
        # (method, path, query) of each request; never headers, which hold tokens.
        self.requests: list[tuple[str, str, str]] = []
        self._client: httpx.AsyncClient | None = None
        config = uvicorn.Config(
            self._app,
            host="127.0.0.1",
            port=self.port,
            log_level="warning",
            lifespan="off",
            interface="asgi3",
            timeout_graceful_shutdown=1,
        )
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v3"

    def start(self) -> KeystoneProxy:
        self._thread.start()
        wait_for_port(self.port)
        return self

    def stop(self) -> None:
        self.mode = "pass"
        self._server.should_exit = True
        self._thread.join(timeout=10)

    def snapshot(self) -> Counter[str]:
        with self._lock:
            return Counter(self.counts)

    def since(self, before: Counter[str]) -> Counter[str]:
        now = self.snapshot()
        now.subtract(before)
        return +now

    def set(self, mode: Mode, delay_seconds: float = 0.0) -> None:
        self.delay_seconds = delay_seconds
        self.mode = mode

    async def _app(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        method, path = scope["method"], scope["path"]
        query = scope.get("query_string", b"").decode()
        with self._lock:
            self.counts[kind_of(method, path)] += 1
            self.requests.append((method, path, query))
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        headers = {k.decode().lower(): v.decode() for k, v in scope["headers"]}
        mode = self.mode
        if mode == "unauthorized" and "x-auth-token" in headers:
            await _answer(
                send,
                401,
                _UNAUTHORIZED,
                [(b"www-authenticate", f'Keystone uri="{self.upstream}/v3"'.encode())],
            )
            return
        if mode == "hang":
            # Bounded: a hung request ends when the test changes the mode, or after 60 s.
            deadline = time.monotonic() + 60
            while self.mode == "hang" and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            await _answer(send, 504, b"")
            return
        if mode == "delay":
            await asyncio.sleep(self.delay_seconds)
        if self._client is None:
            # A new connection per request: uWSGI closes each one without saying so.
            self._client = httpx.AsyncClient(
                timeout=60, trust_env=False, limits=httpx.Limits(max_keepalive_connections=0)
            )
        try:
            response = await self._client.request(
                method,
                f"{self.upstream}{path}" + (f"?{query}" if query else ""),
                content=body,
                headers={k: v for k, v in headers.items() if k not in _HOP},
            )
        except httpx.HTTPError:
            await _answer(send, 502, b"")
            return
        await _answer(
            send,
            response.status_code,
            response.content,
            [
                (k.encode(), v.encode())
                for k, v in response.headers.items()
                if k.lower() not in _HOP and k.lower() != "content-encoding"
            ],
        )


async def _answer(
    send: Any, status: int, body: bytes, headers: list[tuple[bytes, bytes]] | None = None
) -> None:
    head = list(headers or [])
    if not any(k == b"content-type" for k, _ in head):
        head.append((b"content-type", b"application/json"))
    head.append((b"content-length", str(len(body)).encode()))
    await send({"type": "http.response.start", "status": status, "headers": head})
    await send({"type": "http.response.body", "body": body})
