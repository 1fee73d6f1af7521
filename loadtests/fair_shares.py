"""The bucket's shares between clusters (issue 37), on a simulated clock: what each
cluster gets of a backend's bucket when some storm and others ask little, for any number
of clusters, bucket and replica share. Deterministic (no wall clock, no process, no
IdP): the same figures on any machine, in a second or two.

    python -m loadtests.fair_shares

Each scenario feeds ``MemoryBucketStore.take_fair_now`` (the function fair_take.lua is
held to) evenly spaced calls per cluster and counts what it let through. ``replica
1/3`` is one replica of three while Redis is down: each share at a third of its rate.
"""

from __future__ import annotations

from dataclasses import dataclass

from authn_gateway.layers.bucket.memory import MemoryBucketStore
from authn_gateway.layers.bucket.shares import FairShares, SharedBucket


@dataclass(frozen=True)
class Scenario:
    name: str
    rate: float
    burst: int
    clusters: int
    #: Calls per second each cluster offers, by index; the rest offer none.
    offered: dict[int, float]
    seconds: float = 20.0
    scale: int = 1
    weights: tuple[float, ...] = ()


def run(s: Scenario) -> dict[int, int]:
    """Calls allowed per offering cluster."""
    names = [f"c{i}" for i in range(s.clusters)]
    weights = s.weights or (1.0,) * s.clusters
    shares = FairShares(tuple(names), weights)
    bucket = SharedBucket("bucket:sim", 1 / s.rate, s.burst, shares)
    clock = [0.0]
    store = MemoryBucketStore(clock=lambda: clock[0])
    events = sorted(
        ((k + 0.5) / per_second, i)
        for i, per_second in s.offered.items()
        for k in range(int(per_second * s.seconds))
    )
    allowed = dict.fromkeys(s.offered, 0)
    for at, i in events:
        clock[0] = at
        wait, _ = store.take_fair_now(bucket, 0.0, names[i], scale=s.scale)
        if wait is not None:
            allowed[i] += 1
    return allowed


def scenarios() -> list[Scenario]:
    out = []
    for n in (1, 3, 50, 51, 100, 200):
        out.append(Scenario(f"R=50 B=100, {n} clusters, one storms alone", 50, 100, n, {0: 500}))
    out.append(Scenario("R=100 B=3, 3 clusters, one storms alone", 100, 3, 3, {0: 1000}))
    for n in (3, 16, 17, 50):
        out.append(
            Scenario(
                f"R=50 B=100, replica 1/3, {n} clusters, one storms alone",
                50,
                100,
                n,
                {0: 500},
                scale=3,
            )
        )
    # A quiet cluster at 0.9 of its share beside a storm.
    for n, rate, burst in ((3, 90, 45), (100, 50, 100), (200, 50, 100), (3, 100, 3)):
        share = rate / n
        out.append(
            Scenario(
                f"R={rate:g} B={burst}, {n} clusters, c0 storms, c1 at 0.9 x its share",
                rate,
                burst,
                n,
                {0: 10 * rate, 1: 0.9 * share},
            )
        )
    out.append(
        Scenario(
            "R=80 B=40, weights 2:1:1, c0 and c1 storm",
            80,
            40,
            3,
            {0: 800, 1: 800},
            weights=(2.0, 1.0, 1.0),
        )
    )
    return out


def main() -> None:
    for s in scenarios():
        allowed = run(s)
        parts = []
        for i, n in allowed.items():
            asked = int(s.offered[i] * s.seconds)
            parts.append(f"c{i} {n / s.seconds:.2f}/s ({n}/{asked})")
        print(f"{s.name}: " + ", ".join(parts))


if __name__ == "__main__":
    main()
