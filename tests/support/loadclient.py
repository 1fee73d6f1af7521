"""A small, fast keep-alive HTTP/1.1 client for sending storms of reviews in tests.

httpx costs milliseconds of client CPU per request on this 2-core machine, which
turns a 1,000-review storm into a test of the client. This one prebuilds each
request and parses responses with h11, one connection per worker, like
kube-apiserver's own keep-alive connection.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any

import h11
import orjson

from tests.support.procs import V1, review_body


@dataclass(frozen=True)
class Answer:
    status: int
    body: dict[str, Any]
    seconds: float
    headers: dict[str, str]

    @property
    def review(self) -> dict[str, Any]:
        return dict(self.body.get("status", {}))


def _request(
    host: str, port: int, path: str, payload: bytes, authorization: str | None = None
) -> bytes:
    auth = f"Authorization: {authorization}\r\n" if authorization is not None else ""
    return (
        f"POST {path} HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
        f"{auth}Accept-Encoding: gzip\r\nContent-Length: {len(payload)}\r\n\r\n"
    ).encode() + payload


async def _exchange(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, request: bytes
) -> tuple[int, dict[str, str], bytes]:
    conn = h11.Connection(h11.CLIENT)
    # Tell h11 what we sent so it knows a response is expected.
    conn.send(
        h11.Request(method="POST", target="/", headers=[("Host", "x"), ("Content-Length", "0")])
    )
    conn.send(h11.EndOfMessage())
    writer.write(request)
    await writer.drain()
    status, headers, body = 0, {}, b""
    while True:
        event = conn.next_event()
        if event is h11.NEED_DATA:
            data = await reader.read(65536)
            if not data:
                raise ConnectionResetError("server closed the connection")
            conn.receive_data(data)
        elif isinstance(event, h11.Response):
            status = event.status_code
            headers = {k.decode().lower(): v.decode() for k, v in event.headers}
        elif isinstance(event, h11.Data):
            body += event.data
        elif isinstance(event, h11.EndOfMessage):
            return status, headers, body


async def storm(
    url: str,
    tokens: list[str],
    concurrency: int = 100,
    api_version: str = V1,
    path: str = "/authenticate?timeout=30s",
    timeout: float = 30.0,
) -> list[Answer]:
    """One review per token over ``concurrency`` keep-alive connections; answers in order."""
    host, port = url.removeprefix("http://").split(":")
    port_n = int(port)
    queue: asyncio.Queue[int] = asyncio.Queue()
    for i in range(len(tokens)):
        queue.put_nowait(i)
    answers: list[Answer | None] = [None] * len(tokens)

    async def worker() -> None:
        reader, writer = await asyncio.open_connection(host, port_n)
        try:
            while True:
                try:
                    i = queue.get_nowait()
                except asyncio.QueueEmpty:
                    return
                payload = orjson.dumps(review_body(tokens[i], api_version))
                started = time.monotonic()
                status, headers, body = await asyncio.wait_for(
                    _exchange(reader, writer, _request(host, port_n, path, payload)), timeout
                )
                answers[i] = Answer(status, orjson.loads(body), time.monotonic() - started, headers)
        finally:
            writer.close()

    await asyncio.gather(*(worker() for _ in range(min(concurrency, len(tokens)))))
    return [a for a in answers if a is not None]


def assert_all(answers: list[Answer], status: int = 200, authenticated: bool | None = None) -> None:
    """Every answer has ``status`` (and, if given, that ``authenticated``); on failure the
    message shows what came back instead, counted, with the first odd answers' bodies."""
    odd = [
        a
        for a in answers
        if a.status != status
        or (authenticated is not None and a.review.get("authenticated") is not authenticated)
    ]
    seen = Counter((a.status, a.review.get("authenticated")) for a in answers)
    assert not odd, (
        f"{len(odd)} of {len(answers)} answers were not {status} "
        f"(authenticated={authenticated}); seen (status, authenticated): {dict(seen)}; "
        f"first: {[(a.status, a.body) for a in odd[:3]]}"
    )
