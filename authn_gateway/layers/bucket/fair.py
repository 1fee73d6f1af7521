"""A backend's bucket shared between clusters by weight (issue 37: many clusters, one fleet).

The bucket (rate R, burst B) is cut into one share per cluster k: a bucket of its own,
GCRA as in :mod:`.gcra`, with rate ``R·w_k/W`` and a burst of ``B·w_k/W`` calls, a
fraction of a call when there are more clusters than B (W: the sum of the weights).
The shares' rates add up to R and their bursts to B, and a call takes exactly one call's
worth from the shares, from one or from several, so no window of t seconds sees more
than ``B + R·t`` calls, exactly as with the one bucket, whatever the clusters do.

Each share holds what it has as content (in calls, from 0 to its burst); the part of it
under ``keep`` of its burst (a half; less in a bucket of under two calls, so that a call
can always be made of the rest) is its *reserve*, the part above its *surplus*:

* a cluster's call takes one whole call from its own share when it can: all of the
  share while the cluster is *quiet* (it has not had to borrow in the last ``τ/2``),
  only its surplus while it borrows;
* if not, the call is made of what its own share has (the same part) and of the other
  shares' surpluses, the fullest first. Surpluses are lent in fractions, from as many
  shares as it takes: what any share does not use is lent however small the shares
  are, so a cluster asking alone gets the whole rate and nothing is wasted while any
  cluster asks (the reserves are a stock, not rate);
* a quiet cluster that is within its share's rate (*entitled*: its own calls, all of
  them, conform to a GCRA at its share's rate with a burst of ``max(1, its reserve)``)
  may also take the other shares' reserves. That is what keeps a small share whole: a
  cluster whose share is under two calls keeps less than one in reserve, so its calls,
  at its share's rate, are made of the reserves every share keeps, which only quiet,
  entitled calls spend. A storming cluster is never quiet (it borrows all the time),
  so a storm never spends them;
* what is lent is split between the clusters borrowing by weight: each borrower has a
  *pass* (the calls it got while borrowing, its own and lent, over its weight), and a
  loan goes to a borrower only while its pass is within one call of the lowest pass
  among the clusters that asked to borrow in the last ``τ/2`` (stride scheduling, at
  arrival: nobody queues here). A borrower that stops asking is out of that count
  within ``τ/2``. The pass counts its own calls too: when every share is drained to
  its reserve, a borrower's own surplus and the loans it takes are the same accrual,
  and counting only the loans gave a weight-2 and a weight-1 storm 2.8:1.

Why shares and no bucket over them: a bucket above the shares, spent first come first
served, decides alone whenever it is shorter than the shares together (while Redis
is down it starts empty, and a follow-up call spends it): a storm at 10 x the rate
then takes nearly every unit it frees (docs/decisions.md).

In GCRA terms every share's tolerance is the same, ``τ = B/R`` (at least one call of the
whole bucket: a replica's part while Redis is down may be under one): a share's state
is the theoretical arrival time (TAT) of its next call, from ``now`` (full) to
``now + τ`` (empty), and its reserve is what lies past ``now + τ·(1 - keep)``.
``fair_take.lua`` is this function, for the fleet's shares in Redis;
``tests/process/test_stores.py`` holds the two to the same answers.

A follow-up call a backend makes for a review (group pages, service logins; see
:mod:`backends.budget`) was asked for by no cluster: it is made of surpluses first, then
of reserves, the fullest first (``own`` None).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from authn_gateway.layers.bucket.gcra import EPSILON
from authn_gateway.layers.bucket.shares import FairShares

__all__ = ["FairShares", "ShareState", "fair_gcra", "shape"]

#: A cluster that never asked to borrow.
NEVER = -1e18
#: A part of a call too small to take from a share, or to still need: TATs are seconds
#: since an epoch, to a few tenths of a microsecond. What a call still needs under it is
#: charged to the share that paid most, so every call takes one whole call's worth.
CALL_EPSILON = 1e-6


@dataclass
class ShareState:
    """A shared bucket's state, by share index: each share's TAT, and each cluster's
    borrowing (its pass, and when it last asked to borrow) and its entitlement (the
    TAT of its calls at its share's rate)."""

    tats: list[float]
    passes: list[float]
    asked: list[float]
    credits: list[float]

    @classmethod
    def new(cls, n: int) -> ShareState:
        return cls([0.0] * n, [0.0] * n, [NEVER] * n, [0.0] * n)

    def copy(self) -> ShareState:
        return ShareState(list(self.tats), list(self.passes), list(self.asked), list(self.credits))


def shape(tau: float, intervals: Sequence[float]) -> tuple[float, float]:
    """The tolerance the shares run on (``tau``, or one call of the whole bucket when it
    is less) and the part of each share kept in reserve: a half, less in a bucket of
    under two calls (none in a bucket of one), so that the surpluses add up to a call;
    none with one share."""
    rate = 0.0
    for interval in intervals:
        rate += 1.0 / interval
    tau = max(tau, 1.0 / rate)
    if len(intervals) == 1:
        return tau, 0.0  # nobody to keep it for
    burst = tau * rate
    return tau, min(0.5, max(0.0, 1.0 - 1.0 / burst))


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
    state, seconds to wait, the share that paid most), or (the state, with a refused
    borrower's ask recorded, None, -1) when refused. ``tau`` is the tolerance, B/R.

    A call from its own share alone may wait up to ``max_wait`` for it (as the plain
    bucket does); one made of other shares' content does not wait.
    """
    tau, keep = shape(tau, intervals)
    new = state.copy()
    surplus_at = now + tau * (1.0 - keep)
    if own is None:
        need, first = _draw(new, now, intervals, -1, 1.0, surplus_at)
        if need > CALL_EPSILON:
            need, more = _draw(new, now, intervals, -1, need, now + tau)
            first = more if first < 0 else first
        if need <= CALL_EPSILON:
            new.tats[first] += need * intervals[first]
            return new, 0.0, first
        # Not enough in all the shares together: the fullest one, waited for.
        new = state.copy()
        fullest = min(range(len(intervals)), key=lambda j: max(state.tats[j], now) + intervals[j])
        after = max(state.tats[fullest], now) + intervals[fullest]
        wait = after - tau - now
        if wait > max_wait + EPSILON:
            return new, None, -1
        new.tats[fullest] = after
        return new, max(0.0, wait), fullest
    recent = now - tau / 2
    quiet = state.asked[own] < recent
    own_interval = intervals[own]
    # The cluster's own share down to its reserve while it borrows; all of it when quiet.
    own_at = now + tau if quiet else surplus_at
    tolerance = max(tau * keep, own_interval)
    entitled = max(state.credits[own], now) + own_interval - tolerance <= now + EPSILON
    credit = min(max(state.credits[own], now) + own_interval, now + tolerance)
    mine = max(state.tats[own], now) + own_interval
    own_wait = mine - own_at
    if own_wait <= max_wait + EPSILON:
        new.tats[own] = mine
        new.credits[own] = credit
        if not quiet:
            new.passes[own] += 1 / weights[own]
        return new, max(0.0, own_wait), own
    # Among the clusters borrowing now, loans go by weight.
    others = [p for j, p in enumerate(state.passes) if j != own and state.asked[j] >= recent]
    floor = min(others, default=None)
    mine_pass = state.passes[own]
    if state.asked[own] < recent and floor is not None:
        mine_pass = floor  # back after a pause: no credit banked, no debt kept
    new.asked[own], new.passes[own] = now, mine_pass
    privileged = quiet and entitled
    if not privileged and floor is not None and mine_pass > floor + 1 / weights[own] + EPSILON:
        return new, None, -1
    at = max(state.tats[own], now)
    mine_part = max(0.0, (own_at - at) / own_interval)
    need = 1.0 - mine_part
    need, first = _draw(new, now, intervals, own, need, surplus_at)
    if need > CALL_EPSILON and privileged:
        need, more = _draw(new, now, intervals, own, need, now + tau)
        first = more if first < 0 else first
    if need > CALL_EPSILON:
        refused = state.copy()
        refused.asked[own], refused.passes[own] = now, mine_pass
        return refused, None, -1
    payer = own if first < 0 else first
    new.tats[own] = at + mine_part * own_interval
    new.tats[payer] = max(new.tats[payer], now) + need * intervals[payer]
    new.passes[own] = mine_pass + 1 / weights[own]
    new.credits[own] = credit
    return new, 0.0, payer


def _draw(
    state: ShareState,
    now: float,
    intervals: Sequence[float],
    skip: int,
    need: float,
    limit: float,
) -> tuple[float, int]:
    """Take up to ``need`` calls from the shares other than ``skip``, each down to the
    TAT ``limit`` (``now + τ``: all it has; less: what it holds past its reserve), the
    fullest first; ``state`` is charged. What is still needed, and the first share that
    gave (-1: none)."""
    tats = state.tats
    have = []
    for j, interval in enumerate(intervals):
        if j != skip:
            calls = (limit - max(tats[j], now)) / interval
            if calls > CALL_EPSILON:
                have.append((-calls, j))
    have.sort()
    first = -1
    for minus_calls, j in have:
        if need <= CALL_EPSILON:
            break
        part = min(-minus_calls, need)
        tats[j] = max(tats[j], now) + part * intervals[j]
        need -= part
        if first < 0:
            first = j
    return need, first
