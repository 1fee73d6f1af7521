"""A backend's bucket shared between clusters by weight (issue 37: many clusters, one fleet).

The bucket (rate R, burst B) is cut into one share per cluster k: a bucket of its own,
GCRA as in :mod:`.gcra`, with rate ``R·w_k/W`` and burst ``B·w_k/W`` (W: the sum of
the weights). The shares' rates add up to R and their bursts to B, and every call
takes one unit from exactly one share, so no window of t seconds sees more than
``B + R·t`` calls, exactly as with the one bucket, whatever the clusters do. A
cluster's call takes from its own share if it can; if not, it *borrows* from the share
with the most left, but only from a share that keeps at least half its burst after the
loan. So:

* a cluster that asks for less than its share always finds its own share (its bursts
  up to half its burst included): another cluster's storm never takes that from it;
* what a cluster does not use is lent, so the storming clusters get the rest; over
  time nothing is wasted while anyone asks (the idle halves are a burst's reserve, not
  rate);
* what is lent is split between the clusters borrowing by weight: each borrower has a
  *pass* (what it borrowed, over its weight), and a loan goes to a borrower only while
  its pass is within one loan of the lowest pass among the clusters that asked to
  borrow in the last ``τ/2`` (stride scheduling, at arrival: nobody queues here). A
  borrower that stops asking is out of that count within ``τ/2``, before a lender's
  half could refill and spill over, so nothing is wasted for it;
* two storming clusters split the bucket by weight: neither has anything to lend, and
  a third share's surplus goes to them by weight.

Why shares and no bucket over them: a bucket above the shares, spent first come first
served, decides alone whenever it is shorter than the shares together (while Redis
is down it starts empty, and a follow-up call spends it): a storm at 10 x the rate
then takes nearly every unit it frees (docs/decisions.md).

In GCRA terms every share's tolerance is the same, ``τ = B/R``: a share's state is the
theoretical arrival time (TAT) of its next call, from ``now`` (full) to ``now + τ``
(empty). A share lends while its TAT after the loan stays within ``now + τ/2``. The
config refuses a share smaller than one call (``B·w/W < 1``). ``fair_take.lua`` is
this function, for the fleet's shares in Redis; ``tests/process/test_stores.py`` holds
the two to the same answers.

A follow-up call a backend makes for a review (group pages, service logins; see
:mod:`backends.budget`) was asked for by no cluster: it takes from the share with the
most left, reserve or not (``own`` None).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from authn_gateway.layers.bucket.gcra import EPSILON
from authn_gateway.layers.bucket.shares import FairShares

__all__ = ["FairShares", "ShareState", "fair_gcra"]

#: A cluster that never asked to borrow.
NEVER = -1e18


@dataclass
class ShareState:
    """A shared bucket's state, by share index: each share's TAT, and each cluster's
    borrowing (its pass, and when it last asked to borrow)."""

    tats: list[float]
    passes: list[float]
    asked: list[float]

    @classmethod
    def new(cls, n: int) -> ShareState:
        return cls([0.0] * n, [0.0] * n, [NEVER] * n)

    def copy(self) -> ShareState:
        return ShareState(list(self.tats), list(self.passes), list(self.asked))


def fair_gcra(
    state: ShareState,
    now: float,
    tau: float,
    intervals: Sequence[float],
    weights: Sequence[float],
    own: int | None,
    max_wait: float,
) -> tuple[ShareState, float | None, int]:
    """One call of share ``own`` (None: a follow-up call, of no cluster): (the new
    state, seconds to wait, the share charged), or (the state, with a refused
    borrower's ask recorded, None, -1) when refused. ``tau`` is the tolerance, B/R.

    A call from its own share may wait up to ``max_wait`` for it (as the plain bucket
    does); a borrowed one does not wait. A share under one call (each replica's part of
    a small share while Redis is down) lets a call through when it is full.
    """
    new = state.copy()
    if own is None:
        fullest = min(
            range(len(intervals)),
            key=lambda j: max(state.tats[j], now) + intervals[j] - max(tau, intervals[j]),
        )
        after = max(state.tats[fullest], now) + intervals[fullest]
        wait = after - max(tau, intervals[fullest]) - now
        if wait > max_wait + EPSILON:
            return new, None, -1
        new.tats[fullest] = after
        return new, max(0.0, wait), fullest
    mine = max(state.tats[own], now) + intervals[own]
    own_wait = mine - max(tau, intervals[own]) - now
    if own_wait <= max_wait + EPSILON:
        new.tats[own] = mine
        return new, max(0.0, own_wait), own
    # Among the clusters borrowing now, loans go by weight.
    recent = now - tau / 2
    others = [p for j, p in enumerate(state.passes) if j != own and state.asked[j] >= recent]
    floor = min(others, default=None)
    mine_pass = state.passes[own]
    if state.asked[own] < recent and floor is not None:
        mine_pass = floor  # back after a pause: no credit banked, no debt kept
    new.asked[own], new.passes[own] = now, mine_pass
    lender, after = _lender(state, now, tau, intervals, own)
    if lender < 0 or (floor is not None and mine_pass > floor + 1 / weights[own] + EPSILON):
        return new, None, -1
    new.passes[own] = mine_pass + 1 / weights[own]
    new.tats[lender] = after
    return new, 0.0, lender


def _lender(
    state: ShareState, now: float, tau: float, intervals: Sequence[float], own: int
) -> tuple[int, float]:
    """The share with the most to lend that keeps half its burst after the loan, and its
    TAT after it; (-1, 0) when none can lend."""
    charged, best, after = -1, 0.0, 0.0
    for j, share_interval in enumerate(intervals):
        if j == own:
            continue
        lent = max(state.tats[j], now) + share_interval
        margin = lent - now - max(tau, share_interval) / 2
        if margin <= EPSILON and (charged < 0 or margin < best):
            charged, best, after = j, margin, lent
    return charged, after
