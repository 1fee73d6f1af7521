"""N real gateway processes over one real redis-server, driven at a paced offered load.

The proofs of the fleet guarantees (tests/process/test_fleet_guarantees.py) and the measurement
script (loadtests/fleet_faults.py) share this: start a fleet, offer reviews at a fixed
rate spread over the replicas (open loop: a slow answer does not slow the sender down,
as kube-apiserver's many clients do not), and read the fleet's metrics.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import orjson

from tests.support.loadclient import _exchange, _request
from tests.support.procs import GatewayProcess, metric_value, review_body, start_gateway
from tests.support.redis_server import RedisServer

SECRET = "fleet-guarantees-only-Wd5Kx1Nq7Zr3Tm9Bv2Yc6Uf0Ah4Ej8Gs-PiLo"


def fleet_config(backend: dict[str, Any], redis_url: str, **redis: Any) -> dict[str, Any]:
    """A gateway config in fleet mode with one backend."""
    settings: dict[str, Any] = {"url": redis_url, **redis}
    return {"secret": SECRET, "redis": settings, "backends": [backend]}


@dataclass
class Fleet:
    """Gateway processes sharing one Redis. Stop with :meth:`stop` (or use :func:`running`)."""

    redis: RedisServer
    replicas: list[GatewayProcess] = field(default_factory=list)
    #: With caller authentication on, /metrics answers authenticated callers only.
    caller_token: str | None = None

    def start(self, config: dict[str, Any], n: int, workdir: Path) -> Fleet:
        for i in range(n):
            self.replicas.append(start_gateway(config, workdir, name=f"replica{i}"))
        return self

    @property
    def urls(self) -> list[str]:
        return [gw.url for gw in self.replicas]

    def metric(self, name: str, **labels: str) -> float:
        """``name`` summed over every replica's /metrics."""
        return sum(metric_value(self.metrics(gw), name, **labels) for gw in self.replicas)

    def per_replica(self, name: str, **labels: str) -> list[float]:
        return [metric_value(self.metrics(gw), name, **labels) for gw in self.replicas]

    def metrics(self, gw: GatewayProcess) -> str:
        token = self.caller_token
        headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
        return httpx.get(f"{gw.url}/metrics", headers=headers, timeout=10).text

    def stop(self) -> None:
        for gw in self.replicas:
            gw.stop()


@contextlib.contextmanager
def running(config: Callable[[str], dict[str, Any]], n: int, workdir: Path) -> Iterator[Fleet]:
    """A fresh redis-server and ``n`` gateways on ``config(redis_url)``."""
    redis = RedisServer(workdir).start()
    fleet = Fleet(redis)
    try:
        fleet.start(config(redis.url), n, workdir)
        yield fleet
    finally:
        fleet.stop()
        redis.stop()


@dataclass
class Offered:
    """What an open-loop run sent and what came back."""

    sent: int = 0
    answered: int = 0
    authenticated: int = 0
    # The gateway's "error" field (for example "idp: circuit breaker open") -> count.
    errors: dict[str, int] = field(default_factory=dict)
    transport_errors: int = 0
    # Seconds from the start of the run, per answer, with the error (None if authenticated).
    timeline: list[tuple[float, str | None]] = field(default_factory=list)


class _Connections:
    """Idle keep-alive connections per gateway, opened on demand."""

    def __init__(self) -> None:
        self._idle: dict[str, list[tuple[asyncio.StreamReader, asyncio.StreamWriter]]] = {}

    async def take(self, url: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        idle = self._idle.setdefault(url, [])
        if idle:
            return idle.pop()
        host, port = url.removeprefix("http://").split(":")
        return await asyncio.open_connection(host, int(port))

    def give_back(self, url: str, conn: tuple[asyncio.StreamReader, asyncio.StreamWriter]) -> None:
        self._idle.setdefault(url, []).append(conn)

    def close(self) -> None:
        for conns in self._idle.values():
            for _, writer in conns:
                writer.close()


async def open_loop(
    urls: list[str],
    rate: float,
    duration: float,
    token: Callable[[int], str],
    timeout: float = 15.0,
    caller_token: str | None = None,
) -> Offered:
    """Send ``rate`` reviews per second for ``duration`` s, round robin over ``urls``.

    Review ``i`` carries ``token(i)``. Sending never waits for answers, so a hanging
    IdP meets the full offered load, as it would in production. With ``caller_token``,
    each request authenticates as that caller (``Authorization: Bearer``).
    """
    authorization = f"Bearer {caller_token}" if caller_token is not None else None
    result = Offered()
    conns = _Connections()
    started = time.monotonic()
    tasks: set[asyncio.Task[None]] = set()

    async def one(i: int, url: str) -> None:
        host, port = url.removeprefix("http://").split(":")
        payload = orjson.dumps(review_body(token(i)))
        try:
            conn = await conns.take(url)
            status, _, body = await asyncio.wait_for(
                _exchange(
                    *conn, _request(host, int(port), "/authenticate", payload, authorization)
                ),
                timeout,
            )
        except (OSError, TimeoutError, ValueError):
            result.transport_errors += 1
            return
        conns.give_back(url, conn)
        result.answered += 1
        review = orjson.loads(body).get("status", {}) if status == 200 else {}
        error = None if review.get("authenticated") else str(review.get("error", status))
        if error is None:
            result.authenticated += 1
        else:
            result.errors[error] = result.errors.get(error, 0) + 1
        result.timeline.append((time.monotonic() - started, error))

    targets = itertools.cycle(urls)
    for i in itertools.count():
        due = started + i / rate
        if due - started >= duration:
            break
        delay = due - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        task = asyncio.ensure_future(one(i, next(targets)))
        tasks.add(task)
        task.add_done_callback(tasks.discard)
        result.sent += 1
    if tasks:
        await asyncio.wait(tasks, timeout=timeout + 1)
    conns.close()
    return result
