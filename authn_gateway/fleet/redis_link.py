"""The gateway's one connection to Redis, and the switch between shared and local mode.

Redis makes a fleet behave as one gateway; it must never be what takes the
gateway down. Every call goes through :meth:`RedisLink.run`, which gives it a
short deadline. A refused or reset connection, or ``slow_calls_to_local`` late
answers in a row (one late answer is a busy Redis, not a dead one), flips the
replica to *local* mode: callers get
:class:`RedisDown` at once (no deadline paid per review) and use their local
state, while a background task pings Redis and flips back to *shared* when it
answers. Both transitions are logged and exported as metrics.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import socket
import time
from collections.abc import Awaitable, Callable
from importlib import resources
from pathlib import Path
from typing import Any, TypeVar

import redis.asyncio as redis
from redis.asyncio.cluster import RedisCluster
from redis.asyncio.retry import Retry
from redis.asyncio.sentinel import Sentinel
from redis.backoff import NoBackoff
from redis.exceptions import RedisClusterException, RedisError
from redis.exceptions import TimeoutError as RedisTimeoutError

from authn_gateway.config import ConfigError, RedisSettings
from authn_gateway.fleet.metrics import FleetMetrics
from authn_gateway.observe.metrics import Metrics
from backends.base import BackendConfigError
from backends.http import ca_bundle

log = logging.getLogger(__name__)

T = TypeVar("T")
MODES = ("shared", "local")

#: Names this process in leases and probe permits.
REPLICA_ID = f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(4)}"


class RedisDown(Exception):
    """Redis did not answer in time; use local state."""


def lua_script(package: str, name: str) -> str:
    """The source of a Lua script shipped as a resource file of ``package``."""
    return resources.files(package).joinpath(name).read_text()


def redis_ca_bundle(ca_file: Path) -> str:
    """The PEM text of redis.tls.ca_file, read and checked as the backends' CA files are
    (backends/http.py): a missing, odd or certificate-less file is one config line."""
    try:
        return ca_bundle(ca_file, "redis.tls.ca_file")
    except BackendConfigError as exc:
        raise ConfigError("redis", [str(exc)]) from None


def make_client(settings: RedisSettings) -> Any:
    timeout = settings.timeout_seconds
    password = settings.password.get_secret_value() if settings.password else None
    common: dict[str, Any] = {
        # One immediate retry on a fresh connection (a pooled socket may have died with
        # the old server), and no backoff sleeps: the whole call has a deadline of its own.
        "retry": Retry(NoBackoff(), 1),
        "socket_timeout": timeout,
        "socket_connect_timeout": timeout,
        "password": password,
        "health_check_interval": 10,
    }
    if settings.tls.ca_file is not None:
        common["ssl_ca_data"] = redis_ca_bundle(settings.tls.ca_file)
    if settings.sentinels:
        hosts = [(h.rsplit(":", 1)[0], int(h.rsplit(":", 1)[1])) for h in settings.sentinels]
        sentinel = Sentinel(  # type: ignore[no-untyped-call]
            hosts, socket_timeout=timeout, socket_connect_timeout=timeout, password=password
        )
        return sentinel.master_for(settings.sentinel_master, **common)
    assert settings.url is not None
    if settings.cluster:
        del common["health_check_interval"]
        return RedisCluster.from_url(settings.url, **common)
    return redis.Redis.from_url(settings.url, **common)


#: What a Redis call raises when Redis cannot answer it. redis-py's cluster client
#: raises RedisClusterException (a node list no node of which answers, a slot no node
#: covers), which is no RedisError: without it a cluster down at start-up stopped the
#: gateway from starting, and one going down killed the recovery loop.
REDIS_DOWN: tuple[type[BaseException], ...] = (
    RedisError,
    RedisClusterException,
    OSError,
    TimeoutError,
)


class RedisLink:
    def __init__(self, settings: RedisSettings, metrics: Metrics, client: Any = None) -> None:
        self.settings = settings
        self.prefix = settings.key_prefix
        self.client = client if client is not None else make_client(settings)
        self._metrics = metrics.group(FleetMetrics)
        self._timeout = settings.timeout_seconds
        self.shared = True
        self._recovery: asyncio.Task[None] | None = None
        self._on_resume: list[Callable[[], None]] = []
        self._scripts: dict[str, Any] = {}
        self._slow_in_a_row = 0
        # Monotonic time of the last switch to local mode.
        self.local_since = time.monotonic()
        self._set_mode_metric()
        # Exported at 0 from the start, so that the first switch is an increase.
        self._switched = {mode: self._metrics.redis_mode_changes.labels(mode) for mode in MODES}

    def key(self, *parts: str) -> str:
        return ":".join((self.prefix, *parts))

    def on_resume(self, callback: Callable[[], None]) -> None:
        """Called when sharing resumes (for example to push local state back)."""
        self._on_resume.append(callback)

    async def run(self, op: str, call: Callable[[Any], Awaitable[T]]) -> T:
        """Run one Redis operation under the deadline, or raise RedisDown."""
        if not self.shared:
            raise RedisDown
        started = time.perf_counter()
        try:
            async with asyncio.timeout(self._timeout):
                result = await call(self.client)
        except REDIS_DOWN as exc:
            self._metrics.child(self._metrics.redis_errors, op).inc()
            self._slow_in_a_row += 1
            slow = isinstance(exc, TimeoutError | RedisTimeoutError)
            # A busy Redis answers late now and then: that call uses local state, but
            # the replica stays shared until several calls in a row were late. A refused
            # or reset connection means Redis is gone: local mode at once.
            if not slow or self._slow_in_a_row >= self.settings.slow_calls_to_local:
                self._fall_back(op, exc)
            raise RedisDown from None
        self._slow_in_a_row = 0
        self._metrics.child(self._metrics.redis_latency, op).observe(time.perf_counter() - started)
        return result

    async def script(self, op: str, source: str, keys: list[str], args: list[Any]) -> Any:
        """Run a Lua script by its SHA (EVALSHA, loading it on first use), under the deadline."""
        return await self.run(op, lambda r: self.script_on(r, source, keys, args))

    def script_on(self, client: Any, source: str, keys: list[str], args: list[Any]) -> Any:
        """The awaitable of one script call on ``client`` (inside :meth:`run` or :meth:`either`)."""
        script = self._scripts.get(source)
        if script is None:
            script = self._scripts[source] = self.client.register_script(source)
        return script(keys=keys, args=args, client=client)

    async def either(
        self, op: str, remote: Callable[[Any], Awaitable[T]], local: Callable[[], T]
    ) -> T:
        """``remote`` on Redis while it is shared and answers; otherwise ``local()``."""
        if self.shared:
            try:
                return await self.run(op, remote)
            except RedisDown:
                pass
        return local()

    async def best_effort(self, op: str, call: Callable[[Any], Awaitable[T]]) -> T | None:
        """Like :meth:`run`, for writes whose loss only costs sharing: None if Redis is down."""
        try:
            return await self.run(op, call)
        except RedisDown:
            return None

    async def start(self) -> None:
        try:
            await self.run("ping", lambda r: r.ping())
        except RedisDown:
            pass  # already logged; the gateway starts in local mode and keeps trying
        else:
            log.info("redis: connected, fleet state is shared")

    async def close(self) -> None:
        if self._recovery is not None:
            self._recovery.cancel()
        with contextlib.suppress(*REDIS_DOWN):
            await self.client.aclose()

    def _fall_back(self, op: str, exc: BaseException) -> None:
        if not self.shared:
            return
        self.shared = False
        self.local_since = time.monotonic()
        self._set_mode_metric()
        self._switched["local"].inc()
        log.warning(
            "redis: %s failed (%s); falling back to local state until it answers",
            op,
            type(exc).__name__,
        )
        self._recovery = asyncio.get_running_loop().create_task(self._recover())

    async def _recover(self) -> None:
        while True:
            await asyncio.sleep(self.settings.retry_seconds)
            try:
                async with asyncio.timeout(self._timeout):
                    await self.client.ping()
            except REDIS_DOWN:
                continue
            # Drop sockets that died with the old server before anyone borrows them.
            with contextlib.suppress(*REDIS_DOWN, AttributeError):
                await self.client.connection_pool.disconnect()
            self.shared = True
            self._slow_in_a_row = 0
            self._set_mode_metric()
            self._switched["shared"].inc()
            log.warning("redis: answering again; fleet state is shared again")
            for callback in self._on_resume:
                callback()
            return

    def _set_mode_metric(self) -> None:
        current = "shared" if self.shared else "local"
        for mode in MODES:
            self._metrics.redis_mode.labels(mode).set(1 if mode == current else 0)
