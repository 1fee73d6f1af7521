"""The fleet's configuration in a chaos run, and the bounds the docs derive from it.

The bounds are small on purpose (fail_max 5, 20 in flight, a bucket of 20/s, burst 20,
a 2 s reset_timeout), so that a minute of faults crosses them many times and a breach
stands out of the IdP's own counts.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# Each a run's own; strong enough for the gateway's checks, never used anywhere else.
SECRET_A = "chaos-runner-only-secret-A-Vq7Lm2Xc9Rt4Kw8Zp3Nb6Hd1Jf5Gs0Ye"
SECRET_B = "chaos-runner-only-secret-B-Tz4Wk9Pq2Ln7Xv3Mc8Rd1Hb6Jg5Fs0Ua"
ADMIN_TOKEN = "chaos-runner-admin-token-Kd8Qw3Zn6Lp1Vx4Rm9Tb2"
BACKEND = "idp"


@dataclass(frozen=True)
class Bounds:
    """One backend's resilience settings (docs/operations.md, "Fleet guarantees")."""

    fail_max: int = 5
    max_limit: int = 20
    half_open_probes: int = 1
    reset_timeout: float = 2.0
    rate: float = 20.0
    burst: int = 20
    total_timeout: float = 1.0
    # Arrival jitter the fleet guarantees' tests allow on a loaded host.
    jitter: float = 0.25


@dataclass(frozen=True)
class RunSettings:
    seed: int
    duration: float = 60.0
    replicas: int = 3
    # Reviews a second, spread over the ready replicas.
    rate: float = 40.0
    known_users: int = 20
    # Shares of the load that are never-seen valid tokens and junk; the rest is known users.
    cold_share: float = 0.1
    junk_share: float = 0.2
    # Healthy seconds before the first fault (every known user is cached by then).
    warmup: float = 4.0
    bounds: Bounds = Bounds()
    positive_ttl: float = 5.0
    # The gateway's default: a refusal from the IdP is cached this long.
    negative_ttl: float = 30.0
    # Shortened from 120 s: a replica restarted during an IdP outage takes traffic after
    # this, the worst case the default grace only postpones.
    cold_start_grace: float = 5.0
    redis_retry: float = 0.5
    max_entries: int = 5000

    @property
    def recovery_seconds(self) -> float:
        """How long after the last fault ends errors may go on: a breaker's reset_timeout
        (its next probe closes it), the longest Retry-After the schedule sends (3 s),
        Redis' retry interval and the epoch check (1 s) with its write-back, one
        readiness poll, and 1 s for a loaded host."""
        return self.bounds.reset_timeout + 3.0 + self.redis_retry + 1.0 + 0.5 + 1.0

    @property
    def memory_bound_mib(self) -> float:
        """docs/operations.md, "Capacity and sizing": ~100 MiB for the process, ~1.9 KB
        of RSS per identity up to max_entries, at most ~25 MiB of parked connections."""
        return 100 + self.max_entries * 1.9 / 1024 + 25


def gateway_config(
    run: RunSettings,
    redis_url: str,
    idp_url: str,
    secret: str = SECRET_A,
    previous: tuple[str, ...] = (),
    reload_mark: int = 0,
) -> dict[str, Any]:
    """A replica's config. ``reload_mark`` changes only how long a breaker override lasts
    by default (which the runner never relies on): a valid reload that changes a value."""
    b = run.bounds
    return {
        "secret": secret,
        "previous_secrets": list(previous),
        "redis": {
            "url": redis_url,
            "expected_replicas": run.replicas,
            "retry_seconds": run.redis_retry,
        },
        "cache": {
            "positive_ttl_seconds": run.positive_ttl,
            "max_stale_seconds": 3600,
            "max_entries": run.max_entries,
        },
        "readiness": {"cold_start_grace_seconds": run.cold_start_grace},
        "admin": {
            "enabled": True,
            "token": ADMIN_TOKEN,
            "override_default_seconds": 3600 + reload_mark,
        },
        "logging": {"reviews": False},
        "backends": [
            {
                "name": BACKEND,
                "type": "userinfo",
                "url": idp_url,
                "timeouts": {
                    "connect_seconds": 0.5,
                    "read_seconds": b.total_timeout,
                    "total_seconds": b.total_timeout,
                },
                "breaker": {
                    "fail_max": b.fail_max,
                    "reset_timeout_seconds": b.reset_timeout,
                    "half_open_probes": b.half_open_probes,
                },
                "bucket": {"rate": b.rate, "burst": b.burst},
                "concurrency": {"max_limit": b.max_limit, "initial_limit": b.max_limit},
            }
        ],
    }
