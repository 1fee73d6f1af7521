"""The clusters that share a backend's bucket, and their weights (:mod:`.fair`)."""

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
