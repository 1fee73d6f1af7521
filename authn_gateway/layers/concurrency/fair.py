"""The line for concurrency slots: each cluster's waiters apart, served in weighted fair
order (issue 37: many clusters, one fleet).

Stride scheduling (Waldspurger and Weihl, 1995) over the clusters: each cluster has a
*pass*, its virtual time; a slot goes to the waiting cluster with the lowest pass,
which then advances by ``1 / weight``. A cluster that was idle starts again at most
:data:`BANKED_TURNS` of its own turns before the current virtual time (the start tag of
the last slot granted): a cluster under its share may get a short burst of logins
ahead of another's backlog (a Poisson second of them), but idleness banks no more.
Over any stretch in which clusters wait, each gets slots in proportion to its weight;
a cluster that asks for less than that gets all it asks for, and the rest goes to the
others by weight; a slot is never left free while anyone waits (work-conserving).

Within one cluster, the old order holds: calls with no fallback (never-seen tokens)
before refreshes that could be answered stale, each in arrival order. So one
cluster's storm of never-seen tokens delays its own refreshes, never another
cluster's logins or refreshes. With one cluster (no ``clusters:`` configured) the line
is exactly the single priority line it replaced.

Pure bookkeeping: no clock, no I/O. Cluster names come from the config (the pipeline
maps every caller to one of them), so the per-cluster state is bounded.
"""

from __future__ import annotations

import contextlib
import enum
import math
from collections import deque
from collections.abc import Iterator, Mapping
from typing import Generic, TypeVar

W = TypeVar("W")

#: How many of its own turns a cluster back from idle may take ahead of the others'
#: backlog. With none (and one round ahead for every cluster), a cluster at 0.2 x an
#: IdP's capacity (its share 1/3) had 3-4 % of its logins refused as its line filled
#: in a Poisson burst while another cluster stormed (loadtests/clusters.py); with two
#: turns and two rounds for a cluster that is not the longest line (slots.py), 1-2 %.
BANKED_TURNS = 2.0


class Priority(enum.IntEnum):
    """Within one cluster's line, lower goes first."""

    NO_FALLBACK = 0  # a token never seen before: no stale entry to answer with
    HAS_FALLBACK = 1  # a refresh: the review can be answered stale meanwhile


class FairLine(Generic[W]):
    """Waiters by cluster and priority, handed out in weighted fair order."""

    def __init__(self, weights: Mapping[str, float] | None = None) -> None:
        self._weights = dict(weights or {})
        self._lines: dict[str, dict[Priority, deque[W]]] = {}
        self._pass: dict[str, float] = {}
        # The start tag of the last slot granted: where an idle cluster starts again.
        self._vtime = 0.0
        self.count = 0

    def weight(self, cluster: str) -> float:
        return self._weights.get(cluster, 1.0)

    def _line(self, cluster: str) -> dict[Priority, deque[W]]:
        line = self._lines.get(cluster)
        if line is None:
            line = self._lines[cluster] = {p: deque() for p in Priority}
        return line

    def _tag(self, cluster: str) -> float:
        return max(self._pass.get(cluster, 0.0), self._vtime - BANKED_TURNS / self.weight(cluster))

    def add(self, cluster: str, priority: Priority, waiter: W) -> None:
        self._line(cluster)[priority].append(waiter)
        self.count += 1

    def remove(self, cluster: str, priority: Priority, waiter: W) -> None:
        line = self._lines.get(cluster)
        if line is None:
            return
        with contextlib.suppress(ValueError):
            line[priority].remove(waiter)
            self.count -= 1

    def waiting(self, priority: Priority | None = None, cluster: str | None = None) -> int:
        lines = self._lines.values() if cluster is None else [self._line(cluster)]
        if priority is None:
            return sum(len(q) for line in lines for q in line.values())
        return sum(len(line[priority]) for line in lines)

    def charge(self, cluster: str) -> None:
        """``cluster`` was granted a slot (from the line, or a free one at once)."""
        start = self._tag(cluster)
        self._pass[cluster] = start + 1.0 / self.weight(cluster)
        self._vtime = start

    def ahead(self, cluster: str, priority: Priority) -> int:
        """Waiters that would be served before a new one of ``cluster`` at ``priority``:
        its own cluster's at that priority or a higher one, and every other cluster's
        turns that come before its own in the fair order."""
        if not self.count:
            return 0
        line = self._line(cluster)
        own = sum(len(line[p]) for p in Priority if p <= priority)
        # The new waiter's turn: its cluster's tag, after the `own` turns ahead of it.
        turn = self._tag(cluster) + own / self.weight(cluster)
        others = 0
        for name, other in self._lines.items():
            if name == cluster:
                continue
            queued = sum(len(q) for q in other.values())
            gap = turn - self._tag(name)
            if queued and gap > 0:
                others += min(queued, math.ceil(gap * self.weight(name)))
        return own + others

    def longest(self, cluster: str) -> bool:
        """Whether ``cluster``'s line is longer for its weight than every other waiting
        line: the one a storm comes from, or the only one waiting."""
        mine = self.waiting(cluster=cluster) / self.weight(cluster)
        return all(
            (queued := sum(len(q) for q in line.values())) == 0 or queued / self.weight(name) < mine
            for name, line in self._lines.items()
            if name != cluster
        )

    def pop(self) -> tuple[str, W] | None:
        """The next waiter in fair order, with its cluster (not charged: the caller
        charges a grant, and drops a waiter that gave up for free)."""
        best: str | None = None
        best_tag = math.inf
        for name, line in self._lines.items():
            if any(line.values()):
                tag = self._tag(name)
                if tag < best_tag:
                    best, best_tag = name, tag
        if best is None:
            return None
        for queue in self._lines[best].values():  # in priority order
            if queue:
                self.count -= 1
                return best, queue.popleft()
        raise AssertionError("unreachable: the line had a waiter")

    def __iter__(self) -> Iterator[W]:
        for line in self._lines.values():
            for queue in line.values():
                yield from queue
