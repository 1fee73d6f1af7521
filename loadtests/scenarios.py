"""The rehearsed scenarios: which IdP, how many replicas, the load, and the fault schedule.

A scenario's faults happen at fractions of the run's duration, so ``--duration``
stretches or shrinks the whole script. Each scenario runs twice under the same load:
through the gateway, and through :mod:`loadtests.passthrough` (no protections).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Step:
    at: float  # fraction of the duration
    label: str
    # POSTed to the fake's /_fake/faults (not /_fake/reset: that clears the counters).
    faults: dict[str, Any] | None = None
    # "stop_redis" / "start_redis"
    action: str | None = None


@dataclass(frozen=True)
class Scenario:
    name: str
    summary: str
    idp: str = "idp"  # idp | keystone | gitlab
    replicas: int = 1
    redis: bool = False
    warm: bool = True  # review every hot token once before the clock starts
    users: int = 40
    rate: float = 10.0  # reviews/s per user
    mix: str = "hot=0.85,cold=0.05,invalid=0.05,sa=0.05"
    hot: int = 200
    steps: tuple[Step, ...] = ()
    reauth: bool = False  # clients refused re-login at Keystone and retry (the incident)
    # Changes to every backend's settings in protected mode (breaker, bucket, ...).
    backend: dict[str, Any] = field(default_factory=dict)
    # Fleet check: a cold token sent to every replica at once.
    cold_probe: bool = False
    # Top-level gateway settings in protected mode (inbound_limit, cache, ...).
    gateway: dict[str, Any] = field(default_factory=dict)
    # Share of the hot (known) users' reviews that must be authenticated, if checked.
    known_served_target: float | None = None
    # Brownout: the fake IdP in capacity mode from the start of the clock (after the
    # warm-up): at most `capacity` calls in service, `service_time` s each, FIFO.
    capacity: int | None = None
    service_time: float = 0.05
    # Poisson arrivals per user (a smooth offered rate) instead of constant throughput,
    # whose users all start together and review in waves.
    poisson: bool = False
    # Brownout: also run loadtests/direct.py (a client calling the IdP directly) as the
    # reference the gateway's figures are read against.
    direct_reference: bool = False


_BREAKER = {"breaker": {"fail_max": 5, "reset_timeout_seconds": 5.0, "half_open_probes": 1}}

# Issue #15's brownout: an IdP serving 4 x 1000/50 = 80 calls/s, 300 reviews/s offered
# (30 % never-seen valid tokens), a 200/s bucket, a 1 s timeout and a 5 s positive TTL.
_BROWNOUT_BACKEND = {
    **_BREAKER,
    "bucket": {"rate": 200, "burst": 200},
    "timeouts": {"connect_seconds": 1.0, "read_seconds": 1.0, "total_seconds": 1.0},
    "cache": {"positive_ttl_seconds": 5.0},
}
# 400 users at 0.75/s: each user waits for its review (closed loop), so it takes many
# slow users to keep offering 300/s while reviews take up to the 1 s timeout.
_BROWNOUT = {
    "users": 400,
    "rate": 0.75,
    "mix": "hot=0.7,cold=0.3",
    "poisson": True,
    "capacity": 4,
    "service_time": 0.05,
    "backend": _BROWNOUT_BACKEND,
}

SCENARIOS: dict[str, Scenario] = {
    s.name: s
    for s in (
        Scenario("steady", "hot cache, no faults", backend=_BREAKER),
        Scenario(
            "cold-start",
            "a fresh gateway meets a large hot set",
            warm=False,
            hot=3000,
            mix="hot=0.9,cold=0.02,invalid=0.04,sa=0.04",
            backend=_BREAKER,
        ),
        Scenario(
            "idp-outage",
            "the IdP answers 500 to everything from 30 % to 70 % of the run",
            steps=(
                Step(0.3, "IdP down (500)", {"status": 500}),
                Step(0.7, "IdP back", {"status": None}),
            ),
            backend=_BREAKER,
        ),
        Scenario(
            "incident",
            "Keystone: 401 to the service token, then timeouts, then recovery; "
            "refused clients log in again and retry",
            idp="keystone",
            reauth=True,
            mix="hot=0.9,cold=0.01,invalid=0.04,sa=0.05",
            steps=(
                Step(0.25, "401 to service token", {"reject_service_tokens": True}),
                Step(0.5, "timeouts", {"reject_service_tokens": False, "hang": True}),
                Step(0.75, "recovery", {"hang": False}),
            ),
            backend=_BREAKER,
        ),
        Scenario(
            "idp-slow",
            "the IdP takes 1.5 s per answer from 25 % to 75 % of the run",
            steps=(
                Step(0.25, "IdP slow (1.5 s)", {"latency": 1.5}),
                Step(0.75, "IdP fast", {"latency": 0.0}),
            ),
            backend=_BREAKER,
        ),
        Scenario(
            "rate-limited",
            "the IdP answers 429 with Retry-After: 5 from 30 % to 70 % of the run",
            idp="gitlab",
            steps=(
                Step(0.3, "429 + Retry-After", {"status": 429, "retry_after": 5}),
                Step(0.7, "limit lifted", {"status": None, "retry_after": None}),
            ),
            backend=_BREAKER,
        ),
        Scenario(
            "redis-down",
            "three replicas sharing Redis; Redis stopped at 30 %, started at 70 %",
            replicas=3,
            redis=True,
            steps=(
                Step(0.3, "Redis stopped", action="stop_redis"),
                Step(0.7, "Redis started", action="start_redis"),
            ),
            backend=_BREAKER,
        ),
        Scenario(
            "hostile-flood",
            "junk tokens at the inbound ceiling with the usual traffic; IdP down 40-75 %",
            users=40,
            rate=15.0,
            # ~55 % junk: 330 never-repeated tokens/s, a quarter of them not ASCII.
            mix="hot=0.4,cold=0.02,invalid=0.015,sa=0.015,junk=0.55",
            hot=1000,
            steps=(
                Step(0.4, "IdP down (refused)", {"refuse": True}),
                Step(0.75, "IdP back", {"refuse": False}),
            ),
            backend={
                **_BREAKER,
                # The bucket lets junk reach the IdP fast enough to fill any shared LRU.
                "bucket": {"rate": 400, "burst": 400},
                "cache": {
                    "positive_ttl_seconds": 5,
                    "negative_ttl_seconds": 30,
                    "max_stale_seconds": 3600,
                },
            },
            # One caller (kube-apiserver) for everyone, at its inbound ceiling; a cache
            # with room for the known users, not for the junk as well.
            gateway={
                # Below the junk rate alone, so the ceiling binds on any machine.
                "inbound_limit": {"rate": 150, "burst": 150},
                "cache": {"max_entries": 2000},
            },
            known_served_target=0.99,
        ),
        Scenario(
            "fleet",
            "three replicas sharing Redis; fleet-wide IdP call rate, cold token to all",
            replicas=3,
            redis=True,
            warm=False,
            hot=1000,
            cold_probe=True,
            backend=_BREAKER,
        ),
        Scenario(
            "brownout",
            "the IdP serves 80 calls/s (4 at once, 50 ms each, FIFO) until 80 % of the run; "
            "300 reviews/s, 30 % cold",
            steps=(Step(0.8, "brownout ends", {"capacity": None}),),
            direct_reference=True,
            **_BROWNOUT,  # type: ignore[arg-type]
        ),
        Scenario(
            "brownout-today",
            "the brownout, with the gateway as it was before #15: no concurrency limit, "
            "no slow-call rule",
            **{
                **_BROWNOUT,
                "backend": {
                    **_BROWNOUT_BACKEND,
                    "concurrency": {"enabled": False},
                    "breaker": {**_BREAKER["breaker"], "slow_calls": None},
                },
            },  # type: ignore[arg-type]
        ),
        Scenario(
            "brownout-shift",
            "the brownout, with the IdP's capacity halved at 33 % and doubled at 66 %",
            steps=(
                Step(0.33, "capacity 40/s", {"capacity": 2}),
                Step(0.66, "capacity 160/s", {"capacity": 8}),
            ),
            **_BROWNOUT,  # type: ignore[arg-type]
        ),
        Scenario(
            "fleet-6",
            "six replicas sharing Redis; the IdP resets every connection from 30 % to 60 % "
            "of the run; cold-heavy load",
            replicas=6,
            redis=True,
            warm=False,
            hot=1000,
            mix="hot=0.7,cold=0.2,invalid=0.05,sa=0.05",
            steps=(
                Step(0.3, "IdP resets connections", {"reset": True}),
                Step(0.6, "IdP back", {"reset": False}),
            ),
            cold_probe=True,
            backend={
                **_BREAKER,
                "concurrency": {"max_limit": 20},
                "bucket": {"rate": 100, "burst": 100},
            },
        ),
    )
}
