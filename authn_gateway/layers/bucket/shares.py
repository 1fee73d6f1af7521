"""The clusters that share a backend's bucket, their weights, and the bucket as a store
takes from it (:mod:`.fair`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True)
class FairShares:
    """The clusters sharing a bucket, and their weights (``clusters:``)."""

    names: tuple[str, ...]
    weights: tuple[float, ...]
    _index: dict[str, int] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not self.names or len(self.names) != len(self.weights):
            raise ValueError("shares need one weight per cluster, and one cluster at least")
        object.__setattr__(self, "_index", {name: i for i, name in enumerate(self.names)})

    @classmethod
    def of(cls, weights: Mapping[str, float]) -> FairShares:
        return cls(tuple(weights), tuple(weights.values()))

    def index(self, cluster: str) -> int | None:
        """The cluster's share; None for a cluster with none (``default`` when every
        caller is in a configured cluster: only the CLI and tools review as it)."""
        return self._index.get(cluster)

    def intervals(self, interval: float) -> tuple[float, ...]:
        """Each share's interval between calls: its rate is ``w/W`` of the bucket's."""
        total = sum(self.weights)
        return tuple(interval * total / w for w in self.weights)


@dataclass(frozen=True)
class SharedBucket:
    """One bucket (a call every ``interval`` s, bursts of ``burst``), cut into shares:
    what a store takes from. Each share's interval is computed once, here."""

    key: str
    interval: float
    burst: int
    shares: FairShares
    #: The tolerance, B/R: every share's, too.
    tau: float = field(init=False)
    intervals: tuple[float, ...] = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "tau", self.burst * self.interval)
        object.__setattr__(self, "intervals", self.shares.intervals(self.interval))

    def scaled(self, n: int) -> tuple[float, ...]:
        """Each share's interval at 1/n of its rate (a replica's part, Redis down)."""
        return self.intervals if n == 1 else tuple(i * n for i in self.intervals)
