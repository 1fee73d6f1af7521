"""Fault schedules drawn from a seed: the same seed gives the same list, always.

Faults come in lanes; faults of one lane never overlap (the IdP has one state, the proxy
one latency, a Deployment does one rollout at a time), faults of different lanes
overlap at random. Each lane draws its gaps and lengths from its own stream of the
seed, so dropping a fault (the shrinker does) moves nothing else.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from typing import Any

# lane -> (kind, weight) it draws from.
LANES: dict[str, list[tuple[str, float]]] = {
    "idp": [
        ("idp_refuse", 2),
        ("idp_hang", 1),
        ("idp_500", 2),
        ("idp_429", 1),
        ("idp_401", 0.5),
        ("idp_slow", 1),
        ("idp_capacity", 1),
    ],
    "redis": [
        ("redis_cut", 2),
        ("redis_slow", 1.5),
        ("redis_restart_empty", 1),
        ("redis_flushall", 1.5),
    ],
    "deploy": [
        ("replica_restart", 3),
        ("replica_reload", 2),
        ("replica_reload_invalid", 1),
        ("roll", 0.7),
        ("secret_rotation", 0.3),
    ],
    "admin": [
        ("breaker_force_open", 1),
        ("breaker_force_closed", 1),
        ("evict", 1.5),
        ("deny", 1),
    ],
}
# Mean seconds between two faults of a lane (exponential gaps).
MEAN_GAP = {"idp": 5.0, "redis": 7.0, "deploy": 6.0, "admin": 8.0}
# Seconds at least between the end of one fault of a lane and the start of the next.
LANE_PAUSE = 0.5
# Users the admin lane evicts or denies; the served-share invariant excuses them only
# while the eviction or denial holds (invariants.py).
VICTIMS = 4
# Rollouts take a while: none starts this close to the end of the fault window.
LONG_LEAD = {"roll": 15.0, "secret_rotation": 30.0}


@dataclass(frozen=True)
class Fault:
    index: int
    kind: str
    lane: str
    start: float  # seconds since the run's t0
    length: float  # 0: a one-off action (FLUSHALL, a restart, an eviction)
    params: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)

    @property
    def end(self) -> float:
        return self.start + self.length

    def describe(self) -> str:
        extra = " ".join(f"{k}={v}" for k, v in self.params.items())
        span = f"{self.length:4.1f}s" if self.length else "  -  "
        return f"#{self.index:<3} t={self.start:6.1f}s {span} {self.kind:<22} {extra}".rstrip()

    def to_json(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "kind": self.kind,
            "lane": self.lane,
            "start": round(self.start, 3),
            "length": round(self.length, 3),
            "params": self.params,
        }


def _params(kind: str, rng: random.Random, replicas: int, known: int) -> dict[str, Any]:
    victim = f"known{rng.randrange(min(VICTIMS, known))}"
    params: dict[str, dict[str, Any]] = {
        "idp_429": {"retry_after": rng.choice([1, 2, 3])},
        "idp_slow": {"latency": rng.choice([0.3, 0.8, 1.5])},
        "idp_capacity": {"capacity": rng.choice([1, 2]), "service_time": 0.1},
        "redis_slow": {"latency": rng.choice([0.05, 0.15, 0.4])},
        "replica_restart": {"replica": rng.randrange(replicas)},
        "replica_reload": {"replica": rng.randrange(replicas)},
        "replica_reload_invalid": {"replica": rng.randrange(replicas)},
        "breaker_force_open": {"via": rng.randrange(replicas)},
        "breaker_force_closed": {"via": rng.randrange(replicas)},
        "evict": {"user": victim, "via": rng.randrange(replicas)},
        "deny": {"user": victim, "via": rng.randrange(replicas)},
    }
    return params.get(kind, {})


def _length(kind: str, rng: random.Random) -> float:
    if kind in ("redis_restart_empty", "redis_flushall", "replica_restart", "evict"):
        return 0.0
    if kind in ("replica_reload", "replica_reload_invalid", "roll", "secret_rotation"):
        return 0.0  # they take what they take; the runner records when they ended
    return round(rng.uniform(2.0, 10.0), 1)


def generate(seed: int, start: float, end: float, replicas: int, known_users: int) -> list[Fault]:
    """Faults starting at or after ``start`` and ending by ``end`` (seconds since t0)."""
    drawn: list[tuple[float, str, str, float, dict[str, Any]]] = []
    for lane, kinds in LANES.items():
        rng = random.Random(f"{seed}:{lane}")
        names, weights = zip(*kinds, strict=True)
        t = start + rng.expovariate(1 / MEAN_GAP[lane]) / 2
        while (t := round(t, 1)) < end:
            kind = rng.choices(names, weights)[0]
            length = _length(kind, rng)
            params = _params(kind, rng, replicas, known_users)
            if t + length <= end and t + LONG_LEAD.get(kind, 0.0) <= end:
                drawn.append((t, lane, kind, length, params))
            t += length + LANE_PAUSE + rng.expovariate(1 / MEAN_GAP[lane])
    drawn.sort(key=lambda d: (d[0], d[1]))
    return [
        Fault(i, kind, lane, t, length, p) for i, (t, lane, kind, length, p) in enumerate(drawn)
    ]


def timeline(faults: list[Fault]) -> str:
    return "\n".join(f.describe() for f in faults)


def dumps(faults: list[Fault]) -> str:
    return json.dumps([f.to_json() for f in faults], indent=1)
