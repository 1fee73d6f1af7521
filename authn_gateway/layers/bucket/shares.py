"""The clusters that share a backend's bucket, and their weights (:mod:`.fair`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from backends.context import DEFAULT_CLUSTER


@dataclass(frozen=True)
class FairShares:
    """The clusters sharing a bucket, and their weights (``clusters:``)."""

    names: tuple[str, ...]
    weights: tuple[float, ...]
    _index: dict[str, int] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not self.names or len(self.names) != len(self.weights):
            raise ValueError("shares need one weight per cluster, and one cluster at least")
        if DEFAULT_CLUSTER not in self.names:
            raise ValueError(f"shares must include {DEFAULT_CLUSTER!r}")
        object.__setattr__(self, "_index", {name: i for i, name in enumerate(self.names)})

    @classmethod
    def of(cls, weights: Mapping[str, float]) -> FairShares:
        return cls(tuple(weights), tuple(weights.values()))

    def index(self, cluster: str) -> int:
        """The cluster's share; a name not configured is the default cluster's."""
        found = self._index.get(cluster)
        return self._index[DEFAULT_CLUSTER] if found is None else found

    def intervals(self, interval: float) -> tuple[float, ...]:
        """Each share's interval between calls: its rate is ``w/W`` of the bucket's."""
        total = sum(self.weights)
        return tuple(interval * total / w for w in self.weights)
