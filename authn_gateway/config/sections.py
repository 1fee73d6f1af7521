"""The gateway-wide sections of the file but ``server:``, ``redis:`` and ``backends:``:
logging, readiness, cache defaults, the inbound limit, admin, markers, the deny list."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, model_validator

from authn_gateway.secret_strength import StrongSecret
from backends.durations import AGE_MAX, HOUR, YEAR, Interval, Rate, count, finite
from backends.settings import CacheSettings, FilePath, Strict


class LoggingSettings(Strict):
    level: Literal["debug", "info", "warning", "error"] = "info"
    format: Literal["text", "json"] = "text"
    # One line per review (outcome, backend, latency, token hash prefix).
    reviews: bool = True
    # Lines (review and process logs) waiting for stderr's reader. When it falls
    # behind and this fills, new lines are dropped and counted, never waited for.
    queue_lines: Annotated[int, count(ge=100, le=10_000_000)] = 10_000
    # Unavailable answers with the same backend and reason: the first in each window
    # is logged, the rest become one review_summary line with a count. 0: every line.
    outage_summary_seconds: Annotated[float, finite(ge=0, le=HOUR)] = 1.0
    # The audit log's own queue (server.audit_log); every decision gets a line there.
    audit_queue_lines: Annotated[int, count(ge=100, le=10_000_000)] = 100_000


class ReadinessSettings(Strict):
    """/readyz of a cold pod: see authn_gateway/observe/readiness.py and docs/operations.md."""

    # Until every backend has answered once (a probe of a token no IdP knows), the pod
    # is not ready; after this long it is ready anyway. 0: ready at once.
    cold_start_grace_seconds: Annotated[float, finite(ge=0, le=HOUR)] = 120.0


class CacheDefaults(CacheSettings):
    """Gateway-wide cache defaults; a backend's own ``cache:`` replaces them."""

    # Identities kept in each process (LRU among identities only).
    max_entries: Annotated[int, count()] = 100_000
    # Refusals, in an LRU of their own: a flood of invalid tokens evicts only older
    # refusals, never an identity. With Redis, at most this many are shared per minute.
    max_negative_entries: Annotated[int, count()] = 50_000
    # Identities of one user, in each process: past this, the user's own oldest goes.
    # One account minting token after token cannot push the other users out.
    max_entries_per_user: Annotated[int, count()] = 1000


class InboundLimitSettings(Strict):
    """Per-caller limit on reviews, so one noisy client cannot starve the rest."""

    enabled: bool = True
    # A caller is its client-certificate identity, or else its source address.
    rate: Rate = 2000.0
    burst: Annotated[int, count()] = 4000


class AdminSettings(Strict):
    """The admin API: breaker overrides, evictions and the deny list. Off by default."""

    enabled: bool = False
    # Callers must send "Authorization: Bearer <token>". Not read while disabled.
    # Generated, like the gateway secret: 32 random bytes (secret_strength.py).
    token: StrongSecret | None = None
    # A breaker override (force-open / force-closed) lasts this long unless the call
    # says otherwise ("seconds"); repeating the call renews it. At most max seconds.
    override_default_seconds: Annotated[int, count(le=int(AGE_MAX))] = 3600
    override_max_seconds: Annotated[int, count(le=int(AGE_MAX))] = 86400

    @model_validator(mode="before")
    @classmethod
    def _token_only_when_enabled(cls, data: object) -> object:
        # A disabled endpoint needs no token: its env:/file: reference is never resolved,
        # so the reference config checks on a laptop without the variable set.
        if isinstance(data, dict) and data.get("enabled") is not True and "token" in data:
            return {k: v for k, v in data.items() if k != "token"}
        return data

    @model_validator(mode="after")
    def _needs_token(self) -> AdminSettings:
        if self.enabled and self.token is None:
            raise ValueError("token: required when the admin endpoint is enabled")
        if self.override_default_seconds > self.override_max_seconds:
            raise ValueError("override_default_seconds: must not exceed override_max_seconds")
        return self


class MarkerSettings(Strict):
    """``user.extra`` keys on authenticated answers, for authorizers and admission.

    ``<prefix>backend``: the backend that decided; ``<prefix>stale``: ["true"] when the
    identity was served from cache because its IdP could not answer. Keys a backend
    returned under the prefix are dropped. Both off: extra is passed through as is.
    """

    prefix: str = Field(
        default="authn-gateway.io/", pattern=r"^[a-z0-9]([a-z0-9.-]*[a-z0-9])?(/[a-z0-9.-]*)?/$"
    )
    stale: bool = True
    backend: bool = True


class DenyListSettings(Strict):
    """Where the deny list lives without Redis (with Redis it is in Redis)."""

    # A JSON file written atomically, mode 0600. Unset and no Redis: memory only, and
    # a denial ends with the process (the admin answers say "stored_in": "memory").
    file: FilePath | None = None
    # How often each replica (or worker) reads the list again; changes made through
    # another replica's admin API arrive at once over Redis, and by then without it.
    sync_seconds: Interval = 1.0
    # The longest denial one request may set.
    max_seconds: Annotated[int, count(le=int(YEAR))] = 30 * 86400
