"""The ``redis:`` section: fleet mode, where replicas share their state."""

from __future__ import annotations

import re
from typing import Annotated
from urllib.parse import parse_qsl, unquote, urlsplit

from pydantic import Field, field_validator, model_validator
from redis.connection import parse_url

from backends.base import BackendConfigError
from backends.durations import Interval, Timeout, count
from backends.http import ca_bundle
from backends.settings import FilePath, Secret, Strict

#: The highest database number redis.url may select (Redis has 16 unless its
#: ``databases`` says more).
MAX_DB = 65535
#: A query parameter's name shown as it is; any other is not shown at all.
_SHOWN_NAME = re.compile(r"[A-Za-z0-9_]{1,40}")


def url_problem(url: str) -> str | None:
    """What redis.url may not hold, in one line naming the part (never the password),
    or None.

    Its query would go to redis-py as connection arguments past every bound of this
    section (``socket_timeout=inf`` overrode timeout_seconds, ``health_check_interval``
    took 20 digits, ``ssl_cert_reqs=none`` would turn off certificate checks), so the
    only query parameter taken is ``db`` (a unix:// URL has no other place for it),
    a whole number from 0 to :data:`MAX_DB` like the path's database."""
    parts = urlsplit(url)
    path_db = unquote(parts.path).replace("/", "")
    if parts.scheme != "unix" and path_db and not _db(path_db):
        return f"the database (its path) must be a whole number from 0 to {MAX_DB}"
    if not parts.query:
        return None
    try:
        pairs = parse_qsl(parts.query, keep_blank_values=True, strict_parsing=True)
    except ValueError:
        return "its query must be name=value pairs (only db is taken)"
    seen: set[str] = set()
    for name, value in pairs:
        if name != "db":
            shown = repr(name) if _SHOWN_NAME.fullmatch(name) else "with that name"
            return (
                f"query parameter {shown} is not taken (only db is; "
                "timeouts are redis.timeout_seconds)"
            )
        if name in seen:
            return "query parameter 'db' is given twice"
        seen.add(name)
        if not _db(value):
            return f"query parameter 'db' must be a whole number from 0 to {MAX_DB}"
    return None


def _db(text: str) -> bool:
    return text.isascii() and text.isdigit() and len(text) <= 5 and int(text) <= MAX_DB


class RedisTLSSettings(Strict):
    # PEM bundle of the CAs that sign the Redis server's certificate, for a rediss://
    # url; the system store when unset. (Its query cannot carry ssl_* arguments.)
    ca_file: FilePath | None = None


class RedisSettings(Strict):
    """Fleet mode: replicas share cache, breaker state, buckets and coalescing leases."""

    # redis://, rediss:// (TLS) or unix:// URL. Credentials may be in the URL. No query
    # parameter but db (url_problem).
    url: str | None = Field(default=None, pattern=r"^(redis|rediss|unix)://")
    # Sentinel instead of url: "host:port" of each sentinel, and the master's name.
    sentinels: list[str] = Field(default_factory=list)
    sentinel_master: str = "mymaster"
    # Redis Cluster: url names one node; the client discovers the rest.
    cluster: bool = False
    password: Secret | None = None
    tls: RedisTLSSettings = Field(default_factory=RedisTLSSettings)
    key_prefix: str = Field(default="authn-gw", pattern=r"^[A-Za-z0-9:_-]+$")
    # Every Redis call's deadline. Past it that call uses local state. Measured from the
    # gateway under load on a shared 2-core host: p99 5-50 ms at load average ~4, with a
    # few calls per run past 0.1 s (docs/benchmarks.md, "Fleet guarantees"); one late
    # answer is a busy host or Redis, not a dead one.
    timeout_seconds: Timeout = 0.25
    # Late answers in a row that switch the replica to local mode (a refused or reset
    # connection switches it at once).
    slow_calls_to_local: Annotated[int, count(le=10_000)] = 3
    # While Redis is unreachable, how often to try it again.
    retry_seconds: Interval = 1.0
    # Breaker transitions are published (pub/sub) and adopted within milliseconds; this
    # poll is only the safety net for a message lost while the subscriber reconnects.
    breaker_sync_seconds: Interval = 1.0
    # While Redis is down each replica runs on 1/n of the fleet's bucket, failures to open
    # and in-flight ceiling: n is the larger of this and the replicas seen heartbeating
    # in Redis in the last 15 s (a replica that never reached Redis knows only this).
    expected_replicas: Annotated[int, count(le=10_000)] = 3
    # Longest a replica waits for another replica's call on the same cold token.
    coalesce_wait_seconds: Timeout = 3.0
    # When Redis answers again (it may have come back empty), each replica writes its
    # live local identities back, at most this many per second, most recently used
    # first, never over an entry Redis holds. 500/s: 100 000 identities in 200 s, for
    # about half the client CPU of 500 cache writes a second (docs/decisions.md).
    write_back_per_second: Annotated[int, count(ge=1, le=100_000)] = 500
    # How often each replica counts the identities in Redis
    # (authn_gateway_shared_cache_identities). An emptied Redis is noticed apart from
    # this, every second (cache/repair.py).
    count_shared_seconds: Interval = 15.0

    @field_validator("url")
    @classmethod
    def _url_bounded(cls, url: str | None) -> str | None:
        problem = url_problem(url) if url is not None else None
        if problem is not None:
            raise ValueError(problem)
        return url

    @model_validator(mode="after")
    def _one_target(self) -> RedisSettings:
        if (self.url is None) == (not self.sentinels):
            raise ValueError("set exactly one of url or sentinels")
        if self.url is not None:
            try:
                parse_url(self.url)  # type: ignore[no-untyped-call]
            except ValueError:
                # redis' own parser, as serve uses it; its message may quote a password.
                raise ValueError(
                    "url: not a valid Redis URL (check the port and database)"
                ) from None
        for i, sentinel in enumerate(self.sentinels):
            host, _, port = sentinel.rpartition(":")
            if not host or not port.isdigit() or not 0 < int(port) < 65536:
                raise ValueError(f"sentinels[{i}]: must be host:port")
        if self.cluster and self.sentinels:
            raise ValueError("cluster: cannot be combined with sentinels")
        if self.tls.ca_file is not None:
            if not (self.url or "").startswith("rediss://"):
                raise ValueError("tls.ca_file: takes a rediss:// url (TLS)")
            try:
                # Read as the backends' CA files are: check-config names a bad one.
                ca_bundle(self.tls.ca_file, "tls.ca_file")
            except BackendConfigError as exc:
                raise ValueError(str(exc)) from None
        return self
